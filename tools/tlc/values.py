"""TLA+ values as Python data: TLC's printed values <-> Python <-> ITF JSON.

Python representation (every value is immutable and hashable, so sets of records and maps keyed by
records work):

=====================================  ===========================================================
TLA+                                   Python
=====================================  ===========================================================
``TRUE`` / ``FALSE``                   ``bool``
integer                                ``int``
string                                 ``str``
model value ``r1``                     :class:`ModelValue`
set ``{...}`` (also ``a..b``)          :class:`TlaSet`
``<<...>>`` as printed by TLC          :class:`Tup` (a ``tuple``)
sequence read from an ITF JSON array   :class:`Seq` (a ``tuple``)
record / function with string domain   :class:`Record` (a ``Mapping[str, Value]``)
any other function ``(k :> v @@ …)``   :class:`TlaFunction` (a ``Mapping[Value, Value]``)
=====================================  ===========================================================

Why the wrappers: Python says ``True == 1``, so ``frozenset({True, 1})`` has one element and
``(True,) == (1,)``. Equality and hashing of the wrapper types go through :func:`value_key`, a
canonical form that tags every scalar with its type; so do membership (``in``, a tuple's ``count`` and
``index``, a function's ``items()`` and ``values()``), so code that keeps TLA+ values in these types never
merges ``FALSE`` with ``0`` (a plain ``set``/``dict`` of them would). It also follows TLA+ semantics where TLC does:
a tuple, a record and a function are all functions, so ``<<"a">>``, ``(1 :> "a")`` and
``TlaFunction({1: "a"})`` are equal, and so are ``[a |-> 1]`` and ``("a" :> 1)``.

Sequences vs tuples: TLC prints both as ``<<...>>`` and cannot tell them apart, so the text parser
returns :class:`Tup`, which ITF writes as ``{"#tup": [...]}``. An ITF JSON array (an
Apalache sequence) decodes to :class:`Seq` and encodes back to an array. ``Tup`` and ``Seq`` with
the same items are equal; plain Python tuples are accepted as tuples and lists as sequences.

ITF (Apalache ADR-015): integers are ``{"#bigint": "<digits>"}`` (plain JSON integers are
accepted on input, for older writers), sets ``#set``, tuples ``#tup``, functions ``#map``, records
JSON objects. TLC model values have no ITF form; like Apalache's uninterpreted constants they are
written as strings with a sort suffix, ``"r1_OF_MODEL"``, and only that exact suffix decodes back
to ``ModelValue("r1")``.
"""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deferdump.reference.errors import UserError

__all__ = [
    "ItfError",
    "ItfTrace",
    "ModelValue",
    "Record",
    "Seq",
    "TlaFunction",
    "TlaParseError",
    "TlaSet",
    "Tup",
    "Unserializable",
    "Value",
    "format_value",
    "from_itf",
    "itf_trace",
    "load_itf",
    "make_function",
    "parse_value",
    "to_itf",
    "value_key",
]

Value = Any  # bool | int | str | ModelValue | TlaSet | Tup | Seq | Record | TlaFunction | Unserializable
"""Any Python value this module can represent (see the module docstring)."""

MODEL_VALUE_SORT_SUFFIX = "_OF_MODEL"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RESERVED = frozenset({"TRUE", "FALSE"})


class TlaParseError(UserError):
    """Text that is not a value as TLC prints it."""


class ItfError(UserError):
    """Malformed ITF JSON; the message names the file, the state index and the JSON path."""

    def __init__(self, problem: str, *, json_path: str = "$", file: Path | str | None = None,
                 state: int | None = None) -> None:
        self.problem = problem
        self.json_path = json_path
        self.file = None if file is None else str(file)
        self.state = state
        where = []
        if self.file is not None:
            where.append(self.file)
        if state is not None:
            where.append(f"state {state}")
        where.append(json_path)
        super().__init__(f"{': '.join(where)}: {problem}")


