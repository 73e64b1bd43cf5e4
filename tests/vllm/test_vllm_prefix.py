"""[prefix] Dumps made in one generation are external hits in the next, with identical greedy outputs.

Generate, reset vLLM's own prefix cache (so nothing is cached locally), generate again: every full
prompt block must now come from deferdump's store, loaded into freshly allocated blocks, and the model
must produce exactly the same tokens — which it can only do if the loaded KV bytes are the dumped ones.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from vllm_harness import (
    BLOCK_SIZE,
    TINY_LLAMA_CONFIG,
    FreeGuard,
    assert_drained_worker,
    assert_shut_down,
    deferdump_connectors,
    deferdump_transfer_config,
    drain,
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

MAX_TOKENS = 16
# Four prompts with a partial last block and one of exactly three blocks: the store then holds every
# full block, and a full hit must leave the last token to vLLM (95 of 96 tokens external).
PROMPTS = token_prompts(4, 100, seed=11) + token_prompts(1, 3 * BLOCK_SIZE, seed=12)
EXPECTED_HIT_TOKENS = [3 * BLOCK_SIZE] * 4 + [3 * BLOCK_SIZE - 1]
FULL_BLOCKS = 3 * len(PROMPTS)


@pytest.mark.parametrize("variant", ["direct", "layerwise"])
@pytest.mark.parametrize("store", ["memory", "file"])
def test_prefix_second_generation_loads_from_store(tiny_model: Path, store_dir: Path, store: str, variant: str) -> None:
    extra = {"variant": variant, "store": store, "verify_dumps": True}
    if store == "file":
        extra["store_path"] = str(store_dir / "blocks")
    with running_llm(tiny_model, deferdump_transfer_config(extra)) as llm:
        [scheduler] = deferdump_connectors(scheduler_connector(llm))
        [worker] = deferdump_connectors(worker_connector())
        guard = FreeGuard(llm, [worker])

        first = generate_and_drain(llm, PROMPTS, MAX_TOKENS)
        assert metric(scheduler, "deferdump_external_hit_tokens_total") == 0  # nothing stored yet
        layers = TINY_LLAMA_CONFIG["num_hidden_layers"]
        assert scheduler.core.inner.num_layers == layers  # every layer's key is looked up (per-layer dumps)
        stored_blocks = FULL_BLOCKS * (layers if variant == "layerwise" else 1)
        assert worker.store.stats().blocks == stored_blocks
        assert llm.reset_prefix_cache(), "vLLM still holds blocks after the drain"

        outputs = llm.generate(PROMPTS, greedy(MAX_TOKENS), use_tqdm=False)
        # vLLM counts locally cached + external tokens; after the reset all of them came from the store.
        assert [output.num_cached_tokens for output in outputs] == EXPECTED_HIT_TOKENS
        second = [tuple(output.outputs[0].token_ids) for output in outputs]
        drain(llm)

        assert second == first, "greedy outputs changed after loading KV from the store"
        assert metric(scheduler, "deferdump_external_hit_tokens_total") == sum(EXPECTED_HIT_TOKENS)
        loads_per_request = layers if variant == "layerwise" else 1
        assert metric(worker, "deferdump_loads_completed_total") == len(PROMPTS) * loads_per_request
        assert metric(worker, "deferdump_load_error_blocks_total") == 0
        assert metric(worker, "deferdump_finished_sending_total") == len(PROMPTS)  # only first-run requests dumped
        guard.assert_each_freed_once(2 * len(PROMPTS))
        assert free_block_count(llm) == total_block_count(llm) - 1  # every block back, but the null block
        assert_drained_worker(worker)
    assert_shut_down(scheduler, worker)
    assert_drained_worker(worker)
    assert worker.core._async_dump_req_ids == set() and scheduler.core._async_dump_req_ids == set()

