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

if TYPE_CHECKING:
    from deferdump.tools.mro.behaviour import EffectReader

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