# --------------------------------------------------------------------------------------------
# Value types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class ModelValue:
    """A TLC model value (an uninterpreted constant such as a symmetry-set member)."""

    name: str

    def __post_init__(self) -> None:
        if not _IDENTIFIER.match(self.name) or self.name in _RESERVED:
            raise ValueError(f"not a model value name: {self.name!r}")

    def __repr__(self) -> str:
        return f"ModelValue({self.name!r})"


@dataclass(frozen=True)
class Unserializable:
    """ITF's ``{"#unserializable": text}``: a value the writer could not enumerate (e.g. ``Int``)."""

    text: str


class _Keyed:
    """Equality and hashing through :func:`value_key`, so ``True`` and ``1`` never collapse."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        try:
            return value_key(self) == value_key(other)
        except TypeError:
            return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(value_key(self))


class _KeyedItems(_Keyed):
    """Membership, ``count`` and ``index`` through :func:`value_key` (``tuple``'s own use ``==``)."""

    __slots__ = ()

    def __contains__(self, item: object) -> bool:
        try:
            key = value_key(item)
        except TypeError:
            return False
        return any(value_key(own) == key for own in self)  # type: ignore[attr-defined]

    def count(self, item: object) -> int:
        try:
            key = value_key(item)
        except TypeError:
            return 0
        return sum(value_key(own) == key for own in self)  # type: ignore[attr-defined]

    def index(self, item: object, start: int = 0, stop: int = sys.maxsize) -> int:
        try:
            key = value_key(item)
        except TypeError:
            raise ValueError(f"{item!r} is not in the tuple") from None
        for position, own in enumerate(self):  # type: ignore[attr-defined]
            if start <= position < stop and value_key(own) == key:
                return position
        raise ValueError(f"{item!r} is not in the tuple")


class Tup(_KeyedItems, tuple):  # type: ignore[misc]
    """A TLA+ tuple ``<<a, b>>`` (how TLC prints both tuples and sequences); ITF ``#tup``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Tup({tuple(self)!r})"


class Seq(_KeyedItems, tuple):  # type: ignore[misc]
    """A TLA+ sequence that came from an ITF JSON array; equal to the :class:`Tup` of its items."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Seq({tuple(self)!r})"


class TlaSet(_Keyed, AbstractSet):  # type: ignore[type-arg]
    """A finite TLA+ set. Elements are keyed by :func:`value_key`, so ``TlaSet({True, 1})`` has two."""

    __slots__ = ("_items", "_key")

    def __init__(self, elements: Iterable[Value] = ()) -> None:
        items: dict[Any, Value] = {}
        for element in elements:
            items.setdefault(value_key(element), element)
        self._items = items
        self._key: Any = None

    @classmethod
    def _from_iterable(cls, elements: Iterable[Value]) -> "TlaSet":
        return cls(elements)

    def __contains__(self, element: object) -> bool:
        try:
            return value_key(element) in self._items
        except TypeError:
            return False

    def __iter__(self) -> Iterator[Value]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"TlaSet({list(self._items.values())!r})"


class Record(_Keyed, Mapping):  # type: ignore[type-arg]
    """A TLA+ record ``[a |-> 1]`` (TLC prints every function with a string domain this way)."""

    __slots__ = ("_fields", "_key")

    def __init__(self, fields: Mapping[str, Value] | Iterable[tuple[str, Value]] = (), **kw: Value) -> None:
        items = dict(fields, **kw)
        for name in items:
            if not isinstance(name, str):
                raise TypeError(f"record field names are strings, not {name!r}")
        self._fields = items
        self._key: Any = None

    def __getitem__(self, name: str) -> Value:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"Record({self._fields!r})"

    def items(self) -> Any:
        return _Pairs(self._fields.items())

    def values(self) -> Any:
        return _Pairs(self._fields.values())

    def replace(self, **changes: Value) -> "Record":
        """A copy with some fields changed (``[r EXCEPT !.a = 1]``)."""
        return Record({**self._fields, **changes})


class TlaFunction(_Keyed, Mapping):  # type: ignore[type-arg]
    """A TLA+ function ``(k1 :> v1 @@ k2 :> v2)`` whose keys may be any values (records, sets, …)."""

    __slots__ = ("_pairs", "_key")

    def __init__(self, pairs: Mapping[Value, Value] | Iterable[tuple[Value, Value]] = ()) -> None:
        items = pairs.items() if isinstance(pairs, Mapping) else pairs
        table: dict[Any, tuple[Value, Value]] = {}
        for key, value in items:
            table.setdefault(value_key(key), (key, value))
        self._pairs = table
        self._key: Any = None

    def __getitem__(self, key: Value) -> Value:
        try:
            return self._pairs[value_key(key)][1]
        except TypeError:
            raise KeyError(key) from None

    def __contains__(self, key: object) -> bool:
        try:
            return value_key(key) in self._pairs
        except TypeError:
            return False

    def __iter__(self) -> Iterator[Value]:
        return (key for key, _ in self._pairs.values())

    def __len__(self) -> int:
        return len(self._pairs)

    def items(self) -> Any:  # a list is enough: the mapping is immutable
        return _Pairs(self._pairs.values())

    def values(self) -> Any:
        return _Pairs(value for _, value in self._pairs.values())

    def __repr__(self) -> str:
        return f"TlaFunction({self.items()!r})"


class _Pairs(list):  # type: ignore[type-arg]
    """A function's items (or values) whose ``in`` goes through :func:`value_key`: ``(0, x)`` is not ``(FALSE, x)``."""

    def __contains__(self, item: object) -> bool:
        try:
            key = value_key(item)
        except TypeError:
            return False
        return any(value_key(own) == key for own in self)


def make_function(pairs: Iterable[tuple[Value, Value]]) -> Value:
    """The value TLC would print for a function: ``<<…>>`` for domain 1..n, a record for a string domain."""
    pairs = list(pairs)
    keys = [key for key, _ in pairs]
    if not pairs:
        return Tup(())
    if all(isinstance(key, str) for key in keys) and len(set(keys)) == len(keys):
        return Record(pairs)
    if all(type(key) is int for key in keys) and sorted(keys) == list(range(1, len(keys) + 1)):
        by_index = dict(pairs)
        return Tup(by_index[i] for i in range(1, len(keys) + 1))
    return TlaFunction(pairs)


# --------------------------------------------------------------------------------------------
# Canonical keys
# --------------------------------------------------------------------------------------------


def _compound_key(value: TlaSet | Record | TlaFunction) -> Any:
    if isinstance(value, TlaSet):
        return ("SET", frozenset(value._items))
    if isinstance(value, TlaFunction):
        return ("F", frozenset((key, value_key(v)) for key, (_, v) in value._pairs.items()))
    return ("F", frozenset((("S", name), value_key(v)) for name, v in value._fields.items()))


def value_key(value: Value) -> Any:
    """A hashable canonical form: equal iff the TLA+ values are equal (``TRUE`` never equals ``1``).

    Plain ``tuple``/``list`` (tuples), ``set``/``frozenset`` and ``dict`` are accepted as well.
    Raises TypeError for anything that is not a TLA+ value.

    The exact types come first, by identity: conformance replay keys millions of values per run, and
    the ``isinstance`` chain (abstract-base-class checks included) was most of that cost. Subclasses and
    the plain Python containers take the general path, :func:`_value_key_by_kind`.
    """
    kind = type(value)
    if kind is str:
        return ("S", value)
    if kind is TlaSet or kind is Record or kind is TlaFunction:  # immutable: compute the key once
        key = value._key  # type: ignore[union-attr]
        if key is None:
            key = value._key = _compound_key(value)  # type: ignore[union-attr]
        return key
    if kind is ModelValue:
        return ("M", value.name)  # type: ignore[union-attr]
    if kind is int:
        return ("I", value)
    if kind is bool:
        return ("B", value)
    if kind is Tup or kind is Seq:
        return ("F", frozenset((("I", i), value_key(item)) for i, item in enumerate(value, start=1)))  # type: ignore[arg-type]
    return _value_key_by_kind(value)


def _value_key_by_kind(value: Value) -> Any:
    """:func:`value_key` for any accepted type, subclasses included."""
    if isinstance(value, bool):
        return ("B", value)
    if isinstance(value, int):
        return ("I", value)
    if isinstance(value, str):
        return ("S", value)
    if isinstance(value, ModelValue):
        return ("M", value.name)
    if isinstance(value, (tuple, list)):
        return ("F", frozenset((("I", i), value_key(item)) for i, item in enumerate(value, start=1)))
    if isinstance(value, (TlaSet, Record, TlaFunction)):  # immutable: compute the key once
        if value._key is None:
            value._key = _compound_key(value)
        return value._key
    if isinstance(value, (set, frozenset, AbstractSet)) and not isinstance(value, Mapping):
        return ("SET", frozenset(value_key(element) for element in value))
    if isinstance(value, Mapping):
        return ("F", frozenset((value_key(k), value_key(v)) for k, v in value.items()))
    if isinstance(value, Unserializable):
        return ("U", value.text)
    raise TypeError(f"not a TLA+ value: {value!r} ({type(value).__name__})")


# --------------------------------------------------------------------------------------------
# TLC's printed text -> Python
# --------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:[^"\\]|\\.)*")
      | (?P<int>-?\d+)
      | (?P<op><<|>>|\|->|:>|@@|\.\.|\\in|[{}\[\](),])
      | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE | re.DOTALL,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", '"': '"', "\\": "\\"}


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    tokens: list[tuple[str, str, int]] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return tokens
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise TlaParseError(f"unexpected character {text[pos]!r} at offset {pos} in TLA+ value {_clip(text)}")
        kind = match.lastgroup or ""
        tokens.append((kind, match.group(kind), match.start(kind)))
        pos = match.end()


def _clip(text: str, limit: int = 80) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 1] + "…")


