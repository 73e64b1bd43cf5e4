"""The simulated engine on a hybrid model (full attention + sliding window), as vLLM 0.32 runs one with a
`SupportsHMA` connector: blocks that leave the window are freed while their request runs and handed out
again at once, per-group block tables reach the connector, `request_finished_all_groups` gets one table
per group; and the engine catches the overwrite a deferred dump suffers without the fence."""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from deferdump.reference.groups import NULL_BLOCK
from deferdump.reference.testing.late_copy import LateCopyDevice
from deferdump.reference.testing.manual_store import ManualStore
from deferdump.tools.engine.forward import ModelShape
from deferdump.tools.engine.moves import ScriptedMoves
from deferdump.tools.engine.scheduler import BlockPool, SimulationError, WorkloadConfig
from deferdump.tools.engine.steploop import LoopConfig, StepLoop
from support.statemachine import TOKEN_VOCAB, Deployment, prompt_of, engine_violations as _violations


def _engine(fence: str = "freed", window: int = 1, world_size: int = 1) -> tuple[StepLoop, ManualStore]:
    store = ManualStore(auto_complete_on_wait=True)
    config = Deployment(sliding_window=window, hybrid_fence=fence, world_size=world_size, num_blocks=14).loop_config()
    engine = StepLoop(config, store, device_factory=lambda rank: LateCopyDevice(), moves=ScriptedMoves(TOKEN_VOCAB))
    return engine, store


def _complete_all(store: ManualStore) -> None:
    for task in store.pending_tasks():
        store.complete(task)


def test_blocks_leave_the_window_while_running_and_are_reused_at_once() -> None:
    """Block size 2, window 1 token: the 6 prompt tokens computed in step 1 (3 blocks per group, dumped at
    its end) are all out of the window at step 2's schedule; the sliding-window blocks are freed (positions
    nulled), and the next block handed out is the last one freed: to the same request's new position."""
    engine, _ = _engine()
    metas: list[Any] = []
    build = engine.scheduler_connector.build_connector_meta  # type: ignore[union-attr]
    engine.scheduler.connector.build_connector_meta = lambda step: metas.append(build(step)) or metas[-1]  # type: ignore[union-attr,method-assign]
    request = engine.scheduler.add_request(prompt_of(0, 8), 3)
    engine.step()
    full, window = list(request.blocks), list(request.sw_blocks)
    assert len(full) == len(window) == 3 and NULL_BLOCK not in full + window
    assert metas[0].request_meta[request.req_id].dump_group_block_ids == (tuple(window),)
    engine.step()
    assert request.sw_blocks[:3] == [NULL_BLOCK] * 3 and request.blocks[:3] == full
    assert request.sw_blocks[3] == window[2]  # the last freed is the first handed out, to the same request
    assert metas[1].freed_block_ids == frozenset(window)
    assert engine.scheduler.window_freed_total == 3
    assert _violations(engine) == []
    engine.drain_and_shutdown()
    assert _violations(engine) == []


def test_the_finish_path_frees_the_window_before_request_finished_all_groups() -> None:
    engine, _ = _engine()
    calls: list[tuple[tuple[int, ...], ...]] = []
    connector = engine.scheduler_connector
    assert connector is not None
    original = connector.request_finished_all_groups

    def spy(request: Any, block_ids: tuple[tuple[int, ...], ...]) -> tuple[bool, Any]:
        calls.append(block_ids)
        return original(request, block_ids)

    connector.request_finished_all_groups = spy  # type: ignore[method-assign]
    request = engine.scheduler.add_request(prompt_of(1, 6), 1)
    engine.step()  # 6 tokens computed, one sampled: finished
    assert len(calls) == 1
    full, window = calls[0]
    assert len(full) == len(window) == 3  # clipped to the computed tokens
    assert window == (NULL_BLOCK,) * 3 and NULL_BLOCK not in full  # window 1: all out of it at finish
    assert engine.scheduler.finish_window_freed_total == 3
    assert request.req_id in engine.scheduler.requests  # held: its dump slice is still pending
    engine.drain_and_shutdown()
    assert _violations(engine) == []


@pytest.mark.parametrize("fence", ["freed", "all_on_free"])
def test_a_fence_keeps_every_dumped_byte_right(fence: str) -> None:
    engine, store = _engine(fence)
    engine.scheduler.add_request(prompt_of(0, 8), 3)
    for _ in range(4):
        engine.step()
    _complete_all(store)
    assert _violations(engine) == []
    engine.drain_and_shutdown()
    assert _violations(engine) == []


def test_without_the_fence_the_engine_catches_the_overwrite_and_the_wrong_bytes() -> None:
    """UCM #989 as merged (`hybrid_fence="none"`): step 2's forward writes the freed sliding-window blocks
    while step 1's deferred dump still reads them; the late-copy device then hands the store the new bytes."""
    engine, store = _engine("none")
    engine.scheduler.add_request(prompt_of(0, 8), 3)
    engine.step()
    assert _violations(engine) == []
    engine.step()
    found = _violations(engine)
    assert found and all(line.startswith("NoOverwriteWhileDumpingInv: rank 0 writes block") for line in found)
    _complete_all(store)
    assert any(line.startswith("StoredBytes (Python-only)") for line in _violations(engine))


