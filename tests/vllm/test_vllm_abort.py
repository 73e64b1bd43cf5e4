"""[abort] A request aborted mid-prefill through the engine API, while its first chunk's dump is in flight.

The abort finishes the request on the scheduler side: `request_finished` must delay the free (it had a
dump), the worker waits the dump once it learns the id, and only then are the blocks freed — exactly
once. A second request runs alongside and completes; nothing leaks.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_harness import (
    HOLD_COPIES,
    FreeGuard,
    assert_drained_worker,
    deferdump_connectors,
    deferdump_transfer_config,
    drain,
    engine_core,
    free_block_count,
    greedy,
    held_copies,
    record_request_finished,
    metric,
    running_llm,
    scheduler_connector,
    token_prompts,
    total_block_count,
    worker_connector,
)

CHUNK_TOKENS = 64  # max_num_batched_tokens: a 200-token prompt needs four prefill steps
[VICTIM_PROMPT] = token_prompts(1, 200, seed=41)
[BYSTANDER_PROMPT] = token_prompts(1, 30, seed=42)  # no full block: nothing to dump


def test_abort_mid_prefill_frees_after_dump(tiny_model: Path) -> None:
    extra = {"store": "memory", "verify_dumps": True, **HOLD_COPIES}  # the first chunk's dump is unread at the abort
    with running_llm(tiny_model, deferdump_transfer_config(extra), max_num_batched_tokens=CHUNK_TOKENS) as llm:
        [scheduler] = deferdump_connectors(scheduler_connector(llm))
        [worker] = deferdump_connectors(worker_connector())
        held = held_copies(worker)
        guard = FreeGuard(llm, [worker])
        delayed = record_request_finished(scheduler)
        engine = llm.llm_engine
        victim = engine.add_request("victim", VICTIM_PROMPT, greedy(8))
        bystander = engine.add_request("bystander", BYSTANDER_PROMPT, greedy(8))

        outputs: dict[str, Any] = {}  # by external request id
        for _ in range(3):  # until the victim's first full blocks were submitted for dumping
            outputs.update((output.request_id, output) for output in engine.step())
            if any(victim in pending.request_ids for pending in worker.core._pending_dump_tasks):
                break
        victim_request = engine_core(llm).scheduler.requests[victim]
        assert victim_request.num_computed_tokens < len(VICTIM_PROMPT["prompt_token_ids"]), "prefill already done"
        assert any(victim in pending.request_ids for pending in worker.core._pending_dump_tasks)

        engine.abort_request(["victim"])
        while engine_core(llm).scheduler.has_requests():
            outputs.update((output.request_id, output) for output in engine.step())
        drain(llm)

        assert delayed == {victim: True, bystander: False}  # True iff the request had a dump
        assert len(outputs["bystander"].outputs[0].token_ids) == 8
        guard.assert_each_freed_once(2)  # the victim only after its dump was waited
        assert free_block_count(llm) == total_block_count(llm) - 1
        assert metric(worker, "deferdump_finished_sending_total") == 1
        assert_drained_worker(worker)
    assert_drained_worker(worker)
    assert worker.core.events.leaked == 0
    assert held.held > 0 and held.timeouts == 0