def _unquote(literal: str) -> str:
    out: list[str] = []
    i = 1
    while i < len(literal) - 1:
        char = literal[i]
        if char == "\\":
            nxt = literal[i + 1]
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
        else:
            out.append(char)
            i += 1
    return "".join(out)


class _Parser:
    """Recursive descent over TLC's value syntax."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def at(self, op: str) -> bool:
        token = self.peek()
        return token is not None and token[0] == "op" and token[1] == op

    def fail(self, expected: str) -> TlaParseError:
        token = self.peek()
        found = "end of text" if token is None else f"{token[1]!r} at offset {token[2]}"
        return TlaParseError(f"expected {expected}, found {found} in TLA+ value {_clip(self.text)}")

    def expect(self, op: str) -> None:
        if not self.at(op):
            raise self.fail(repr(op))
        self.i += 1

    def parse(self) -> Value:
        value = self.value()
        if self.peek() is not None:
            raise self.fail("end of value")
        return value

    def value(self) -> Value:
        first = self.primary()
        if self.at(".."):
            self.i += 1
            last = self.primary()
            if type(first) is not int or type(last) is not int:
                raise TlaParseError(f"interval bounds must be integers in TLA+ value {_clip(self.text)}")
            return TlaSet(range(first, last + 1))
        return first

    def items(self, close: str) -> list[Value]:
        items: list[Value] = []
        if self.at(close):
            self.i += 1
            return items
        while True:
            items.append(self.value())
            if self.at(","):
                self.i += 1
                continue
            self.expect(close)
            return items

    def primary(self) -> Value:
        token = self.peek()
        if token is None:
            raise self.fail("a value")
        kind, text, _ = token
        self.i += 1
        if kind == "int":
            return int(text)
        if kind == "str":
            return _unquote(text)
        if kind == "id":
            if text == "TRUE":
                return True
            if text == "FALSE":
                return False
            return ModelValue(text)
        if text == "{":
            return TlaSet(self.items("}"))
        if text == "<<":
            return Tup(self.items(">>"))
        if text == "[":
            return self.bracket()
        if text == "(":
            return self.paren()
        self.i -= 1
        raise self.fail("a value")

    def bracket(self) -> Value:
        """``[a |-> 1, b |-> 2]`` or a constant-body ``[x \\in S |-> e]``."""
        token = self.peek()
        if token is None or token[0] != "id":
            raise self.fail("a record field name")
        self.i += 1
        if self.at("\\in"):
            self.i += 1
            domain = self.value()
            self.expect("|->")
            body = self.value()
            self.expect("]")
            if not isinstance(domain, TlaSet):
                raise TlaParseError(f"function domain is not a set in TLA+ value {_clip(self.text)}")
            if _mentions(body, ModelValue(token[1])):
                raise TlaParseError(f"cannot evaluate a function body that uses {token[1]} in {_clip(self.text)}")
            return make_function((key, body) for key in domain)
        fields: list[tuple[str, Value]] = []
        name = token[1]
        while True:
            self.expect("|->")
            fields.append((name, self.value()))
            if self.at("]"):
                self.i += 1
                return Record(fields)
            self.expect(",")
            token = self.peek()
            if token is None or token[0] != "id":
                raise self.fail("a record field name")
            name = token[1]
            self.i += 1

    def paren(self) -> Value:
        """``(k :> v @@ k2 :> v2)`` or a parenthesised value."""
        first = self.value()
        if not self.at(":>"):
            self.expect(")")
            return first
        pairs: list[tuple[Value, Value]] = []
        key = first
        while True:
            self.expect(":>")
            pairs.append((key, self.value()))
            if self.at(")"):
                self.i += 1
                break
            self.expect("@@")
            key = self.value()
        seen: set[Any] = set()
        unique = []
        for key, value in pairs:  # f @@ g: the left function wins on a shared key
            if value_key(key) not in seen:
                seen.add(value_key(key))
                unique.append((key, value))
        return make_function(unique)


def _mentions(value: Value, name: ModelValue) -> bool:
    """Whether ``name`` occurs in ``value`` (a bound variable would have parsed as a model value)."""
    if isinstance(value, ModelValue):
        return value == name
    if isinstance(value, Mapping):
        return any(_mentions(k, name) or _mentions(v, name) for k, v in value.items())
    if isinstance(value, (tuple, TlaSet)):
        return any(_mentions(item, name) for item in value)
    return False


def parse_value(text: str) -> Value:
    """Parse one value as TLC prints it (e.g. a trace state's right-hand side) into Python."""
    return _Parser(text).parse()


# --------------------------------------------------------------------------------------------
# Python -> TLA+ text
# --------------------------------------------------------------------------------------------


def _quote(text: str) -> str:
    body = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            .replace("\t", "\\t").replace("\r", "\\r").replace("\f", "\\f"))
    return f'"{body}"'


