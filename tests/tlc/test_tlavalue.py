"""TLA+ values: TLC's printed text and ITF JSON to Python and back, with TRUE and 1 kept apart."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from deferdump.tools.tlc.values import (
    ItfError,
    ModelValue,
    Record,
    Seq,
    TlaFunction,
    TlaParseError,
    TlaSet,
    Tup,
    format_value,
    from_itf,
    itf_trace,
    load_itf,
    parse_value,
    to_itf,
    _value_key_by_kind,
    value_key,
)

# Printed by TLC 2.15 for a state variable holding these values (see tests/fixtures and the TLC notes).
TLC_PRINTED = (
    '[s |-> {"p", "q"}, t |-> <<1, TRUE, a>>, u |-> (a :> 1 @@ b :> 2), v |-> [k |-> "k", l |-> "l"], '
    'w |-> <<-1, -2, -3>>, z |-> <<>>, e |-> {}, f |-> << >>, g |-> {[m |-> 1], [m |-> 2]}, '
    'h |-> (2 :> 2 @@ 3 :> 3), str |-> "a\\"b\\\\c", n |-> (1 :> "x" @@ 3 :> "y"), neg |-> -5]'
)
TLC_PRINTED_WRAPPED = '[ rr |-> {<<TRUE, TRUE>>},\n  sub |-> {{}, {1}, {2}, {1, 2}},\n  iv |-> 3..5,\n  empt |-> << >> ]'


def test_parses_every_form_tlc_prints() -> None:
    a, b = ModelValue("a"), ModelValue("b")
    value = parse_value(TLC_PRINTED)
    assert isinstance(value, Record)
    assert value["s"] == TlaSet(["p", "q"])
    assert value["t"] == Tup((1, True, a)) and type(value["t"][1]) is bool
    assert value["u"] == TlaFunction({a: 1, b: 2}) and value["u"][b] == 2
    assert value["v"] == Record(k="k", l="l")
    assert value["w"] == Tup((-1, -2, -3))
    assert value["z"] == Tup(()) and value["f"] == Tup(()) and value["e"] == TlaSet()
    assert value["g"] == TlaSet([Record(m=1), Record(m=2)])
    assert value["h"] == TlaFunction({2: 2, 3: 3})
    assert value["str"] == 'a"b\\c'
    assert value["n"] == TlaFunction({1: "x", 3: "y"})
    assert value["neg"] == -5


def test_parses_wrapped_values_intervals_and_empty_functions() -> None:
    value = parse_value(TLC_PRINTED_WRAPPED)
    assert value == Record(rr=TlaSet([Tup((True, True))]),
                           sub=TlaSet([TlaSet(), TlaSet([1]), TlaSet([2]), TlaSet([1, 2])]),
                           iv=TlaSet([3, 4, 5]), empt=Tup(()))


def test_constant_function_constructor_and_its_limits() -> None:
    assert parse_value('[x \\in {"a", "b"} |-> 0]') == Record(a=0, b=0)
    assert parse_value("[x \\in {1, 2} |-> {}]") == Tup((TlaSet(), TlaSet()))
    with pytest.raises(TlaParseError, match="uses x"):
        parse_value("[x \\in {1, 2} |-> <<x>>]")


@pytest.mark.parametrize("text", ["", "{1,", "<<1 2>>", "[a |-> ]", "(1 :> 2", "1..TRUE", "@", "{1} }"])
def test_malformed_text_is_rejected(text: str) -> None:
    with pytest.raises(TlaParseError):
        parse_value(text)


def test_true_and_one_stay_distinct() -> None:
    assert len(TlaSet([True, 1, False, 0])) == 4
    assert Tup((True,)) != Tup((1,)) and Tup((True,)) != (1,)
    assert Record(a=True) != Record(a=1)
    assert TlaFunction([(True, "t"), (1, "one")])[1] == "one"
    assert parse_value("{TRUE, 1}") == TlaSet([True, 1]) and len(parse_value("{TRUE, 1}")) == 2
    assert from_itf({"#set": [True, {"#bigint": "1"}]}) == TlaSet([True, 1])
    assert value_key(True) != value_key(1)


def test_values_are_hashable_and_follow_tla_equality() -> None:
    records = TlaSet([Record(a=1, b=TlaSet([1])), Record(b=TlaSet([1]), a=1)])
    assert len(records) == 1
    by_record = TlaFunction({Record(a=1): "x"})
    assert by_record[Record(a=1)] == "x"
    assert {Record(a=1): 1}[Record(a=1)] == 1
    assert Tup(("a", "b")) == TlaFunction({1: "a", 2: "b"}) == Seq(("a", "b"))
    assert Record(a=1) == TlaFunction({"a": 1})
    assert TlaSet([1, 2]) == {2, 1} and TlaSet([TlaSet([1])]) == TlaSet([frozenset({1})])


def test_itf_encoding_follows_adr_015() -> None:
    value = Record(n=3, s=TlaSet(["x"]), t=Tup((1, "a")), q=Seq((True,)), f=TlaFunction({ModelValue("r1"): -2}))
    assert to_itf(value) == {
        "f": {"#map": [["r1_OF_MODEL", {"#bigint": "-2"}]]},
        "n": {"#bigint": "3"},
        "q": [True],
        "s": {"#set": ["x"]},
        "t": {"#tup": [{"#bigint": "1"}, "a"]},
    }
    assert type(from_itf({"q": [True]})["q"]) is Seq
    with pytest.raises(ValueError, match="model value"):
        to_itf("r1_OF_MODEL")


# --------------------------------------------------------------------------------------------
# Round trips (hypothesis)
# --------------------------------------------------------------------------------------------

_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True).filter(lambda n: n not in ("TRUE", "FALSE"))
_strings = st.text(max_size=8).filter(lambda s: not s.endswith("_OF_MODEL"))
_scalars = st.one_of(st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), _strings,
                     _names.map(ModelValue))


def _compound(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.lists(children, max_size=4).map(TlaSet),
        st.lists(children, max_size=4).map(Tup),
        st.lists(children, max_size=4).map(Seq),
        st.dictionaries(_names, children, max_size=4).map(Record),
        st.lists(st.tuples(children, children), max_size=4).map(TlaFunction),
    )


values = st.recursive(_scalars, _compound, max_leaves=12)


_FALSE_AND_ZERO = (  # legitimate TLA+ values that Python's False == 0 / True == 1 would collapse
    TlaSet([False, 0]),
    TlaSet([True, 1]),
    TlaFunction([(False, "f"), (0, "z")]),
    TlaFunction([(True, 1), (1, True)]),
    Tup((TlaSet([False, 0]), TlaSet([0]))),
    TlaSet([Tup((False,)), Tup((0,))]),
    Record(a=TlaSet([True, 1, False, 0])),
)


def _with_collapse_examples(test):  # type: ignore[no-untyped-def]
    for value in _FALSE_AND_ZERO:
        test = example(value)(test)
    return test



@settings(max_examples=200, deadline=None)
@given(values)
@_with_collapse_examples
def test_text_round_trip(value: object) -> None:
    assert value_key(parse_value(format_value(value))) == value_key(value)


class _Collapsed(Exception):
    """A plain Python container would merge elements or keys that TLA+ keeps apart (FALSE and 0)."""


def _plain(value: object) -> object:
    """The same TLA+ value in plain Python containers (tuples, frozensets, dicts), which take the general path.

    Python's ``False == 0`` and ``True == 1`` merge ``{FALSE, 0}`` into one element and the keys of
    ``(FALSE :> a @@ 0 :> b)`` into one key: such a value has no plain-container copy (:class:`_Collapsed`)."""
    if isinstance(value, TlaSet):
        elements = frozenset(_plain(v) for v in value)
        if len(elements) != len(value):
            raise _Collapsed(value)
        return elements
    if isinstance(value, (Tup, Seq)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, (Record, TlaFunction)):
        table = {_plain(k): _plain(v) for k, v in value.items()}
        if len(table) != len(value):
            raise _Collapsed(value)
        return table
    return value


@settings(max_examples=200, deadline=None)
@given(values)
@_with_collapse_examples
def test_the_exact_type_fast_path_keys_as_the_general_path(value: object) -> None:
    assert value_key(value) == _value_key_by_kind(value)
    try:
        plain = _plain(value)
    except _Collapsed:  # Python merges FALSE and 0: there is no plain copy to compare with
        return
    except TypeError:  # a set or a key that Python cannot hash as a plain container (a dict inside)
        return
    assert value_key(plain) == value_key(value)


@pytest.mark.parametrize("value", _FALSE_AND_ZERO, ids=repr)
def test_false_and_zero_stay_two_values_everywhere(value: object) -> None:
    """Keys, text, ITF and the parser keep FALSE apart from 0 and TRUE apart from 1."""
    assert parse_value(format_value(value)) == value
    assert from_itf(json.loads(json.dumps(to_itf(value)))) == value
    assert len(TlaSet([value, parse_value(format_value(value))])) == 1
    with pytest.raises(_Collapsed):
        _plain(value)


def test_collapse_prone_python_operations_are_keyed() -> None:
    assert len(TlaSet([False, 0])) == 2 and len(TlaFunction([(False, "f"), (0, "z")])) == 2
    assert TlaFunction([(False, "f"), (0, "z")])[0] == "z" and TlaFunction([(False, "f"), (0, "z")])[False] == "f"
    assert 0 not in TlaSet([False]) and False not in TlaSet([0]) and 1 not in TlaSet([True])
    assert 0 not in Tup((False,)) and False not in Seq((0,)) and True in Tup((1, True))
    assert Tup((False, 0, False)).count(0) == 1 and Tup((False, 0)).index(0) == 1
    with pytest.raises(ValueError):
        Tup((False,)).index(0)
    assert (0, "z") in TlaFunction([(0, "z")]).items() and (False, "z") not in TlaFunction([(0, "z")]).items()
    assert 0 not in TlaFunction([(1, False)]).values() and ("a", 0) not in Record(a=False).items()
    assert 0 not in Record(a=False).values() and False in Record(a=False).values()
    assert TlaSet([False]) != TlaSet([0]) and TlaSet([False]) != {0} and not TlaSet([False]) <= TlaSet([0])
    assert TlaSet([False, 0]) - TlaSet([0]) == TlaSet([False]) and TlaSet([False]) | TlaSet([0]) == TlaSet([0, False])
    assert parse_value("(FALSE :> 1 @@ 0 :> 2)") == TlaFunction([(False, 1), (0, 2)])
    assert parse_value("<<FALSE>>") != parse_value("<<0>>")
    with pytest.raises(TypeError, match="not a TLA\\+ value"):  # 1.0 == 1 in Python; a float is no TLA+ value
        TlaSet([1, 1.0])


class _Flag(int):
    pass


def test_subclasses_of_scalars_and_containers_take_the_general_path() -> None:
    assert value_key(_Flag(3)) == value_key(3) == ("I", 3)
    assert value_key(True) != value_key(1)
    assert value_key(("a", True)) == value_key(Tup(["a", True])) == value_key(Seq(["a", True]))
    assert value_key({"a": 1}) == value_key(Record(a=1))
    with pytest.raises(TypeError, match="not a TLA\\+ value"):
        value_key(1.5)


@settings(max_examples=200, deadline=None)
@given(values)
@_with_collapse_examples
def test_itf_round_trip_through_json(value: object) -> None:
    encoded = json.loads(json.dumps(to_itf(value)))
    decoded = from_itf(encoded)
    assert value_key(decoded) == value_key(value)
    assert to_itf(decoded) == encoded  # the encoding itself survives: #tup stays #tup, arrays stay arrays


# --------------------------------------------------------------------------------------------
# ITF trace files
# --------------------------------------------------------------------------------------------


def _write(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj))
    return path


def test_itf_trace_file_round_trip(tmp_path: Path) -> None:
    states = [{"x": 0, "s": TlaSet()}, {"x": 1, "s": TlaSet([Record(a=True)])}]
    trace = itf_trace(["x", "s"], states, {"source": "Counter.tla"}, loop=1)
    assert trace["states"][1]["#meta"] == {"index": 1} and trace["loop"] == 1
    assert trace["#meta"]["format"] == "ITF" and trace["#meta"]["source"] == "Counter.tla"
    loaded = load_itf(_write(tmp_path / "t.itf.json", trace))
    assert loaded.vars == ("x", "s") and loaded.loop == 1 and loaded.meta["source"] == "Counter.tla"
    assert [dict(state) for state in loaded.states] == states
    with pytest.raises(ValueError, match="missing variables"):
        itf_trace(["x", "y"], [{"x": 1}], {})


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("{", "bad JSON at line 1, column 2"),
        ({"states": []}, "$.vars: missing or malformed 'vars'"),
        ({"vars": ["x"]}, "$.states: missing or malformed 'states'"),
        ({"vars": ["x"], "states": [{"x": True}, {}]}, "state 1: $.states[1]: missing variable 'x'"),
        ({"vars": ["x"], "states": [{"x": {"#set": [{"#bigint": "1"}, {"#foo": 1}]}}]},
         'state 0: $.states[0].x["#set"][1]: unknown value tag \'#foo\''),
        ({"vars": ["x"], "states": [{"x": {"#bigint": "1.5"}}]},
         'state 0: $.states[0].x["#bigint"]: #bigint must be a string of digits'),
        ({"vars": ["x"], "states": [{"x": 1, "y": 2}]}, "state 0: $.states[0]: variables not listed in 'vars'"),
        ({"vars": ["x"], "states": [{"x": 1}], "loop": 3}, "$.loop: 'loop' must be a state index below 1"),
    ],
)
def test_malformed_itf_names_file_state_and_path(tmp_path: Path, document: object, expected: str) -> None:
    path = tmp_path / "bad.itf.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    with pytest.raises(ItfError) as raised:
        load_itf(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert expected in str(raised.value)
