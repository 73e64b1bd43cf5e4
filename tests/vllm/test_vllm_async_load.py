"""[async_load] Asynchronous loads (`load_async: true`) in real vLLM 0.32 on the tiny model with random weights.

vLLM parks a request whose hit the connector loads asynchronously in WAITING_FOR_REMOTE_KVS; the worker runs
the load on the store's tasks and reports it in finished_recving once its blocks are written; vLLM then
schedules it (or, aborted meanwhile, frees its blocks only then). Outputs are compared with a run without
the connector (random weights: the greedy tokens depend on the KV). A failed load on the tiny hybrid model
comes back as a failed receive (`failed_recving`) and vLLM recomputes: the engine survives.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from deferdump.reference.stores.base import KVStore, StoreStats, StoreTask, SubmitError
from vllm_harness import (
    FreeGuard,
    assert_drained_worker,
    deferdump_connectors,
    deferdump_transfer_config,
    drain,
    engine_core,
    free_block_count,
    generate_and_drain,
    greedy,
    metric,
    running_llm,
    scheduler_connector,
    token_prompts,
    total_block_count,
    worker_connector,
)

PROMPTS = token_prompts(2, 100, seed=83)  # three full blocks each: a 96-token hit
MAX_TOKENS = 8
ASYNC = {"store": "memory", "load_async": True}
# The trace model reads the receive side with one KV-cache group (docs/trace-validation.md): these runs are
# validated in full. On the hybrid model `deferdump validate` refuses them in one line (asserted).
HYBRID_BEYOND_MODEL = pytest.mark.trace_beyond_model("asynchronous loads on several KV-cache groups")


class GatedLoads(KVStore):
    """The worker's store, with its loads held back by the test: while `closed`, `check` says a load task
    is still running (so the connector neither waits nor reports it); `fail_next` refuses that many load
    submits. Everything else goes to the real store."""

    def __init__(self, inner: KVStore) -> None:
        self.inner = inner
        self.closed = False
        self.fail_next = 0
        self.loads = 0

    def lookup_prefix(self, block_hashes: Sequence[bytes]) -> int:
        return self.inner.lookup_prefix(block_hashes)

    def dump(self, block_hashes: Sequence[bytes], payload: Any) -> StoreTask:
        return self.inner.dump(block_hashes, payload)

    def load(self, block_hashes: Sequence[bytes]) -> StoreTask:
        self.loads += 1
        if self.fail_next:
            self.fail_next -= 1
            raise SubmitError("load refused by the test (GatedLoads.fail_next)")
        return self.inner.load(block_hashes)

    def check(self, task: StoreTask) -> bool:
        return self.inner.check(task) and not (self.closed and task.kind == "load")

    def wait(self, task: StoreTask, timeout: float | None = None) -> torch.Tensor | None:
        return self.inner.wait(task, timeout)

    def stats(self) -> StoreStats:
        return self.inner.stats()


def _gate(worker: Any) -> GatedLoads:
    gated = GatedLoads(worker.core.inner.store)
    worker.core.inner._store = gated
    return gated


def _record_lookups(scheduler: Any) -> list[bool]:
    """Wrap the scheduler connector's lookup: the `load_async` answer of every non-zero hit."""
    original, answers = scheduler.get_num_new_matched_tokens, []

    def recording(request: Any, num_computed_tokens: int) -> Any:
        matched, load_async = original(request, num_computed_tokens)
        if matched:
            answers.append(load_async)
        return matched, load_async

    scheduler.get_num_new_matched_tokens = recording
    return answers


@pytest.fixture(scope="module")
def baseline(tiny_model_weights: Path) -> list[tuple[int, ...]]:
    with running_llm(tiny_model_weights, None, load_format="auto") as llm:
        return generate_and_drain(llm, PROMPTS, MAX_TOKENS)