def _order(value: Value) -> tuple[int, Any]:
    """Deterministic order for printing set elements and function keys."""
    if isinstance(value, bool):
        return (0, int(value))
    if isinstance(value, int):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    if isinstance(value, ModelValue):
        return (3, value.name)
    return (4, format_value(value))


def format_value(value: Value) -> str:
    """TLA+ text for a value, in TLC's style; :func:`parse_value` reads it back to an equal value."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, ModelValue):
        return value.name
    if isinstance(value, (tuple, list)):
        return "<<" + ", ".join(format_value(item) for item in value) + ">>"
    if isinstance(value, (set, frozenset, TlaSet)):
        return "{" + ", ".join(format_value(e) for e in sorted(value, key=_order)) + "}"
    if isinstance(value, Mapping):
        pairs = sorted(value.items(), key=lambda kv: _order(kv[0]))
        if not pairs:
            return "<<>>"
        if all(isinstance(k, str) and _IDENTIFIER.match(k) for k, _ in pairs):
            return "[" + ", ".join(f"{k} |-> {format_value(v)}" for k, v in pairs) + "]"
        return "(" + " @@ ".join(f"{format_value(k)} :> {format_value(v)}" for k, v in pairs) + ")"
    if isinstance(value, Unserializable):
        return value.text
    raise TypeError(f"not a TLA+ value: {value!r} ({type(value).__name__})")


# --------------------------------------------------------------------------------------------
# Python <-> ITF JSON
# --------------------------------------------------------------------------------------------


def to_itf(value: Value) -> Any:
    """ITF JSON (plain Python data ready for ``json.dumps``) for a value."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return {"#bigint": str(value)}
    if isinstance(value, str):
        if value.endswith(MODEL_VALUE_SORT_SUFFIX) and _IDENTIFIER.match(value):
            raise ValueError(f"string {value!r} would read back as a model value in ITF")
        return value
    if isinstance(value, ModelValue):
        return value.name + MODEL_VALUE_SORT_SUFFIX
    if isinstance(value, (Seq, list)):
        return [to_itf(item) for item in value]
    if isinstance(value, tuple):
        return {"#tup": [to_itf(item) for item in value]}
    if isinstance(value, (set, frozenset, TlaSet)):
        return {"#set": [to_itf(e) for e in sorted(value, key=_order)]}
    if isinstance(value, Mapping):
        pairs = sorted(value.items(), key=lambda kv: _order(kv[0]))
        is_record = isinstance(value, Record) or (
            not isinstance(value, TlaFunction) and all(isinstance(k, str) for k, _ in pairs)
        )
        if is_record and pairs and all(not k.startswith("#") for k, _ in pairs):
            return {k: to_itf(v) for k, v in pairs}
        return {"#map": [[to_itf(k), to_itf(v)] for k, v in pairs]}
    if isinstance(value, Unserializable):
        return {"#unserializable": value.text}
    raise TypeError(f"not a TLA+ value: {value!r} ({type(value).__name__})")