def test_the_coarse_fence_waits_tasks_that_read_no_freed_block() -> None:
    """"all_on_free" waits every pending task whenever a block was freed: here the second request's
    one-block dump, still pending when the first request's second block leaves the window (window 3): an
    over-wait `PreemptWaitsOnlyPreemptedInv` reports (the spec's SlidingWindowDrainOverWaits). "freed"
    waits only the tasks that read a freed block."""
    for fence, expected in (("all_on_free", True), ("freed", False)):
        engine, _ = _engine(fence, window=3)
        engine.scheduler.add_request(prompt_of(0, 4), 3)  # 2 blocks; at 4 computed: (4 - 3 + 1) // 2 = 1 leaves
        engine.step()
        engine.step()  # 4 tokens computed: block 0 of the first request leaves the window (its dump is waited)
        engine.scheduler.add_request(prompt_of(1, 2), 3)  # 1 block dumped now, read by a task of its own
        engine.step()
        engine.step()  # 6 computed: the first request's block 1 leaves the window
        found = _violations(engine)
        assert any(line.startswith("PreemptWaitsOnlyPreemptedInv") for line in found) is expected, (fence, found)
        assert not any(line.startswith(("NoOverwrite", "StoredBytes", "NoFreeUnderRead")) for line in found)


def _engine_with_a_stored_prompt() -> tuple[Any, Any, Any]:
    """A window-3 engine whose store holds a 9-token prompt (run to completion, every dump finished)."""
    engine, store = _engine(window=3)
    prompt = prompt_of(2, 9)
    engine.scheduler.add_request(prompt, 1)
    for _ in range(6):
        engine.step()
        _complete_all(store)
    return engine, store, prompt


def test_a_store_hit_loads_both_groups_and_the_window_starts_with_null_blocks() -> None:
    engine, store, prompt = _engine_with_a_stored_prompt()
    assert not engine.scheduler.requests and _violations(engine) == []
    request = engine.scheduler.add_request(prompt, 2)
    metas: list[Any] = []
    build = engine.scheduler_connector.build_connector_meta  # type: ignore[union-attr]
    engine.scheduler.connector.build_connector_meta = lambda step: metas.append(build(step)) or metas[-1]  # type: ignore[union-attr,method-assign]
    engine.step()
    # 8 of 9 tokens are in the store (4 full blocks); (8 - 3 + 1) // 2 = 3 positions are out of the window
    assert request.sw_blocks[:3] == [NULL_BLOCK] * 3
    load = metas[0].request_meta[request.req_id]
    assert len(load.load_block_ids) == 4 and load.load_group_block_ids == ((NULL_BLOCK,) * 3 + (request.sw_blocks[3],),)
    assert _violations(engine) == []  # LoadedBytes compared both groups' loaded blocks with the prompt
    engine.drain_and_shutdown()
    assert _violations(engine) == []


def test_a_failed_load_under_two_groups_is_the_engine_crash_vllm_has() -> None:
    """A finding, pinned: vLLM 0.32 refuses block-level load errors when the model has several KV-cache
    groups (`scheduler.py` 3365-3374 raises RuntimeError), but the connector reports its failed loads
    that way (`get_block_ids_with_load_errors`), so one failed store load kills a hybrid model's engine."""
    engine, store, prompt = _engine_with_a_stored_prompt()
    engine.scheduler.add_request(prompt, 2)
    store.submit_fail_next = 1  # the step's first submit is the hit's load
    engine.step()
    assert any(line.startswith("HybridLoadErrors (Python-only)") for line in _violations(engine))


def test_the_null_block_is_never_handed_out() -> None:
    assert 0 in (BlockPool(3).allocate(3) or [])
    hybrid = BlockPool(3, reserve_null=True)
    assert hybrid.num_usable == 2 and sorted(hybrid.allocate(2) or []) == [1, 2] and hybrid.allocate(1) is None
    with pytest.raises(SimulationError, match="null block"):
        hybrid.free([NULL_BLOCK])


def test_shutdown_leaves_no_block_behind() -> None:
    engine, store = _engine(window=2, world_size=2)
    for base in range(3):
        engine.scheduler.add_request(prompt_of(base, 7 + base), 3)
    for _ in range(5):
        engine.step()
    _complete_all(store)
    report = engine.drain_and_shutdown()
    assert report.leaked_blocks == 0 and report.pending_tasks == 0 and report.held_requests == 0
    assert _violations(engine) == []
    assert engine.scheduler.window_freed_total > 0


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"sliding_window": 0}, "sliding_window must be a positive"),
        ({"sliding_window": True}, "sliding_window must be a positive"),
        ({"sliding_window": 2, "num_blocks": 4}, "cannot hold one request"),
    ],
)
def test_bad_sliding_window_is_refused(change: dict[str, Any], fragment: str) -> None:
    values = {"block_size": 2, "num_blocks": 32, "prompt_tokens": (1, 4), "output_tokens": (1, 2)} | change
    with pytest.raises(ValueError, match=fragment):
        WorkloadConfig(**values)


def test_a_hybrid_loop_needs_even_layers_and_variant_direct() -> None:
    base = Deployment(sliding_window=2, num_blocks=14)
    config = base.loop_config()
    with pytest.raises(ValueError, match="even number of layers"):
        LoopConfig(config.workload, dataclasses.replace(config.shape, layers=3), config.connector)
    with pytest.raises(ValueError, match="variant 'direct'"):
        LoopConfig(config.workload, config.shape, dataclasses.replace(config.connector, variant="layerwise"))
