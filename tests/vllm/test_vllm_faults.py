"""The prefix scenario over a failing store: vLLM still produces the same tokens and nothing leaks.

Failed dump submits and waits turn into later misses; failed loads are reported through
`get_block_ids_with_load_errors` and vLLM (with `kv_load_failure_policy="recompute"`) recomputes those
blocks. Either way the greedy outputs must equal the fault-free first generation.
"""
from __future__ import annotations

from pathlib import Path

from vllm_harness import (
    FreeGuard,
    assert_drained_worker,
    assert_shut_down,
    deferdump_connectors,
    deferdump_transfer_config,
    generate_and_drain,
    metric,
    record_request_finished,
    running_llm,
    scheduler_connector,
    token_prompts,
    worker_connector,
)

PROMPTS = token_prompts(8, 100, seed=71)
MAX_TOKENS = 8


def test_prefix_over_a_failing_store_recomputes_with_identical_outputs(tiny_model: Path) -> None:
    # One request at a time: eight dump tasks in the first run, each failing (submit or wait) with
    # probability 0.75, so that "no dump failed" has a chance of 0.25**8 whatever the thread timing.
    faults = {"submit_fail": 0.5, "wait_fail": 0.5, "check_fail": 0.2, "seed": 7}
    extra = {"store": "memory", "verify_dumps": True, "faults": faults}
    config = deferdump_transfer_config(extra) | {"kv_load_failure_policy": "recompute"}
    with running_llm(tiny_model, config, max_num_seqs=1) as llm:
        [scheduler] = deferdump_connectors(scheduler_connector(llm))
        [worker] = deferdump_connectors(worker_connector())
        guard = FreeGuard(llm, [worker])
        delayed = record_request_finished(scheduler)

        first = generate_and_drain(llm, PROMPTS, MAX_TOKENS)
        assert llm.reset_prefix_cache()
        second = generate_and_drain(llm, PROMPTS, MAX_TOKENS)

        assert second == first
        failed_dumps = sum(
            metric(worker, "deferdump_dumps_failed_total", {"stage": stage}) for stage in ("submit", "wait")
        )
        assert failed_dumps > 0, "the faults never hit a dump: the test exercised nothing"
        # Blocks whose dump failed are misses in the second run and dump again: each delayed id is reported once.
        assert sum(delayed.values()) >= len(PROMPTS)
        assert metric(worker, "deferdump_finished_sending_total") == sum(delayed.values())
        guard.assert_each_freed_once(2 * len(PROMPTS))
        assert_drained_worker(worker)
    assert_shut_down(scheduler, worker)
    assert_drained_worker(worker)
    assert worker.core.events.leaked == 0