def _tag_path(path: str, tag: str) -> str:
    return f'{path}["{tag}"]'


def from_itf(obj: Any, path: str = "$") -> Value:
    """Python value for ITF JSON; raises :class:`ItfError` naming the JSON path of the bad part."""
    if isinstance(obj, bool):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        raise ItfError(f"non-integer number {obj!r}", json_path=path)
    if isinstance(obj, str):
        prefix = obj[: -len(MODEL_VALUE_SORT_SUFFIX)]
        if obj.endswith(MODEL_VALUE_SORT_SUFFIX) and _IDENTIFIER.match(prefix) and prefix not in _RESERVED:
            return ModelValue(prefix)
        return obj
    if isinstance(obj, list):
        return Seq(from_itf(item, f"{path}[{i}]") for i, item in enumerate(obj))
    if not isinstance(obj, dict):
        raise ItfError(f"not an ITF value: {obj!r}", json_path=path)
    tags = [key for key in obj if key.startswith("#")]
    if not tags:
        return Record({key: from_itf(value, f"{path}.{key}") for key, value in obj.items()})
    if len(obj) != 1:
        raise ItfError(f"a tagged value must have exactly one key, found {sorted(obj)}", json_path=path)
    tag = tags[0]
    body = obj[tag]
    where = _tag_path(path, tag)
    if tag == "#bigint":
        if not isinstance(body, str) or not re.fullmatch(r"-?[0-9]+", body):
            raise ItfError(f"#bigint must be a string of digits, found {body!r}", json_path=where)
        return int(body)
    if tag in ("#set", "#tup", "#map"):
        if not isinstance(body, list):
            raise ItfError(f"{tag} must hold a JSON array, found {type(body).__name__}", json_path=where)
        if tag == "#set":
            return TlaSet(from_itf(item, f"{where}[{i}]") for i, item in enumerate(body))
        if tag == "#tup":
            return Tup(from_itf(item, f"{where}[{i}]") for i, item in enumerate(body))
        pairs = []
        for i, pair in enumerate(body):
            if not isinstance(pair, list) or len(pair) != 2:
                raise ItfError("a #map entry must be a [key, value] pair", json_path=f"{where}[{i}]")
            pairs.append((from_itf(pair[0], f"{where}[{i}][0]"), from_itf(pair[1], f"{where}[{i}][1]")))
        return TlaFunction(pairs)
    if tag == "#unserializable":
        if not isinstance(body, str):
            raise ItfError("#unserializable must hold a string", json_path=where)
        return Unserializable(body)
    raise ItfError(f"unknown value tag {tag!r}", json_path=path)


