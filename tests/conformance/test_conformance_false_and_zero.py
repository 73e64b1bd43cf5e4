"""Conformance's diffs and state keys keep TLA+ values FALSE and 0 (TRUE and 1) apart, as TLC does."""
from __future__ import annotations

from deferdump.conformance.diff import diff_value
from deferdump.conformance.stategraph import state_key
from deferdump.tools.tlc.values import TlaFunction, TlaSet, Tup


def test_set_diff_names_the_element_only_one_side_holds() -> None:
    assert diff_value("s", TlaSet([False, 0]), TlaSet([0])) == ["s: only in model {FALSE}"]
    assert diff_value("s", TlaSet([True]), TlaSet([True, 1])) == ["s: only in implementation {1}"]
    assert diff_value("s", TlaSet([False, 0]), TlaSet([0, False])) == []


def test_function_diff_recurses_into_keys_false_and_zero() -> None:
    model = TlaFunction([(False, "a"), (0, "b")])
    assert diff_value("f", model, TlaFunction([(0, "b"), (False, "a")])) == []
    assert diff_value("f", model, TlaFunction([(False, "a"), (0, "c")])) == ['f[0]: model "b", implementation "c"']
    assert diff_value("f", model, TlaFunction([(0, "b")])) == ['f: model (FALSE :> "a" @@ 0 :> "b"), implementation (0 :> "b")']
    assert diff_value("t", Tup((False,)), Tup((0,))) == ["t[1]: model FALSE, implementation 0"]


def test_state_keys_tell_false_from_zero() -> None:
    assert state_key({"x": TlaSet([False, 0])}) != state_key({"x": TlaSet([0])})
    assert state_key({"x": False}) != state_key({"x": 0}) and state_key({"x": Tup((True,))}) != state_key({"x": Tup((1,))})
    assert len({state_key({"x": TlaSet([False, 0])}), state_key({"x": TlaSet([0, False])})}) == 1
