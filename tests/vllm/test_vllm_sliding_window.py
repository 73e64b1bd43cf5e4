"""A hybrid model (sliding window + full attention) in real vLLM: window frees while requests run.

With the connector's `SupportsHMA`, vLLM keeps its hybrid KV-cache manager on (two KV-cache groups) and
frees a running request's sliding-window blocks once they leave the window, at the front of the free
queue: the next allocation hands them out again and its forward rewrites them. Dump copies are held
until the connector next waits for dumps (`HOLD_COPIES`: the hold-mode `LateCopyDevice`), so a dump that
is not waited before that forward reads the new bytes. With the fence (`hybrid_fence` "freed", the default) every dump is byte-identical to
its blocks at submit and the outputs equal a run without the connector; with #989 as merged ("none") the
`verify_dumps` guard counts the rewritten blocks — the sliding-window bug, in vLLM itself.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from deferdump.reference.connectors import DirectConnector
from vllm_harness import (
    HOLD_COPIES,
    deferdump_connectors,
    deferdump_transfer_config,
    engine_core,
    generate_and_drain,
    held_copies,
    metric,
    running_llm,
    scheduler_connector,
    token_prompts,
    worker_connector,
)

NUM_BLOCKS = 41  # 40 usable, two groups: requests queue and freed blocks are handed out again at once
PROMPTS = token_prompts(8, 70, seed=15)  # 2 full blocks each (dumped), decoding past a third block
MAX_TOKENS = 40


class SubmitSnapshots:
    """The bytes of every block a hybrid dump reads, copied on the connector's thread at submit."""

    def __init__(self) -> None:
        self.rows: dict[bytes, torch.Tensor] = {}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "SubmitSnapshots":
        original = DirectConnector._submit_group_dump

        def snapshotting(connector: DirectConnector, rows: Any, req_ids: Any) -> None:
            device = connector.device
            assert device is not None
            for group, keys, ids in rows:
                data = device._gather(list(ids), device.layout.select(connector._group_layers(group)))
                self.rows.update(zip(keys, data.clone()))
            original(connector, rows, req_ids)

        monkeypatch.setattr(DirectConnector, "_submit_group_dump", snapshotting)
        return self


def _freed_sets(connector: Any) -> list[frozenset[int]]:
    """Wrap the scheduler-side core's build_connector_meta: the freed set of every metadata it ships."""
    core = connector.core
    original = core.build_connector_meta
    freed: list[frozenset[int]] = []

    def recording(step: Any) -> Any:
        meta = original(step)
        freed.append(meta.freed_block_ids)
        return meta

    core.build_connector_meta = recording
    return freed


def _assert_hybrid_manager_on(llm: Any) -> None:
    """Otherwise the same config silently runs as one full-attention group, with no early frees."""
    assert llm.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is False
    groups = engine_core(llm).scheduler.kv_cache_config.kv_cache_groups
    assert len(groups) == 2, groups
    assert {type(group.kv_cache_spec).__name__ for group in groups} == {"SlidingWindowSpec", "FullAttentionSpec"}