@dataclass(frozen=True)
class ItfTrace:
    """A validated ITF trace: states decoded to Python values, in order."""

    vars: tuple[str, ...]
    states: tuple[Mapping[str, Value], ...]
    meta: Mapping[str, Any]
    loop: int | None = None
    params: tuple[str, ...] = ()
    state_meta: tuple[Mapping[str, Any], ...] = ()
    path: Path | None = None


def itf_trace(vars: Iterable[str], states: Iterable[Mapping[str, Value]], meta: Mapping[str, Any] | None = None,
              loop: int | None = None) -> dict[str, Any]:
    """ITF JSON for a trace; every state is checked to hold exactly ``vars`` and gets ``#meta.index``."""
    names = list(vars)
    body_meta = {"format": "ITF",
                 "format-description": "https://apalache-mc.org/docs/adr/015adr-trace.html",
                 **(meta or {})}
    encoded = []
    for index, state in enumerate(states):
        missing = [name for name in names if name not in state]
        extra = [name for name in state if name not in names]
        if missing or extra:
            raise ValueError(f"state {index}: missing variables {missing}, unexpected {extra}")
        encoded.append({"#meta": {"index": index}, **{name: to_itf(state[name]) for name in names}})
    if loop is not None and not 0 <= loop < len(encoded):
        raise ValueError(f"loop index {loop} outside the {len(encoded)} states")
    trace: dict[str, Any] = {"#meta": body_meta, "vars": names, "states": encoded}
    if loop is not None:
        trace["loop"] = loop
    return trace


