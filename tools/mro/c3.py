"""C3 linearization, as CPython computes ``__mro__``, over a table of class names.

The judge must know which definition of a connector method runs without importing the class, so it
recomputes the MRO from the bases it read, and fails exactly where Python's ``class`` statement would.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from deferdump.tools.mro.errors import HierarchyError


def _merge(name: str, sequences: list[list[str]], bases: Sequence[str]) -> list[str]:
    """The C3 merge: repeatedly take the first head that appears in no other sequence's tail."""
    result: list[str] = []
    seqs = [list(s) for s in sequences if s]
    while seqs:
        for seq in seqs:
            head = seq[0]
            if not any(head in other[1:] for other in seqs):
                break
        else:
            raise HierarchyError(
                f"class {name}: Cannot create a consistent method resolution order (MRO) for bases "
                + ", ".join(bases)
            )
        result.append(head)
        seqs = [s[1:] if s[0] == head else s for s in seqs]
        seqs = [s for s in seqs if s]
    return result


def linearize(bases_of: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """The MRO of every class in ``bases_of`` (name -> bases in declaration order).

    A base missing from the table is an error; ``object`` is implicit for a class with no bases, unless the
    table has no ``object`` entry and the class *is* the root. Raises :class:`HierarchyError` for a cycle, a
    duplicate base or an inconsistent order, with Python's wording.
    """
    mros: dict[str, list[str]] = {}
    visiting: list[str] = []

    def mro_of(name: str) -> list[str]:
        if name in mros:
            return mros[name]
        if name in visiting:
            cycle = " -> ".join(visiting[visiting.index(name):] + [name])
            raise HierarchyError(f"class {name}: inheritance cycle {cycle}")
        if name not in bases_of:
            raise HierarchyError(f"class {name} is used as a base but is not in the class table")
        bases = list(bases_of[name])
        if not bases and name != "object" and "object" in bases_of:
            bases = ["object"]
        duplicates = sorted({b for b in bases if bases.count(b) > 1})
        if duplicates:
            raise HierarchyError(f"class {name}: duplicate base class {duplicates[0]}")
        visiting.append(name)
        try:
            merged = _merge(name, [mro_of(b) for b in bases] + [bases], bases)
        finally:
            visiting.pop()
        mros[name] = [name, *merged]
        return mros[name]

    for cls in bases_of:
        mro_of(cls)
    return mros
