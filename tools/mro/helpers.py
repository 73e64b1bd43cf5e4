"""Objects a connector keeps in its attributes, and whether calling into one may start a transfer unseen.

A connector that hands its work to helper objects (``self.connector_worker.start_load_kv(meta)`` in vLLM's
Mooncake and NIXL connectors, ``self.connector_worker.start_step(...)`` in HiSparse) may start a transfer
inside the helper: a push to a remote reader, a copy to host memory, a sender thread woken. The model's
transfers start only in the save methods, so a class whose other worker methods call into such an object
cannot be judged safe from the model alone (vLLM 0.32's ``MooncakeConnector`` and ``HiSparseConnector``
were: their save methods do nothing, so the model saw no transfer at all).

What an attribute holds is read from every ``self.<attr> = value`` in the class and its analysed bases
(:func:`deferdump.tools.mro.source.value_kind`). Plain data (containers, locks, loggers, tensors, numbers)
starts nothing; an instance of a class defined in the analysed files starts nothing when none of that
class's methods submits to a store, hands work to another thread or stream, or calls into a helper of its
own that may; anything else (a class that was not analysed, a parameter, a factory's result, an attribute
never assigned in the analysed code) is not followed. Calls that only read, wait or log (``get``,
``wait``, ``done``, ``info``) start nothing whatever the receiver. The store client (an attribute the class
submits dumps to) is the store: its submits are judged where they are made (a synchronous save, a deferred
dump, a transfer outside the save path), and its other calls (loads, lookups) are not saves, which is what
this checker judges.
"""
from __future__ import annotations

from deferdump.tools.mro.hierarchy import Hierarchy
from deferdump.tools.mro.source import CONNECTOR_METHODS, LOG_CALLS, STORE_SUBMITS, MethodFacts

#: Methods of plain data, loggers and metrics: containers read or updated, a line logged, a counter stepped.
DATA_METHODS = frozenset({
    "get", "items", "keys", "values", "pop", "popitem", "setdefault", "update", "clear", "copy", "add",
    "discard", "remove", "append", "appendleft", "extend", "extendleft", "insert", "index", "count", "popleft",
    "sort", "reverse", "difference", "union", "intersection", "issubset", "issuperset", "isdisjoint",
    "difference_update", "intersection_update", "symmetric_difference", "symmetric_difference_update",
    "most_common", "move_to_end",
    "isEnabledFor", "observe", "inc", "dec", "set", "labels", "time",
}) | LOG_CALLS

#: Methods that read, update plain data, wait or log: they start no transfer whatever object they are on.
PASSIVE_METHODS = DATA_METHODS | frozenset({
    "acquire", "release", "locked", "notify", "notify_all", "is_set", "wait", "wait_for", "wait_dump",
    "check", "done", "result", "cancelled", "running", "join", "is_alive", "empty", "full",
    "qsize", "get_nowait", "task_done", "lookup",
})

#: Calls into code that was not analysed that release, reset or query rather than start work (an event
#: handle destroyed, a token freed, a counter read): trusted by their name, since nothing else is known.
#: A vLLM hook handed on (``start_load_kv``, ``get_finished``) is never trusted: it is where transfers start.
TRUSTED_PREFIXES = ("free", "release", "destroy", "close", "delete", "unregister", "cancel", "reset", "drop",
                    "discard", "clear", "remove", "synchronize", "record", "query", "is_", "has_", "get_",
                    "num_", "size")

#: Attributes vLLM's ``KVConnectorBase_V1`` sets itself (base.py ~214-232, bind_connector_metadata): data.
BASE_ATTRS = frozenset({"_connector_metadata", "_vllm_config", "_role", "_kv_transfer_config",
                        "_kv_cache_config"})


def is_special(name: str) -> bool:
    """``__setitem__``, ``__len__``: a special method, which syntax calls (a builtin's does no store work)."""
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


