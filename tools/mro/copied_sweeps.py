"""Tasks a report or preemption path ends through a copy of their table and leaves in it for another method.

``tickets = list(self._by_req.get(r, ()))``, a loop that waits each ticket and releases its handle, then
``tickets.clear()``: the copy is emptied, the table is not. The twenty-ninth blind round's
``StagedRequestMapStoreConnector`` does this in ``get_finished``, and its ``_reap`` (every ``wait_for_save``) walks the
table and releases the handles of finished tickets again: a double release, where the model waits each task and
releases its handle once. A pass of the model proves nothing for such a class.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from deferdump.tools.mro.behaviour import WAIT_CALLS
from deferdump.tools.mro.unreached_tasks import WAITING_PATH, reached_facts, resolved_method

if TYPE_CHECKING:
    from deferdump.tools.mro.behaviour import EffectReader


def _ends(reader: "EffectReader", cls: str, helper: str) -> bool:
    """Does the ``self`` helper, as ``cls`` resolves it, wait a store task or release something?"""
    owner = reader.hierarchy.lookup(cls, helper)
    if owner is None or reader.hierarchy.classes[owner].external:
        return False
    calls = reader.effect(cls, owner, helper).calls
    return bool(calls & WAIT_CALLS) or any("release" in c for c in calls)


def entries_left_behind(reader: "EffectReader", cls: str) -> tuple[str, ...]:
    """Why a pass proves nothing for ``cls``: a definition reached from ``get_finished`` or ``handle_preemptions``
    waits (or releases through a ``self`` helper) the entries of a copy of a ``self`` container, nothing reached from
    that method removes entries from the container (``pop``, ``remove``, ``del``, ``clear``, a rebinding), and a
    method not reached from it loops over the container's entries: what was ended is handled again there."""
    found: list[str] = []
    for top in WAITING_PATH:
        owner = reader.hierarchy.lookup(cls, top)
        if owner is None or reader.hierarchy.classes[owner].external:
            continue
        reached = list(reached_facts(reader, cls, (top,)))
        sweeps = [(f, attr, line) for f in reached for attr, line, waits, helpers in f.copied_sweeps
                  if waits or any(_ends(reader, cls, h) for h in helpers)]
        if not sweeps:
            continue
        removed = {attr for f in reached for attr, ops in f.attr_ops if ops & {"remove", "assign"}}
        removed |= {attr for f in reached if f.task_flow is not None for attr in f.task_flow.clears}
        here = {(f.owner, f.name) for f in reached}
        for facts, attr, line in sweeps:
            if attr in removed:
                continue
            others = sorted(f"{o}.{name}" for o in reader.hierarchy.mro[cls]
                            if not reader.hierarchy.classes[o].external
                            for name, f in reader.hierarchy.classes[o].methods.items()
                            if (o, name) not in here and any(a == attr for a, _, _ in f.entry_visits)
                            and resolved_method(reader, cls, name) is f)
            if others:
                found.append(f"{facts.owner}.{facts.name} (line {line}) ends the entries of a copy of self.{attr} "
                             f"and leaves them in self.{attr}, which {others[0]} visits again: a task may be waited, "
                             "or its handle released, twice, where the model ends each task once")
    return tuple(dict.fromkeys(found))
