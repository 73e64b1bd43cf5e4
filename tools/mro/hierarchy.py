"""The class hierarchy of analysed source: every class's MRO, which classes are connectors, and which
definition of each connector method runs for a given class (Python's attribute lookup, recomputed)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from deferdump.tools.mro.c3 import linearize
from deferdump.tools.mro.errors import HierarchyError, NoConnectorError
from deferdump.tools.mro.externals import (ABSTRACT_CONNECTOR_METHODS, HMA_MIXIN, ROOT_CONNECTOR, connector_like,
                                           known_external, unread_connector_base)
from deferdump.tools.mro.source import CONNECTOR_METHODS, ClassFacts, Delegation, MethodFacts


@dataclass(frozen=True)
class Hierarchy:
    """Defined classes plus the external classes they name, with C3 MROs."""

    classes: Mapping[str, ClassFacts]
    mro: Mapping[str, list[str]]

    @property
    def defined(self) -> list[str]:
        """Classes defined in the analysed files, in table order."""
        return [n for n, c in self.classes.items() if not c.external]

    @property
    def roots(self) -> list[str]:
        """Connector roots: ``KVConnectorBase_V1``, and any defined class that defines all seven abstract
        methods of vLLM's base itself (a vLLM-free connector, such as deferdump's reference one)."""
        ducks = [
            n
            for n in self.defined
            if ROOT_CONNECTOR not in self.mro[n] and ABSTRACT_CONNECTOR_METHODS <= set(self.classes[n].methods)
        ]
        return [ROOT_CONNECTOR, *ducks]

    @property
    def connectors(self) -> list[str]:
        """Defined classes whose MRO reaches a connector root (vLLM's base and the HMA mixin excluded)."""
        roots = set(self.roots)
        return [
            n for n in self.defined if roots & set(self.mro[n]) and n not in (ROOT_CONNECTOR, HMA_MIXIN)
        ]

    def supports_hma(self, cls: str) -> bool:
        return HMA_MIXIN in self.mro[cls]

    def lookup(self, cls: str, method: str, after: str | None = None) -> str | None:
        """The class whose definition of ``method`` runs for an instance of ``cls``; with ``after``, the lookup
        ``super(after, self)`` performs. None when nothing in the MRO defines it."""
        mro = self.mro[cls]
        start = 0
        if after is not None:
            if after not in mro:
                return None
            start = mro.index(after) + 1
        for owner in mro[start:]:
            if method in self.classes[owner].methods:
                return owner
        return None

    def method(self, owner: str, name: str) -> MethodFacts:
        return self.classes[owner].methods[name]

    def delegation_target(self, cls: str, delegation: Delegation) -> str | None:
        """Which class's definition a ``super()``/``Parent.m(self)`` call reaches for an instance of ``cls``."""
        if delegation.kind == "super":
            return self.lookup(cls, delegation.method, after=delegation.anchor)
        if delegation.anchor not in self.mro:
            return None
        return self.lookup(delegation.anchor, delegation.method)

    def resolves(self, cls: str) -> dict[str, str]:
        """Connector method -> owning class, for every connector method ``cls`` has."""
        found = {m: self.lookup(cls, m) for m in CONNECTOR_METHODS}
        return {m: owner for m, owner in found.items() if owner is not None}

    def abstract_left(self, cls: str) -> tuple[str, ...]:
        """The ``@abstractmethod`` defs of the analysed classes that ``cls`` leaves abstract (its first binding
        of the name in the MRO is the abstract def), as ``Owner.name``: a connector is an ABC (``KVConnectorBase_V1``
        derives from ``ABC``), so building it raises TypeError. Empty where that cannot be read: an unread base
        (it may bind the name), a metaclass, a class decorator that is not benign, ``__init_subclass__`` or
        ``__new__`` (any of them may change the check)."""
        mro = self.mro[cls]
        if ROOT_CONNECTOR not in mro or self.opaque_ancestors(cls):
            return ()
        analysed = [self.classes[c] for c in mro if not self.classes[c].external]
        if any(facts.construct_hooks for facts in analysed):
            return ()
        left = []
        for name in sorted({n for facts in analysed for n in facts.abstract_names}):
            binder = self._binder(cls, name)
            if binder is not None and not binder.external and name in binder.abstract_names:
                left.append(f"{binder.name}.{name}")
        return tuple(left)

    def base_abstract_left(self, cls: str, methods: Sequence[str]) -> tuple[str, ...]:
        """Which of ``methods`` ``cls`` leaves to vLLM's base, where they are ``@abstractmethod`` (base.py): building
        ``cls`` raises TypeError. Read from vLLM's documented base (:mod:`externals`), under the same conditions as
        :meth:`abstract_left` (no unread base, no hook that may change how the class is built)."""
        mro = self.mro[cls]
        if ROOT_CONNECTOR not in mro or self.opaque_ancestors(cls):
            return ()
        if any(self.classes[c].construct_hooks for c in mro if not self.classes[c].external):
            return ()
        left = []
        for name in methods:
            binder = self._binder(cls, name)
            if binder is not None and binder.external and binder.name == ROOT_CONNECTOR \
                    and binder.methods[name].body == "abstract":
                left.append(f"{binder.name}.{name}")
        return tuple(left)

    def _binder(self, cls: str, name: str) -> ClassFacts | None:
        """The first class of ``cls``'s MRO that binds ``name`` (an external one by its known methods)."""
        return next((self.classes[c] for c in self.mro[cls] if name in (
            self.classes[c].methods if self.classes[c].external else self.classes[c].bound_names)), None)

    def opaque_ancestors(self, cls: str) -> list[str]:
        """External classes in ``cls``'s MRO whose source was not analysed (they could define anything)."""
        return [c for c in self.mro[cls] if self.classes[c].external and self.classes[c].opaque]


def _unread_connector_bases(hierarchy: Hierarchy) -> Hierarchy:
    """A class that defines connector methods (or names a ``…Connector`` base) but reaches no connector root
    derives from a connector whose source was not read (``class Mine(ExampleConnector)`` without vLLM's file): its
    unread bases become opaque connector bases, so the class is judged, and ``unknown``, instead of being passed
    over as no connector at all."""
    roots = set(hierarchy.roots)
    orphans = [name for name in hierarchy.defined if not roots & set(hierarchy.mro[name])
               and connector_like(hierarchy.classes[name].methods, hierarchy.classes[name].base_exprs)]
    unread = {base for name in orphans for base in hierarchy.opaque_ancestors(name)}
    if not unread:
        return hierarchy
    classes = dict(hierarchy.classes)
    classes.update({base: unread_connector_base(base) for base in unread})
    classes.setdefault(ROOT_CONNECTOR, known_external(ROOT_CONNECTOR))
    for name in list(classes[ROOT_CONNECTOR].bases):
        classes.setdefault(name, known_external(name))
    try:
        mro = linearize({name: facts.bases for name, facts in classes.items()})
    except HierarchyError:  # another class lists vLLM's base before that one: leave them as they were
        return hierarchy
    return Hierarchy(classes=classes, mro=mro)


def build_hierarchy(
    defined: Mapping[str, ClassFacts], *, sources: Sequence[str] = (), require_connector: bool = True
) -> Hierarchy:
    """Add the external classes the defined ones name, then linearize everything.

    Raises :class:`HierarchyError` where Python's ``class`` statement would fail, and
    :class:`NoConnectorError` (with ``require_connector``) when no class reaches ``KVConnectorBase_V1``.
    """
    classes: dict[str, ClassFacts] = dict(defined)
    pending = [b for c in defined.values() for b in c.bases]
    while pending:
        name = pending.pop()
        if name not in classes:
            classes[name] = known_external(name)
            pending.extend(classes[name].bases)
    if "object" not in classes:
        classes["object"] = known_external("object")
    mro = linearize({name: facts.bases for name, facts in classes.items()})
    hierarchy = _unread_connector_bases(Hierarchy(classes=classes, mro=mro))
    if require_connector and not hierarchy.connectors:
        files = list(sources) or sorted({c.file for c in defined.values()}) or ["the given source"]
        raise NoConnectorError(
            f"{', '.join(files)}: no connector classes (none of {len(defined)} classes reaches {ROOT_CONNECTOR} "
            "or defines its seven abstract methods)"
        )
    return hierarchy