class HelperObjects:
    """Answers, for one hierarchy, whether a call through a ``self`` attribute may start a transfer."""

    def __init__(self, hierarchy: Hierarchy) -> None:
        self.hierarchy = hierarchy
        self._kinds: dict[str, dict[str, set[str]]] = {}
        self._active: dict[str, str | None] = {}
        self._helper_classes: list[str] | None = None

    def unfollowed(self, cls: str, attr: str, path: str, inner: str | None = None) -> str | None:
        """Why ``self.<attr>.<path>(...)`` on an instance of ``cls`` may start a transfer the reader does not
        follow; None when it cannot (a passive method, plain data, an inner connector, an inert helper).
        ``inner``: the inner class the judge runs the wrapper with; calls into it are that class's own."""
        return self._unfollowed(cls, attr, path, (), inner)

    def _unfollowed(self, cls: str, attr: str, path: str, seen: tuple[tuple[str, str], ...],
                    inner: str | None = None) -> str | None:
        head, _, rest = path.partition(".")
        last = path.rsplit(".", 1)[-1]
        # a special method (``t[k] = v``) is what that very method does, as a query-like name is
        # calling the object itself runs whatever its ``__call__`` does: never trusted by its name
        passive = last in PASSIVE_METHODS or (is_special(last) and last != "__call__")
        if (cls, attr) in seen:
            return None  # a cycle adds nothing: each member is judged on its own code
        kinds = self._resolved(cls, attr)
        if passive and not rest and not self._analysed_kinds(kinds):
            return None  # a read, a wait or a log line on code that was not analysed: trusted by its name
        seen = (*seen, (cls, attr))
        if inner is not None and f"class:{inner}" in kinds:
            return None  # the wrapper's inner connector: the judge checks its methods as the inner class's
        if not kinds and attr in BASE_ATTRS:
            return None
        if not rest and attr in self._store_clients(cls):
            return None  # the store: its submits are judged where they are made; loads are not saves
        unknown = [] if kinds else [f"self.{attr} is never assigned in the analysed classes"]
        for kind in sorted(kinds):
            tag, _, what = kind.partition(":")
            if tag == "inert":
                continue
            if tag == "class" and what in self.hierarchy.connectors:
                continue  # an inner connector: judged as the wrapper's inner class
            if tag == "class" and what in self.hierarchy.classes and not self.hierarchy.classes[what].external:
                if rest:  # self.<attr>.<field>.<m>(): what the helper holds in <field>
                    why = self._unfollowed(what, head, rest, seen)
                elif passive:  # a query-like name (``set``, ``join``, ``get``): what that very method does
                    why = self.method_starts(what, last, seen)
                else:
                    why = self._starts(what, seen)
                if why is not None:
                    return f"self.{attr} holds a {what}, and {why}"
                continue
            unknown.append(f"self.{attr} holds a {what}, a class that was not analysed" if tag == "class"
                           else f"self.{attr} holds {what}, an object whose code was not analysed")
        if not unknown or passive:
            return None
        # code that was not analysed: a vLLM hook handed on, or a call that is not a release or a query
        if last in CONNECTOR_METHODS or not last.startswith(TRUSTED_PREFIXES):
            return unknown[0]
        return None

    def called_attributes(self, cls: str, facts: MethodFacts) -> tuple[list[str], list[tuple[str, str, int]]]:
        """``self.<m>(...)`` calls in ``facts`` where no class in ``cls``'s MRO defines ``m``: ``self.<m>`` is an
        attribute holding a callable. A bound method of the class (``self._fn = self._flush``) runs that method
        (returned first); any other value (``self._launch = Launcher(store)``, a partial, a parameter) runs its
        ``__call__``, returned as ``(m, "__call__", line)`` calls on the helper object (twenty-second blind round:
        ``CloseThenLaunchConnector``'s ``self._launch(queued)`` submitted the queued dumps in
        ``handle_preemptions``, after its preemption wait, and was read as no store work at all). An attribute
        never assigned stays what it was: a call that contributes nothing (docs/mro.md, Limits)."""
        if self.hierarchy.opaque_ancestors(cls):
            return [], []  # the unread base may define the method: the caller says so already
        kinds = self._attr_kinds(cls)
        methods: list[str] = []
        calls: list[tuple[str, str, int]] = []
        for name, line in facts.self_call_sites:
            if self.hierarchy.lookup(cls, name) is not None or not kinds.get(name):
                continue
            bound = {k.partition(":")[2] for k in kinds[name] if k.startswith("alias:")
                     and self.hierarchy.lookup(cls, k.partition(":")[2]) is not None}
            methods += sorted(bound)
            if any(k.partition(":")[2] not in bound for k in kinds[name]):
                calls.append((name, "__call__", line))
        return list(dict.fromkeys(methods)), list(dict.fromkeys(calls))

    def analysed_helpers(self, cls: str, attr: str) -> list[str]:
        """The classes of the analysed files (connectors left out) that ``cls``'s code assigns to ``self.<attr>``."""
        return self._analysed_kinds(self._resolved(cls, attr))

    def may_hold_anything(self, cls: str, attr: str) -> bool:
        """Is ``self.<attr>`` (on an instance of ``cls``) assigned, somewhere, a value whose class is not read from the
        code (a factory's or registry's result, a parameter), or never assigned in the analysed classes?"""
        kinds = self._resolved(cls, attr)
        if not kinds:
            return attr not in BASE_ATTRS
        return any(kind.startswith("opaque:") for kind in kinds)

    def candidates(self, cls: str, attr: str) -> tuple[list[str], bool]:
        """The helper classes ``self.<attr>`` (on an instance of ``cls``) may hold, and whether that is a guess: the
        classes assigned to it by name, or, where a value's class is not read (a factory's, a registry's, a
        parameter) or it is never assigned, every helper class of the analysed files."""
        found = self.analysed_helpers(cls, attr)
        if not found and self.may_hold_anything(cls, attr):
            return self.helper_classes(), True
        return found, False

    def helper_classes(self) -> list[str]:
        """Every class of the analysed files that is neither a connector nor external (a helper's candidates);
        computed once, as the hierarchy does not change."""
        if self._helper_classes is None:
            self._helper_classes = self._analysed_kinds({f"class:{name}" for name in self.hierarchy.classes})
        return self._helper_classes

    def _analysed_kinds(self, kinds: set[str]) -> list[str]:
        found = []
        for kind in sorted(kinds):
            tag, _, what = kind.partition(":")
            if tag == "class" and what in self.hierarchy.classes and not self.hierarchy.classes[what].external \
                    and what not in self.hierarchy.connectors:
                found.append(what)
        return found

    def method_starts(self, helper: str, name: str, seen: tuple[tuple[str, str], ...]) -> str | None:
        """Why ``<helper instance>.<name>()`` may start a transfer: that method, and the ``self`` methods it calls,
        of the analysed class ``helper`` (SlotTable of the nineteenth blind round: a ``set`` that submits a dump).
        None when none of them can, or when ``name`` comes from a base that was not analysed (``dict.get``)."""
        owner = self.hierarchy.lookup(helper, name)
        if owner is None or self.hierarchy.classes[owner].external:
            return None
        pending, done = [(owner, name)], set()
        while pending:
            owner, name = pending.pop()
            if (owner, name) in done:
                continue
            done.add((owner, name))
            method = self.hierarchy.method(owner, name)
            submits = sorted(method.calls & STORE_SUBMITS)
            if submits:
                return f"{owner}.{name} submits a store {submits[0]}()"
            if method.async_hints:
                return f"{owner}.{name} hands work on ({method.async_hints[0]})"
            if method.opaque:
                return f"{owner}.{name} cannot be followed ({method.opaque[0]})"
            aliased, called = self.called_attributes(helper, method)
            for attr, path, line in (*method.attr_calls, *called):
                inner = self._unfollowed(helper, attr, path, seen)
                if inner is not None:
                    return f"{owner}.{name} (line {line}) calls self.{attr}.{path}(): {inner}"
            for callee in sorted({*method.self_calls, *aliased}):
                target = self.hierarchy.lookup(helper, callee)
                if target is not None and not self.hierarchy.classes[target].external:
                    pending.append((target, callee))
        return None

    def _starts(self, helper: str, seen: tuple[tuple[str, str], ...]) -> str | None:
        """Why some method of the analysed class ``helper`` may start a transfer; None when none can."""
        if helper in self._active:
            return self._active[helper]
        self._active[helper] = None  # assumed inert while its own attributes are followed (cycles)
        why: str | None = None
        opaque = [c for c in self.hierarchy.mro[helper] if self.hierarchy.classes[c].external
                  and self.hierarchy.classes[c].opaque]
        if opaque:
            why = f"{helper} derives from {opaque[0]}, which was not analysed"
        for owner in self.hierarchy.mro[helper]:
            facts = self.hierarchy.classes[owner]
            if why is not None or facts.external:
                continue
            for name, method in sorted(facts.methods.items()):
                submits = sorted(method.calls & STORE_SUBMITS)
                if submits:
                    why = f"{owner}.{name} submits a store {submits[0]}()"
                elif method.async_hints:
                    why = f"{owner}.{name} hands work on ({method.async_hints[0]})"
                elif method.opaque:
                    why = f"{owner}.{name} cannot be followed ({method.opaque[0]})"
                else:
                    for attr, path, line in (*method.attr_calls, *self.called_attributes(helper, method)[1]):
                        inner = self._unfollowed(helper, attr, path, seen)
                        if inner is not None:
                            why = f"{owner}.{name} (line {line}) calls self.{attr}.{path}(): {inner}"
                            break
                if why is not None:
                    break
        self._active[helper] = why
        return why

    def _store_clients(self, cls: str) -> frozenset[str]:
        """Attributes ``cls`` submits dumps to (``self.<attr>.dump_data(...)`` anywhere in its analysed MRO)."""
        found: set[str] = set()
        for owner in self.hierarchy.mro[cls]:
            facts = self.hierarchy.classes[owner]
            if not facts.external:
                found |= {a for m in facts.methods.values() for a, p, _ in m.attr_calls if p in STORE_SUBMITS}
        return frozenset(found)

    def _resolved(self, cls: str, attr: str) -> set[str]:
        """Every kind of value ``cls``'s analysed classes assign to ``self.<attr>``, aliases followed."""
        kinds = self._attr_kinds(cls)
        found: set[str] = set()
        pending, done = [attr], set()
        while pending:
            name = pending.pop()
            if name in done:
                continue
            done.add(name)
            for kind in kinds.get(name, ()):
                if kind.startswith("alias:"):
                    pending.append(kind.partition(":")[2])
                else:
                    found.add(kind)
        return found

    def _attr_kinds(self, cls: str) -> dict[str, set[str]]:
        if cls not in self._kinds:
            kinds: dict[str, set[str]] = {}
            for owner in self.hierarchy.mro[cls]:
                facts = self.hierarchy.classes[owner]
                if facts.external:
                    continue
                for name, method in facts.methods.items():
                    for attr, kind in method.attr_values:
                        if name == "__init__" and kind.startswith("opaque:") and attr in facts.inner_classes \
                                and attr not in facts.unresolved_inits:
                            continue  # a class chosen through a registry or factory: the classes, below
                        kinds.setdefault(attr, set()).add(kind)
                if "__init__" in facts.methods:
                    for attr, classes in facts.inner_classes.items():
                        kinds.setdefault(attr, set()).update(f"class:{c}" for c in classes)
            self._kinds[cls] = kinds
        return self._kinds[cls]
