"""[multi] vLLM's MultiConnector with two deferdump children on separate stores, both delaying frees.

MultiConnector counts the children that returned True from `request_finished` (non-HMA path: the
children are not `SupportsHMA`); with two, `_extra_async_saves[req] = 1` rides to the worker and the
request's id is reported once, by the slower child. Every request must be freed exactly once (a second
report would trip the scheduler's assertion) and both stores must hold the dumped blocks.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_harness import (
    TINY_LLAMA_CONFIG,
    FreeGuard,
    assert_drained_worker,
    assert_shut_down,
    deferdump_connectors,
    generate_and_drain,
    metric,
    multi_transfer_config,
    running_llm,
    scheduler_connector,
    token_prompts,
    worker_connector,
)

PROMPTS = token_prompts(4, 80, seed=31)  # 2 full blocks each
FULL_BLOCKS = 2 * len(PROMPTS)
MAX_TOKENS = 8


def _record_async_saves(multi: Any) -> dict[str, tuple[bool, int]]:
    """Wrap MultiConnector's finish (behind both request_finished and, its children being SupportsHMA,
    request_finished_all_groups): (delay the free?, extra async saves it recorded) per request."""
    original = multi._aggregate_request_finished
    seen: dict[str, tuple[bool, int]] = {}

    def recording(request: Any, per_connector_fn: Any) -> tuple[bool, Any]:
        delay, params = original(request, per_connector_fn)
        seen[request.request_id] = (delay, multi._extra_async_saves.get(request.request_id, 0))
        return delay, params

    multi._aggregate_request_finished = recording
    return seen


def test_multi_two_children_count_two_async_saves(tiny_model: Path, store_dir: Path) -> None:
    children = (
        {"store": "file", "store_path": str(store_dir / "child-a"), "verify_dumps": True},
        {"store": "file", "store_path": str(store_dir / "child-b"), "variant": "layerwise", "verify_dumps": True},
    )
    with running_llm(tiny_model, multi_transfer_config(*children)) as llm:
        multi = scheduler_connector(llm)
        assert type(multi).__name__ == "MultiConnector"
        schedulers = deferdump_connectors(multi)
        workers = deferdump_connectors(worker_connector())
        assert len(schedulers) == len(workers) == 2
        assert workers[0].store is not workers[1].store
        guard = FreeGuard(llm, workers)
        async_saves = _record_async_saves(multi)

        outputs = generate_and_drain(llm, PROMPTS, MAX_TOKENS)

        assert all(len(tokens) == MAX_TOKENS for tokens in outputs)
        # Both children delayed every request: MultiConnector counted 2 saves = 1 beyond the first.
        assert len(async_saves) == len(PROMPTS)
        assert all(entry == (True, 1) for entry in async_saves.values()), async_saves
        assert multi._extra_async_saves == {}  # moved into the metadata for the worker
        guard.assert_each_freed_once(len(PROMPTS))
        for worker in workers:  # each child reported every request once; MultiConnector forwarded one report
            assert metric(worker, "deferdump_finished_sending_total") == len(PROMPTS)
            assert_drained_worker(worker)
        layers = TINY_LLAMA_CONFIG["num_hidden_layers"]
        for worker, child, blocks in zip(workers, ("child-a", "child-b"), (FULL_BLOCKS, FULL_BLOCKS * layers)):
            assert worker.store.stats().blocks == blocks  # the layer-wise child keys every layer's slice
            assert len(list((store_dir / child).rglob("*.blk"))) == blocks  # and the files are on disk
    assert_shut_down(*schedulers, *workers)
    for worker in workers:
        assert_drained_worker(worker)
