"""Store tasks a save keeps where neither the report nor the preemption path looks.

The model's deferred dumps are kept where ``get_finished`` and ``handle_preemptions`` wait them: a request's dumps
end before vLLM frees its blocks (a delayed finish, or the forward after a preemption). A class whose save path also
keeps store tasks in a ``self`` container that neither of those methods (nor a definition they reach) reads, and that
no loop of the step's methods waits entry by entry, has dumps no finish and no preemption waits: the twenty-ninth
blind round's ``DetachedBackfillConnector`` keeps the backfill dumps of a request's locally hit blocks (returned by a
helper, ``task = self._launch(order)``) in ``self._background``, reaped only by ``check``, for requests the scheduler
does not delay, so vLLM frees those blocks (scheduler.py ~2740-2749) while the dumps read them. A pass of the model
proves nothing for such a class. The same holds where the save path records its tasks on a copy it keeps to itself
(``copied_task_records``): the twenty-ninth blind round's ``IsolatedScopedRecordConnector`` records them on
``dataclasses.replace(meta, records=[])`` while ``clear_connector_metadata`` settles the original's list.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from deferdump.tools.mro.behaviour import SUBMIT_CALLS, UNMODELLED_STEP_METHODS, WAIT_CALLS

if TYPE_CHECKING:
    from deferdump.tools.mro.behaviour import EffectReader
    from deferdump.tools.mro.source import MethodFacts

#: The save path: where dumps are submitted and kept.
SAVE_PATH = ("save_kv_layer", "wait_for_save")

#: The methods vLLM calls before it frees a delayed request's blocks (the report) or a preempted one's (the forward
#: after ``handle_preemptions``): a kept task must be reached from one of them.
WAITING_PATH = ("get_finished", "handle_preemptions", "get_transfer_results")

#: Every worker method vLLM calls in a step (kv_connector_model_runner_mixin.py ~72-105): a loop there waiting every
#: entry of a container (a layer-wise save's ``wait_for_save`` waiting the step's per-layer tasks) ends its dumps
#: within the step, before any free.
STEP_PATH = (*SAVE_PATH, *UNMODELLED_STEP_METHODS)


def reached_facts(reader: "EffectReader", cls: str, methods: tuple[str, ...]) -> Iterator["MethodFacts"]:
    """The definitions ``cls`` runs from each of ``methods``: the one it resolves, then the helpers, ``super()`` calls
    and delegations reached from it (the rules of this module, copied_sweeps.py and own_victims.py walk these)."""
    for method in methods:
        owner = reader.hierarchy.lookup(cls, method)
        if owner is not None and not reader.hierarchy.classes[owner].external:
            yield from reader._reached(cls, owner, method, delegations=True)  # noqa: SLF001


def resolved_method(reader: "EffectReader", cls: str, helper: str) -> "MethodFacts | None":
    """The definition of ``helper`` that ``cls`` resolves, or None where none was read (an external base's)."""
    owner = reader.hierarchy.lookup(cls, helper)
    if owner is None or reader.hierarchy.classes[owner].external:
        return None
    return reader.hierarchy.method(owner, helper)


def _waits(reader: "EffectReader", cls: str, helper: str) -> bool:
    """Does the ``self`` helper, as ``cls`` resolves it, wait a store task (itself or through what it reaches)?"""
    owner = reader.hierarchy.lookup(cls, helper)
    return owner is not None and not reader.hierarchy.classes[owner].external \
        and bool(reader.effect(cls, owner, helper).calls & WAIT_CALLS)


def unreached_task_holders(reader: "EffectReader", cls: str) -> tuple[str, ...]:
    """Why a pass proves nothing for ``cls``: a ``self`` container its save path keeps store tasks in (the data flow's
    ``kept_in``, or a helper's returned task put there) whose entries some method visits in a loop (a poll, a drain at
    shutdown: the class uses what it keeps there; a list only appended to, as the PR fixture's ``_pending`` beside the
    per-request table its waits read, holds nothing anyone waits), that nothing reached from ``get_finished`` or
    ``handle_preemptions`` reads, and that no loop of the step's methods waits entry by entry (a store wait in the
    loop, or a ``self`` helper that waits)."""
    holders: dict[str, str] = {}
    for facts in reached_facts(reader, cls, SAVE_PATH):
        if facts.task_flow is not None:
            for attr in facts.task_flow.kept_in:
                holders.setdefault(attr, f"{facts.owner}.{facts.name}")
        for helper, attr in facts.helper_keeps:
            returned = resolved_method(reader, cls, helper)
            if returned is not None and returned.returns_task:
                holders.setdefault(attr, f"{facts.owner}.{facts.name} (the task {helper} returns)")
    if not holders:
        return ()
    reached: set[str] = set()
    for facts in reached_facts(reader, cls, WAITING_PATH):
        reached |= {attr for attr, _ in facts.attr_ops} | {attr for attr, _, _ in facts.attr_calls}
    for facts in reached_facts(reader, cls, STEP_PATH):
        reached |= {attr for attr, waits, helpers in facts.entry_visits
                    if waits or any(_waits(reader, cls, helper) for helper in helpers)}
        if facts.task_flow is not None:
            reached |= facts.task_flow.waits_each
    transfers = {t for owner in reader.hierarchy.mro[cls] if not reader.hierarchy.classes[owner].external
                 for facts in reader.hierarchy.classes[owner].methods.values() for t in facts.attr_transfers}
    grew = True
    while grew:  # ``self._prev = self._current``: what the report path reads of one name it reads of the other
        grew = False
        for target, source, _ in transfers:
            if target in reached and source not in reached:
                reached.add(source)
                grew = True
    visited = {attr for owner in reader.hierarchy.mro[cls] if not reader.hierarchy.classes[owner].external
               for facts in reader.hierarchy.classes[owner].methods.values() for attr, _, _ in facts.entry_visits}
    return tuple(
        f"{where} keeps store tasks in self.{attr}, which nothing reached from get_finished or handle_preemptions "
        "reads and no loop of the step's methods waits: a request vLLM frees (not delayed for them, or at a "
        "preemption) leaves those dumps reading its blocks, where the model's deferred dumps are waited on that path"
        for attr, where in sorted(holders.items()) if attr not in reached and attr in visited)


def _submits(reader: "EffectReader", cls: str, held: str) -> bool:
    """Does a value the copy gets hold a store task: a submit's, or the result of a ``self`` helper that submits?"""
    if held == "":
        return True
    owner = reader.hierarchy.lookup(cls, held)
    return owner is not None and not reader.hierarchy.classes[owner].external \
        and bool(reader.effect(cls, owner, held).calls & SUBMIT_CALLS)


def copied_task_records(reader: "EffectReader", cls: str) -> tuple[str, ...]:
    """Why a pass proves nothing for ``cls``: its save path puts store tasks into fields of a copy it keeps to itself (a
    local bound to ``dataclasses.replace(...)``/``copy.copy(...)``, which no ``return``, store or call lets out, whose
    filled fields go nowhere else, and which no ``self`` helper it is handed to keeps in ``self``), itself or through a
    ``self`` helper that puts one parameter into a field of the copy's parameter. The copy is gone when the call
    returns, and with it the only record of those dumps: nothing can wait them, where the model's deferred dumps are
    waited before their blocks are freed."""
    found: list[str] = []
    for facts in reached_facts(reader, cls, SAVE_PATH):
        for record in facts.copy_records:
            fields: dict[str, str] = {field: (f"puts the task of {held + '()' if held else 'a store submit'} into "
                                              f"{record.local}.{field}")
                                      for field, held in record.filled if _submits(reader, cls, held)}
            for helper, position, others in record.passes:
                called = resolved_method(reader, cls, helper)
                for i, j, field in called.param_fills if called is not None else ():
                    held = dict(others).get(j)
                    if i == position and held is not None and _submits(reader, cls, held):
                        fields.setdefault(field, f"hands it to {helper}(), which puts argument {j + 1} (the task of "
                                                 f"{held + '()' if held else 'a store submit'}) into its {field}")
            if not fields or set(fields) & record.escaped:
                continue
            kept = False
            for helper, position, field in record.handed:
                if field and field not in fields:
                    continue  # another field (``meta.slices``): not where the tasks are
                called = resolved_method(reader, cls, helper)
                kept |= called is None or position >= len(called.param_names) \
                    or called.param_names[position] in called.kept_params or called.returns_task
            if kept:
                continue  # a helper that was not read, or one that keeps (or returns) what it is given
            found.append(f"{facts.owner}.{facts.name} (line {record.line}) records store tasks on {record.local}, "
                         f"a copy it keeps to itself, and {next(iter(fields.values()))}: the copy is gone when the "
                         "call returns, so nothing waits those dumps, where the model's deferred dumps are waited "
                         "before their blocks are freed")
    return tuple(dict.fromkeys(found))
