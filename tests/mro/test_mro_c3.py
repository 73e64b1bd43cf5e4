"""C3 linearization: equal to CPython's ``__mro__`` on random hierarchies, failing exactly where Python fails."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deferdump.tools.mro.c3 import linearize
from deferdump.tools.mro.errors import HierarchyError


@st.composite
def hierarchies(draw: st.DrawFn) -> dict[str, list[str]]:
    """Up to 8 classes; each names up to 3 distinct earlier classes as bases, in a drawn order."""
    size = draw(st.integers(min_value=1, max_value=8))
    table: dict[str, list[str]] = {"object": []}
    for index in range(size):
        earlier = [n for n in table if n != "object"]
        bases = draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True)) if earlier else []
        table[f"C{index}"] = bases
    return table


def _python_mros(table: dict[str, list[str]]) -> dict[str, list[str]] | TypeError:
    built: dict[str, type] = {"object": object}
    try:
        for name, bases in table.items():
            if name != "object":
                built[name] = type(name, tuple(built[b] for b in bases), {})
    except TypeError as exc:
        return exc
    return {name: [c.__name__ for c in cls.__mro__] for name, cls in built.items()}


@settings(max_examples=300, deadline=None)
@given(hierarchies())
def test_linearize_equals_python_mro(table: dict[str, list[str]]) -> None:
    expected = _python_mros(table)
    if isinstance(expected, TypeError):
        with pytest.raises(HierarchyError, match="consistent method resolution order"):
            linearize(table)
    else:
        assert linearize(table) == expected


def test_diamond_mro() -> None:
    table = {"object": [], "A": [], "B": ["A"], "C": ["A"], "D": ["B", "C"]}
    assert linearize(table)["D"] == ["D", "B", "C", "A", "object"]


def test_inconsistent_order_names_the_bases_like_python() -> None:
    table = {"object": [], "A": [], "B": [], "X": ["A", "B"], "Y": ["B", "A"], "Z": ["X", "Y"]}
    with pytest.raises(HierarchyError, match=r"class Z: Cannot create a consistent .* for bases X, Y"):
        linearize(table)


def test_duplicate_base_and_cycle_and_missing_base_are_errors() -> None:
    with pytest.raises(HierarchyError, match="duplicate base class A"):
        linearize({"object": [], "A": [], "B": ["A", "A"]})
    with pytest.raises(HierarchyError, match="inheritance cycle"):
        linearize({"object": [], "A": ["B"], "B": ["A"]})
    with pytest.raises(HierarchyError, match="Missing is used as a base"):
        linearize({"object": [], "A": ["Missing"]})