def _run(model: Path, fence: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    extra = {"store": "memory", "verify_dumps": True, "hybrid_fence": fence, **HOLD_COPIES}
    snapshots = SubmitSnapshots().install(monkeypatch)
    with running_llm(model, deferdump_transfer_config(extra), num_gpu_blocks_override=NUM_BLOCKS) as llm:
        _assert_hybrid_manager_on(llm)
        [worker] = deferdump_connectors(worker_connector())
        [scheduler] = deferdump_connectors(scheduler_connector(llm))
        held = held_copies(worker)
        assert len(worker.core.inner.groups) == 2 and worker.core.inner.hybrid
        freed = _freed_sets(scheduler)
        outputs = generate_and_drain(llm, PROMPTS, MAX_TOKENS)
        stored = {key: worker.store.wait(worker.store.load([key]))[0] for key in snapshots.rows}
        return {
            "outputs": outputs,
            "mismatches": metric(worker, "deferdump_verify_mismatches_total"),
            "dumps": metric(worker, "deferdump_dumps_completed_total"),
            "freed": freed,
            "differing": sorted(key.hex()[:8] for key, row in snapshots.rows.items() if not torch.equal(stored[key], row)),
            "snapshots": len(snapshots.rows),
            "held": held,
        }


def test_sliding_window_fenced_dumps_are_exact(tiny_hybrid_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(tiny_hybrid_model, "freed", monkeypatch)
    assert sum(len(f) for f in run["freed"]) > 0, "no block was freed while requests ran: nothing was tested"
    # 2 full prompt blocks x 2 groups each; a request resumed after a preemption dumps its outputs' full block too
    assert run["dumps"] > 0 and run["snapshots"] >= 2 * 2 * len(PROMPTS)
    assert run["mismatches"] == 0
    assert run["differing"] == []  # every stored block is byte for byte what it held at submit
    assert run["held"].held > 0 and run["held"].timeouts == 0
    monkeypatch.undo()
    with running_llm(tiny_hybrid_model, None) as llm:  # the same model without a connector
        plain = generate_and_drain(llm, PROMPTS, MAX_TOKENS)
    assert run["outputs"] == plain


@pytest.mark.trace_rejected("wait_for_save", "NoOverwriteWhileDumpingInv violated")
def test_sliding_window_as_merged_counts_rewritten_blocks(tiny_hybrid_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(tiny_hybrid_model, "none", monkeypatch)
    assert sum(len(f) for f in run["freed"]) > 0
    assert run["mismatches"] > 0, "no freed block was rewritten under its pending dump"
    assert run["differing"], "the store holds only exact blocks"
    assert run["held"].held > 0


def test_every_layer_sliding_frees_running_blocks_even_without_supports_hma(tiny_sliding_model: Path,
                                                                             tmp_path: Path) -> None:
    """The fact behind the model's sliding-window case on the non-HMA path (and `deferdump mro`'s window case
    for connectors that are not `SupportsHMA`): vLLM turns its hybrid manager off for such a connector, but a
    model whose every layer is sliding-window is not promoted to full attention (kv_cache_utils.py ~1690-1703,
    only beside full-attention layers), so its one KV-cache group is a SlidingWindowSpec group and blocks of
    running requests are freed as they leave the window, exactly as in a hybrid model."""
    example = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
               "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "store")}}
    with running_llm(tiny_sliding_model, example, num_gpu_blocks_override=NUM_BLOCKS) as llm:
        assert llm.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is True
        scheduler = engine_core(llm).scheduler
        groups = scheduler.kv_cache_config.kv_cache_groups
        assert [type(group.kv_cache_spec).__name__ for group in groups] == ["SlidingWindowSpec"]
        [manager] = scheduler.kv_cache_manager.coordinator.single_type_managers
        pool = scheduler.kv_cache_manager.block_pool
        frees: list[list[int]] = []
        free_blocks, skip = pool.free_blocks, manager.remove_skipped_blocks
        window_frees: list[tuple[str, int]] = []

        def recording_free(blocks: Any, *args: Any, **kwargs: Any) -> Any:
            blocks = list(blocks)
            frees.append([block.block_id for block in blocks])
            return free_blocks(blocks, *args, **kwargs)

        def recording_skip(request_id: str, *args: Any, **kwargs: Any) -> Any:
            before = len(frees)
            result = skip(request_id, *args, **kwargs)
            running = {request.request_id for request in scheduler.running}
            window_frees.extend((request_id, block) for ids in frees[before:] for block in ids
                                if request_id in running)
            return result

        pool.free_blocks, manager.remove_skipped_blocks = recording_free, recording_skip
        generate_and_drain(llm, PROMPTS, MAX_TOKENS)
    assert len({request for request, _ in window_frees}) == len(PROMPTS), window_frees


def test_the_reference_connector_refuses_a_model_whose_every_layer_is_sliding(tiny_sliding_model: Path) -> None:
    """Its fence tracks window frees only in a sliding-window group beside a full-attention one: on a single
    sliding-window group its dumps would be rewritten under it (measured before this check: 8 of 8 blocks of
    a dump changed after submit), so it stops at start with one clear error instead."""
    with pytest.raises(ValueError, match="only KV-cache group is SlidingWindowSpec: its blocks may be freed "
                                         "while a request runs"):
        with running_llm(tiny_sliding_model, deferdump_transfer_config({"store": "memory"})):
            pass