def test_async_load_serves_repeated_prompts_and_an_abort_during_a_load_frees_after_it(
    tiny_model_weights: Path, baseline: list[tuple[int, ...]]
) -> None:
    with running_llm(tiny_model_weights, deferdump_transfer_config(ASYNC), load_format="auto") as llm:
        [scheduler] = deferdump_connectors(scheduler_connector(llm))
        [worker] = deferdump_connectors(worker_connector())
        answers = _record_lookups(scheduler)
        first = generate_and_drain(llm, PROMPTS, MAX_TOKENS)
        assert llm.reset_prefix_cache()
        second = generate_and_drain(llm, PROMPTS, MAX_TOKENS)
        assert first == baseline and second == baseline
        assert answers == [True, True]  # the second run's two hits, both asynchronous
        assert metric(worker, "deferdump_loads_completed_total") == 2

        # An abort while the load runs: vLLM keeps the blocks until the worker reports the load.
        assert llm.reset_prefix_cache()
        gate = _gate(worker)
        gate.closed = True
        guard = FreeGuard(llm, [worker])
        sched = engine_core(llm).scheduler
        freed_while_loading: list[str] = []
        free_blocks = sched._free_blocks

        def checked_free(request: Any) -> None:
            if request.request_id in worker.core.receiving_request_ids():
                freed_while_loading.append(request.request_id)
            free_blocks(request)

        sched._free_blocks = checked_free
        engine = llm.llm_engine
        victim = engine.add_request("victim", PROMPTS[0], greedy(MAX_TOKENS))
        engine.step()
        assert str(sched.requests[victim].status) == "WAITING_FOR_REMOTE_KVS"
        assert worker.core.receiving_request_ids() == {victim}
        engine.abort_request(["victim"])
        for _ in range(3):  # the engine keeps stepping; the aborted request holds its blocks
            engine.step()
        assert victim in sched.requests and free_block_count(llm) < total_block_count(llm) - 1
        gate.closed = False
        drain(llm)
        assert freed_while_loading == [] and victim not in sched.requests
        guard.assert_each_freed_once(1)
        assert free_block_count(llm) == total_block_count(llm) - 1
        assert worker.core.receiving_request_ids() == frozenset() and scheduler.core.receiving_request_ids() == frozenset()
        assert_drained_worker(worker)


@HYBRID_BEYOND_MODEL
def test_async_load_failure_on_the_hybrid_model_keeps_the_engine_running(tiny_hybrid_model_weights: Path) -> None:
    """vLLM 0.32 raises on block-level load errors with two KV-cache groups (`_handle_invalid_blocks`); an
    asynchronous load's failure goes back as a failed receive instead, and vLLM recomputes the request."""
    with running_llm(tiny_hybrid_model_weights, None, load_format="auto") as llm:
        expected = generate_and_drain(llm, PROMPTS, MAX_TOKENS)
    config = deferdump_transfer_config(ASYNC) | {"kv_load_failure_policy": "recompute"}
    with running_llm(tiny_hybrid_model_weights, config, load_format="auto") as llm:
        assert llm.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is False
        assert len(engine_core(llm).scheduler.kv_cache_config.kv_cache_groups) == 2
        [worker] = deferdump_connectors(worker_connector())
        assert worker.core.inner.hybrid
        first = generate_and_drain(llm, PROMPTS, MAX_TOKENS)
        assert llm.reset_prefix_cache()
        gate = _gate(worker)
        gate.fail_next = 2  # the first hit's load fails in both groups; vLLM retries it and the retry loads
        second = generate_and_drain(llm, PROMPTS, MAX_TOKENS)
        assert first == expected and second == expected
        assert gate.fail_next == 0 and gate.loads > 2
        assert metric(worker, "deferdump_load_error_blocks_total") > 0
        assert free_block_count(llm) == total_block_count(llm) - 1
        assert_drained_worker(worker)


def _park_and_abort(llm: Any, worker: Any, gate: GatedLoads) -> tuple[Any, str]:
    """Admit PROMPTS[0] (a hit) with its load held, step until it is parked, abort it, then let the load end."""
    sched = engine_core(llm).scheduler
    engine = llm.llm_engine
    gate.closed = True
    victim = engine.add_request("victim", PROMPTS[0], greedy(MAX_TOKENS))
    engine.step()
    assert str(sched.requests[victim].status) == "WAITING_FOR_REMOTE_KVS"
    assert worker.core.receiving_request_ids() == {victim}
    engine.abort_request(["victim"])
    engine.step()  # the worker learns of the abort while the load runs
    gate.closed = False
    return sched, victim


# Rejected where the rank drops the aborted request's load without reporting it (the `receiving` field).
@pytest.mark.trace_rejected("get_finished", "receiving: a load dropped without its finished_recving")
def test_async_load_p8_broken_mode_holds_the_aborted_requests_blocks_forever(tiny_model: Path) -> None:
    """Real bug P8 (vllm-ascend#16662), by the TEST-ONLY `test_drop_aborted_recving`: the aborted request is
    dropped from the receive set, its finished_recving never comes, and vLLM never frees its blocks."""
    extra = ASYNC | {"test_drop_aborted_recving": True}
    with running_llm(tiny_model, deferdump_transfer_config(extra)) as llm:
        [worker] = deferdump_connectors(worker_connector())
        generate_and_drain(llm, PROMPTS[:1], MAX_TOKENS)
        assert llm.reset_prefix_cache()
        sched, victim = _park_and_abort(llm, worker, _gate(worker))
        for _ in range(20):
            llm.llm_engine.step()
        assert worker.core.receiving_request_ids() == frozenset()  # the load ended and was dropped
        assert victim in sched.requests and sched.has_requests()  # held forever: the leak the bug reported
        assert free_block_count(llm) < total_block_count(llm) - 1
