"""The `verify_dumps` guard under real vLLM: silent with the protocol, firing when the delayed free is broken.

`verify_dumps` checksums each source block when its dump is submitted and compares the bytes the task
stored. Dump copies are held (`HOLD_COPIES`: they read their source only when the connector next waits
for dumps) and the KV cache is tiny, so freed blocks are reallocated and rewritten within a step. With
the protocol intact, `request_finished` delays the free until the dump finished: zero mismatches. With
the delay broken (`request_finished` answers False, as a wrapper that fails to forward it would), vLLM
rewrites blocks the copy has not read yet: the guard counts mismatches, and the free guard sees frees of
blocks whose dumps were in flight. Its event log fails trace validation at the first `request_finished`
that answers False for a request the model delays.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deferdump.reference.connectors import OuterConnector
from vllm_harness import (
    HOLD_COPIES,
    FreeGuard,
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

NUM_BLOCKS = 9  # 8 usable: every finished request's blocks are reallocated almost at once
PROMPTS = token_prompts(12, 70, seed=51)  # 2 full blocks each, 3 blocks with their outputs
MAX_TOKENS = 4


def _run(tiny_model: Path) -> tuple[float, FreeGuard, Any]:
    """The workload with held copies: (verify mismatches, the free guard, the held-copy device)."""
    extra = {"store": "memory", "verify_dumps": True, **HOLD_COPIES}
    with running_llm(tiny_model, deferdump_transfer_config(extra), num_gpu_blocks_override=NUM_BLOCKS) as llm:
        [worker] = deferdump_connectors(worker_connector())
        [_scheduler] = deferdump_connectors(scheduler_connector(llm))
        held = held_copies(worker)
        guard = FreeGuard(llm, [worker])
        outputs = generate_and_drain(llm, PROMPTS, MAX_TOKENS)
        assert all(len(tokens) == MAX_TOKENS for tokens in outputs)
        assert metric(worker, "deferdump_dumps_completed_total") > 0
    return metric(worker, "deferdump_verify_mismatches_total"), guard, held


def test_verify_dumps_silent_when_free_is_delayed(tiny_model: Path) -> None:
    mismatches, guard, held = _run(tiny_model)
    assert mismatches == 0
    assert held.held > 0 and held.timeouts == 0
    guard.assert_each_freed_once(len(PROMPTS))


@pytest.mark.trace_rejected("request_finished", "delayed: false")
def test_verify_dumps_fires_when_free_is_not_delayed(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_request_finished = OuterConnector.request_finished
    real_get_finished = OuterConnector.get_finished

    # Broken under the adapter, so what vLLM receives is what the event log records.
    def request_finished_without_delay(self: OuterConnector, request: Any, block_ids: Any) -> tuple[bool, Any]:
        real_request_finished(self, request, block_ids)  # tracking as usual, but the free is not delayed
        return False, None

    def get_finished_without_reports(self: OuterConnector, finished_req_ids: set[str]) -> tuple[None, None]:
        real_get_finished(self, finished_req_ids)  # the worker still waits its dumps ...
        return None, None  # ... but must not report ids vLLM already freed (the scheduler would assert)

    monkeypatch.setattr(OuterConnector, "request_finished", request_finished_without_delay)
    monkeypatch.setattr(OuterConnector, "get_finished", get_finished_without_reports)
    mismatches, guard, held = _run(tiny_model)
    assert held.held > 0
    assert mismatches > 0, "the guard missed blocks rewritten under an in-flight dump"
    assert guard.violations, "no block was freed while its dump was in flight"
    assert len(guard.freed) == len(set(guard.freed)) == len(PROMPTS)
