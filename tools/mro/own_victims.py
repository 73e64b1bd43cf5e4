"""A scheduler side that picks its own preemption victims instead of shipping the ones vLLM names.

vLLM 0.32 names the requests a schedule preempted in ``scheduler_output.preempted_req_ids``; which ones they are
depends on the policy (FCFS takes the newest running request, ``running.pop()``, scheduler.py ~834; the priority
policy takes the lowest-priority one wherever it runs, ~796-800). A class whose ``build_connector_meta`` (with the
helpers it reaches) reads that field only for its length, and ships victims it takes from a mirror of its own (the
twenty-ninth blind round's ``RunningOrderConnector`` pops the tail of an admission-order list), makes its workers wait
the dumps of requests vLLM did not preempt, while the victim's blocks go to another request. The model's preempted
ids are vLLM's, so a pass proves nothing for such a class.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from deferdump.tools.mro.unreached_tasks import reached_facts
from deferdump.tools.mro.victim_flow import WHOLE
from deferdump.tools.mro.behaviour import AMBIGUOUS_PREEMPT

if TYPE_CHECKING:
    from deferdump.tools.mro.behaviour import EffectReader

#: The labels of a ``handle_preemptions`` waiting the victims' dumps (the ambiguous one also waits freed blocks').
VICTIM_WAITS = frozenset({"wait_preempted", AMBIGUOUS_PREEMPT})

#: Where the scheduler side builds the metadata that names the preempted requests to the workers.
BUILD_PATH = ("build_connector_meta",)


def counted_victims(reader: "EffectReader", cls: str) -> tuple[str, ...]:
    """Why a pass proves nothing for ``cls``: every read of ``preempted_req_ids`` reached from ``build_connector_meta``
    only measures it (``len(...)``): no entry of vLLM's victim list reaches the workers."""
    reads = [(facts, line, measured) for facts in reached_facts(reader, cls, BUILD_PATH)
             for line, measured in facts.preempted_reads]
    if not reads or not all(measured for _, _, measured in reads):
        return ()
    facts, line, _ = reads[0]
    return (f"{facts.owner}.{facts.name} (line {line}) reads scheduler_output.preempted_req_ids only for its length: "
            "the victims it ships are its own choice, not the requests vLLM preempted (the priority policy preempts "
            "the lowest-priority request wherever it runs, scheduler.py ~796-800), while the model's preempted ids "
            "are vLLM's",)


def _carried_fields(reader: "EffectReader", cls: str, owner: str | None, method: str,
                    seen: frozenset[tuple[str, str]], *, whole: bool, unread: set[str]) -> set[str]:
    """The fields through which ``owner``'s ``method`` (as ``cls`` resolves it) hands out every victim id vLLM named:
    its return value (``whole``) and the fields it fills in an object handed to it, helpers followed. What it hands
    out from a helper or ``super()`` definition outside the analysed files is named in ``unread``."""
    if (owner, method) in seen:
        return set()
    if owner is None or reader.hierarchy.classes[owner].external or method not in reader.hierarchy.classes[owner].methods:
        unread.add(method)
        return set()
    seen = seen | {(owner, method)}
    fields: set[str] = set()
    for source, field in reader.hierarchy.method(owner, method).victim_flow.out:
        if field == WHOLE and not whole:
            continue
        if source == "read":
            fields.add(field)
            continue
        if source == "param":  # ``return meta`` of a handed-in object: what it holds is the caller's, not followed
            if whole:
                unread.add(f"{method} (returns what it is handed)")
            continue
        kind, name = source.split(":", 1)
        target = reader.hierarchy.lookup(cls, name, after=None if kind == "self" else owner)  # ``super()``: after owner
        fields |= {field if field != WHOLE else inner
                   for inner in _carried_fields(reader, cls, target, name, seen, whole=True, unread=unread)}
    return fields


