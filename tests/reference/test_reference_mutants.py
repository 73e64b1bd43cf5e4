"""The property test has teeth: each deliberately broken connector (a mutant of one UCM rule) is caught.

Each mutant runs the same state machine as tests/reference/test_reference_statemachine.py, without shrinking, and
must fail with one of the invariants that rule protects.
"""
from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, settings

from deferdump.reference import DirectConnector, LayerWiseConnector
from deferdump.reference.invariants import InvariantViolation
from support.statemachine import DeferredDumpMachine


def _report_without_waiting(self: DirectConnector, finished_req_ids: set[str]):  # type: ignore[no-untyped-def]
    done = set(finished_req_ids) & self._async_dump_req_ids
    self._async_dump_req_ids -= done
    return (done or None), None


_DIRECT_SAVE = DirectConnector.wait_for_save
_LAYERWISE_SAVE = LayerWiseConnector.wait_for_save


def _wait_everything_then(original: Callable[[DirectConnector], None]) -> Callable[[DirectConnector], None]:
    def wait_for_save(self: DirectConnector) -> None:
        self._flush_pending_dump_tasks(None)
        original(self)

    return wait_for_save


def _never_delay(self: DirectConnector, request, block_ids):  # type: ignore[no-untyped-def]
    self._async_dump_req_ids.discard(request.req_id)
    return False, None


def _track_after_mla_return(self: DirectConnector) -> None:
    self._poll_pending_dump_tasks()
    if not self._dumps_on_this_rank():
        return
    self._track_bound_dump_requests()
    req_ids, hashes, block_ids = self._dumping_requests()
    if hashes:
        self._submit_dump(self._store_keys(hashes), block_ids, req_ids, None)


def _flush_everything_on_preemption(self: DirectConnector, meta_or_ids) -> None:  # type: ignore[no-untyped-def]
    if getattr(meta_or_ids, "preempted_req_ids", None):
        self._flush_pending_dump_tasks(None)


def _keep_handle(self: DirectConnector, pending) -> None:  # type: ignore[no-untyped-def]
    pending.event_handle = pending.event_handle  # never released


UNSAFE_REUSE = ("NoFreeUnderRead", "NoOverwriteWhileDumpingInv", "StoredBytes", "ReportedHasNoTask")

MUTANTS: dict[str, tuple[type, str, Callable[..., object], tuple[str, ...]]] = {
    "get_finished reports without waiting": (DirectConnector, "get_finished", _report_without_waiting, UNSAFE_REUSE),
    "handle_preemptions does nothing": (DirectConnector, "handle_preemptions", lambda self, meta: None, UNSAFE_REUSE),
    "handle_preemptions waits every task": (
        DirectConnector, "handle_preemptions", _flush_everything_on_preemption, ("PreemptWaitsOnlyPreemptedInv",)
    ),
    "request_finished never delays": (DirectConnector, "request_finished", _never_delay, ("RequestFinished",)),
    "worker tracks after the MLA return": (DirectConnector, "wait_for_save", _track_after_mla_return, ("Liveness",)),
    "event handles never released": (
        DirectConnector, "_release_dump_event_handle", _keep_handle, ("NoEventLeakInv",)
    ),
    "wait_for_save waits every pending task": (
        DirectConnector, "wait_for_save", _wait_everything_then(_DIRECT_SAVE), ("NoWaitInWaitForSaveInv",)
    ),
    "layer-wise wait_for_save waits everything": (
        LayerWiseConnector, "wait_for_save", _wait_everything_then(_LAYERWISE_SAVE), ("NoWaitInWaitForSaveInv",)
    ),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cls, method, replacement, invariants = MUTANTS[name]
    monkeypatch.setattr(cls, method, replacement)
    test = DeferredDumpMachine.TestCase("runTest")
    test.settings = settings(
        max_examples=1000, stateful_step_count=30, deadline=None, phases=[Phase.generate], database=None,
        suppress_health_check=list(HealthCheck),
    )
    with pytest.raises(InvariantViolation) as caught:
        test.runTest()
    assert any(invariant in str(caught.value) for invariant in invariants), str(caught.value)
