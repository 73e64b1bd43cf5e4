"""[preempt] A KV cache so small that vLLM preempts: `handle_preemptions` waits exactly the preempted
requests' dump tasks (their blocks are freed at once and may be rewritten by this very step), every
request completes, and shutdown leaves no pending task or live event handle.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllm_harness import (
    FreeGuard,
    assert_drained_worker,
    deferdump_connectors,
    deferdump_transfer_config,
    delay_device_copies,
    generate_and_drain,
    metric,
    running_llm,
    scheduler_connector,
    token_prompts,
    worker_connector,
)

# shared/notes/vllm-cpu-e2e.md: 9 blocks (8 usable), 6 prompts of 100 tokens, 60 new tokens each -> preemptions.
NUM_BLOCKS = 9
PROMPTS = token_prompts(6, 100, seed=21)
MAX_TOKENS = 60
# Copies read their source this long after submit: a victim's prefill dump is still in flight when the
# scheduler preempts it (tens of decode steps later), so handle_preemptions has a real task to wait.
COPY_DELAY_S = 1.0


class PreemptionSpy:
    """Wraps the worker core's `handle_preemptions`: which pending tasks each call waited, and why."""

    def __init__(self, worker: Any) -> None:
        core = worker.core
        original = core.handle_preemptions
        self.calls: list[tuple[frozenset[str], list[Any], list[Any]]] = []  # (preempted, before, after)

        def spied(meta: Any) -> None:
            preempted = frozenset(getattr(meta, "preempted_req_ids", None) or ())
            before = list(core._pending_dump_tasks)
            original(meta)
            if preempted:
                self.calls.append((preempted, before, list(core._pending_dump_tasks)))

        core.handle_preemptions = spied

    @property
    def preempted_ids(self) -> set[str]:
        return set().union(*(preempted for preempted, _, _ in self.calls))


@pytest.mark.parametrize("variant", ["direct", "layerwise"])
def test_preempt_waits_only_preempted_tasks(
    tiny_model: Path, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    delay_device_copies(monkeypatch, COPY_DELAY_S)
    extra = {"variant": variant, "store": "memory", "verify_dumps": True}
    with running_llm(tiny_model, deferdump_transfer_config(extra), num_gpu_blocks_override=NUM_BLOCKS) as llm:
        [scheduler] = deferdump_connectors(scheduler_connector(llm))
        [worker] = deferdump_connectors(worker_connector())
        guard = FreeGuard(llm, [worker])
        spy = PreemptionSpy(worker)

        outputs = generate_and_drain(llm, PROMPTS, MAX_TOKENS)

        assert all(len(tokens) == MAX_TOKENS for tokens in outputs), "a request did not complete"
        assert spy.calls, "the scheduler never preempted: the KV cache is not small enough"
        assert metric(worker, "deferdump_handle_preemptions_wait_seconds_count") == len(spy.calls)
        waited_any = False
        for preempted, before, after in spy.calls:
            waited = [task for task in before if task not in after]
            kept = [task for task in before if task in after]
            assert all(task.overlaps(preempted) for task in waited), "waited a task of a running request"
            assert not any(task.overlaps(preempted) for task in kept), "left a preempted request's task pending"
            waited_any = waited_any or bool(waited)
        guard.assert_each_freed_once(len(PROMPTS))
        assert metric(worker, "deferdump_dumps_submitted_total") > 0
        assert_drained_worker(worker)
        # The hazard was real: a preempted request still had a dump in flight, and it was waited before the
        # forward that rewrites its blocks (verify_dumps found no changed block: assert_drained_worker).
        assert waited_any, "no preempted request had a dump in flight: the test did not exercise the hazard"
    assert_drained_worker(worker)  # after shutdown: no pending task, no live handle
    assert worker.core.events.leaked == 0
    assert scheduler.core._async_dump_req_ids == set()