def _shipped_fields(reader: "EffectReader", cls: str, build: str) -> set[str] | None:
    """The metadata fields that carry every victim id; None where part of what the build returns comes from code
    outside the analysed files (UCM's ``_plan`` behind the PR-shaped fixtures): not judged, as an unread build."""
    unread: set[str] = set()
    shipped = _carried_fields(reader, cls, build, "build_connector_meta", frozenset(), whole=True, unread=unread)
    for facts in reached_facts(reader, cls, BUILD_PATH):  # helpers filling a handed-in metadata object
        shipped |= _carried_fields(reader, cls, facts.owner, facts.name, frozenset(), whole=False, unread=unread)
        unread |= set(facts.victim_flow.handed)
    return None if unread else shipped


def _victim_waiting(reader: "EffectReader", cls: str) -> tuple[str, str] | None:
    """(owner of ``build_connector_meta``, owner of ``handle_preemptions``) as ``cls`` resolves them, both read, where
    the latter is labelled a wait of the victims' dumps; None otherwise."""
    build = reader.hierarchy.lookup(cls, "build_connector_meta")
    wait = reader.hierarchy.lookup(cls, "handle_preemptions")
    if build is None or wait is None or reader.hierarchy.classes[build].external \
            or reader.hierarchy.classes[wait].external:
        return None
    if reader.label(cls, wait, "handle_preemptions").label not in VICTIM_WAITS:
        return None
    return build, wait


def widened_victims(reader: "EffectReader", cls: str) -> tuple[str, ...]:
    """Why an overwrite the model finds may be none of ``cls``'s: its ``handle_preemptions`` (the model's
    ``wait_preempted``) also reads metadata fields that carry no victim id, so it may wait more tasks before the
    forward than vLLM's victims' (PreforwardTrackerStore, a blind round's: ``meta.preempted | meta.finished``, a
    fence over finish frees the model's label does not have). Waiting more removes overwrites, so only a failure
    is undecided by it."""
    found = _victim_waiting(reader, cls)
    if found is None:
        return ()
    build, wait = found
    read = reader.hierarchy.method(wait, "handle_preemptions").metadata_fields
    if not read:
        return ()
    shipped = _shipped_fields(reader, cls, build)
    if shipped is None:
        return ()
    if WHOLE in shipped:  # a positional field of the metadata (``Meta(plans, victims)``): any may be the one read
        return ()
    extra = sorted(read - shipped)
    if not extra:
        return ()
    return (f"{wait}.handle_preemptions also reads {', '.join(f'meta.{f}' for f in extra)}, which carries no id of "
            "scheduler_output.preempted_req_ids: it may wait, before the forward, the dumps of requests other than "
            "vLLM's victims (finished ones, say), a fence the model's wait_preempted does not have",)


def unshipped_victims(reader: "EffectReader", cls: str) -> tuple[str, ...]:
    """Why a pass proves nothing for ``cls``: its workers wait "the preempted requests' dumps" (the model's
    ``wait_preempted``, which waits vLLM's victims), but what its ``build_connector_meta`` ships does not visibly carry
    every id of ``scheduler_output.preempted_req_ids`` into a field its ``handle_preemptions`` reads: the victims
    are the class's own guess (a diff of scheduled sets, the tail of a mirror), or only some of vLLM's (a filter).
    A build path outside the analysed files is not judged here (the reader has nothing to follow)."""
    found = _victim_waiting(reader, cls)
    if found is None:
        return ()
    build, wait = found
    shipped = _shipped_fields(reader, cls, build)
    if shipped is None:
        return ()
    read = reader.hierarchy.method(wait, "handle_preemptions").metadata_fields
    if shipped and (read is None or WHOLE in shipped or shipped & read):
        return ()
    where = f"{wait}.handle_preemptions"
    fields = f" (it reads {', '.join(sorted(read))})" if read else ""
    return (f"{where} waits the dumps of the requests its metadata names{fields}, and nothing {build}."
            "build_connector_meta ships there visibly holds every id of scheduler_output.preempted_req_ids (a value "
            "of the class's own choosing, a filtered or trimmed copy, a field the workers do not read): the model's "
            "preempted ids are vLLM's, so its pass says nothing of the requests the class's workers wait",)
