"""Asynchronous loads under conformance: AsyncLoadConformance's edge cover on the reference connector (`load_async`).

The cover itself is replayed by test_conformance_traces.py (every shipped conformance model), and the core branches it
takes are pinned by test_corecov_load_paths.py. Here: replay catches implementation mutants of the receive side, each at
the first step of the first failing trace where the mutated behaviour is observable, computed from the trace (its
states before and after each step).
"""
from __future__ import annotations

from collections.abc import Callable

import pytest

from support.conformance import loaded_traces, prefetch_covers, rank_calls, steps_of
from deferdump.conformance.replay import replay_loaded
from deferdump.reference.connectors import DirectConnector
from deferdump.reference.metadata import RequestDispatchMeta
from deferdump.tools.tlc.values import ItfTrace, Record, load_itf

pytestmark = pytest.mark.slow

MODEL = "AsyncLoadConformance"


@pytest.fixture(scope="module")
def traces() -> tuple[ItfTrace, ...]:
    prefetch_covers([MODEL])
    return loaded_traces(MODEL)


# ------------------------------------------------------------------ implementation mutants of the receive side

_ORIGINAL_POLL = DirectConnector._poll_async_loads


def load_never_sent(self, req_id, plan):  # build_connector_meta forgets a parked request's load
    plan.async_load_pending = False
    return RequestDispatchMeta()


def drop_aborted_recving(self, finished_req_ids):  # real bug P8 (vllm-ascend#16662): aborted receives dropped
    for req_id in finished_req_ids & self._pending_loads.keys():
        del self._pending_loads[req_id]
    return _ORIGINAL_POLL(self, frozenset())


def report_before_load_ends(self, part):  # every load counts as over: reported while the store still writes
    return True


def receives_not_seen(self, finished_recving=()):  # the scheduler side never learns a receive ended
    return None


def _sends_load(before, phase) -> bool:
    return phase["name"] == "schedule" and any(c["name"] == "get_num_new_matched_tokens" and len(c["load_async"]) > 0
                                               for c in phase["calls"])


def _finished_while_loading(before, phase) -> bool:
    return any(len(set(call["finished_req_ids"]) & set(before["workerRecv"][rank])) > 0
               for rank, call in rank_calls(phase, "get_finished"))


def _polls_running_load(before, phase) -> bool:
    if phase["name"] != "execute_model":
        return False
    started = any(len(call["submitted"]) > 0 for _, call in rank_calls(phase, "start_load_kv"))
    return started or any(t["status"] == "running" for tasks in before["loadTasks"].values() for t in tasks)


class _ReceivedThenDelayed:
    """Stateful: a request_finished that delays (model) a request whose receive was reported earlier."""

    def __init__(self) -> None:
        self.received: set = set()

    def __call__(self, before, phase) -> bool:
        for call in phase.get("calls", ()):
            if call["name"] == "request_finished" and set(call["ucm_delayed"]) & self.received:
                return True
            if call["name"] == "_update_from_kv_xfer_finished" and "finished_recving" in call:
                self.received |= set(call["finished_recving"])
        return False


def _first_step(trace: ItfTrace, predicate: Callable[[Record, Record], bool]) -> int | None:
    for index in range(1, len(trace.states)):
        if any(predicate(trace.states[index - 1], phase) for phase in steps_of(trace.states[index]["action"])):
            return index
    return None


MUTANTS = [
    pytest.param("_async_load_meta", load_never_sent, _sends_load, ("load slices",), id="parked-load-never-sent"),
    pytest.param("_poll_async_loads", drop_aborted_recving, _finished_while_loading,
                 ("finished_recving", "workerRecv", "loadTasks"), id="P8-drop-aborted-recving"),
    pytest.param("_load_part_done", report_before_load_ends, _polls_running_load, ("finished_recving",),
                 id="receive-reported-before-the-load-ends"),
    pytest.param("update_connector_output", receives_not_seen, _ReceivedThenDelayed, ("request_finished(r1)",),
                 id="scheduler-never-sees-the-receive"),
]


@pytest.mark.parametrize("method, mutant, observable, diff_mentions", MUTANTS)
def test_receive_side_mutant_is_caught_at_the_first_observable_step(traces, monkeypatch, method, mutant, observable,
                                                                    diff_mentions) -> None:
    monkeypatch.setattr(DirectConnector, method, mutant)
    report = replay_loaded(traces, stop_first=True, shrink=False, coverage=False)
    assert len(report.failed) == 1, "the mutant survived every AsyncLoadConformance trace"
    divergence = report.failed[0]
    trace = load_itf(divergence.file)
    predicate = observable() if isinstance(observable, type) else observable
    step = _first_step(trace, predicate)
    assert step is not None and divergence.step == step, divergence.describe()
    assert any(m in line for line in divergence.diff for m in diff_mentions), divergence.describe()