def parse_itf(obj: Any, file: Path | str | None = None) -> ItfTrace:
    """Validate and decode an already-loaded ITF JSON object (see :func:`load_itf`)."""
    if not isinstance(obj, dict):
        raise ItfError("an ITF trace must be a JSON object", file=file)
    meta = obj.get("#meta", {})
    if not isinstance(meta, dict):
        raise ItfError("#meta must be an object", json_path='$["#meta"]', file=file)
    names = obj.get("vars")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ItfError("missing or malformed 'vars' (a list of variable names)", json_path="$.vars", file=file)
    params = obj.get("params", [])
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise ItfError("'params' must be a list of names", json_path="$.params", file=file)
    raw_states = obj.get("states")
    if not isinstance(raw_states, list):
        raise ItfError("missing or malformed 'states' (a list of states)", json_path="$.states", file=file)
    states: list[Mapping[str, Value]] = []
    state_meta: list[Mapping[str, Any]] = []
    for index, raw in enumerate(raw_states):
        where = f"$.states[{index}]"
        if not isinstance(raw, dict):
            raise ItfError("a state must be an object", json_path=where, file=file, state=index)
        for name in names:
            if name not in raw:
                raise ItfError(f"missing variable {name!r}", json_path=where, file=file, state=index)
        unexpected = [key for key in raw if key not in names and key != "#meta"]
        if unexpected:
            raise ItfError(f"variables not listed in 'vars': {unexpected}", json_path=where, file=file, state=index)
        try:
            states.append({name: from_itf(raw[name], f"{where}.{name}") for name in names})
        except ItfError as error:
            raise ItfError(error.problem, json_path=error.json_path, file=file, state=index) from None
        state_meta.append(raw.get("#meta", {}))
    loop = obj.get("loop")
    if loop is not None and (type(loop) is not int or not 0 <= loop < len(states)):
        raise ItfError(f"'loop' must be a state index below {len(states)}, found {loop!r}", json_path="$.loop",
                       file=file)
    return ItfTrace(vars=tuple(names), states=tuple(states), meta=meta, loop=loop, params=tuple(params),
                    state_meta=tuple(state_meta), path=None if file is None else Path(file))


def load_itf(path: Path | str) -> ItfTrace:
    """Read and validate an ``.itf.json`` file; errors name the file, the state index and the JSON path."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ItfError(f"cannot read: {error.strerror or error}", file=path) from None
    except UnicodeDecodeError as error:  # a binary or otherwise non-UTF-8 file is bad input, not a bug
        raise ItfError(f"not UTF-8 text (byte {error.start}): not an ITF JSON file", file=path) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        raise ItfError(f"bad JSON at line {error.lineno}, column {error.colno}: {error.msg}", file=path) from None
    return parse_itf(obj, file=path)

