"""Implementation configurations a DeferDump trace is replayed under, cycled across the traces.

The model does not know about these settings: they change how the connector does its work (or, for
``submit_fault_at_read``, where in the submit the model's submit failure is raised), never which requests
it tracks, which tasks it waits, or what it reports. Replaying each trace under one of them
(chosen by the trace's index, so a replay and its shrinking are reproducible) checks exactly that, and
runs the connector paths the default configuration never takes, at no extra replay time.
"""
from __future__ import annotations

from dataclasses import dataclass

from deferdump.tools.tlc.values import ItfTrace

__all__ = ["DEFAULT_PROFILE", "ImplProfile", "PROFILES", "profile_for"]


@dataclass(frozen=True)
class ImplProfile:
    """One implementation configuration of the replayed connectors."""

    name: str
    verify_dumps: bool = False  # checksum the blocks at submit, compare after the wait
    event_sync: bool = True  # False: synchronize at submit instead of holding an event handle
    set_preemption_api: bool = False  # older vLLM (~0.17): handle_preemptions(set), only when non-empty
    cp_direct: bool = False  # Direct traces on UCMCPConnector without layer-wise paths (CP's Direct paths)
    submit_fault_at_read: bool = False  # the model's submit failure raised by the device read, not the store

    @property
    def observes_events(self) -> bool:
        """Without event sync no handle is held, so the model's `live` and task `event` have no image."""
        return self.event_sync


DEFAULT_PROFILE = ImplProfile("default")

PROFILES: tuple[ImplProfile, ...] = (
    DEFAULT_PROFILE,
    ImplProfile("verify+set-api+read-fault", verify_dumps=True, set_preemption_api=True, submit_fault_at_read=True),
    ImplProfile("no-event-sync", event_sync=False, verify_dumps=True),
    ImplProfile("cp-direct+set-api", cp_direct=True, set_preemption_api=True),
)
"""Cycled over a model's traces in order of their index (``#meta.trace``)."""


def profile_for(trace: ItfTrace) -> ImplProfile:
    """The profile of a trace: by its index among the generated traces (0 when it has none)."""
    index = trace.meta.get("trace", 0)
    return PROFILES[index % len(PROFILES)] if isinstance(index, int) and index >= 0 else DEFAULT_PROFILE
