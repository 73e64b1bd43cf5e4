"""Hybrid models (full attention + sliding window) on real tensors: per-group dumps, keys and loads, the
scheduler's record of vLLM's frees, and the fence in handle_preemptions that keeps a freed block from
being rewritten under a pending dump (and what #989 as merged does without it)."""
from __future__ import annotations

import pytest
import torch

from deferdump.reference import ConnectorConfig, DirectConnector, ManualStore, OuterConnector, Role
from deferdump.reference.testing.late_copy import LateCopyDevice
from deferdump.reference.errors import ConfigError
from deferdump.reference.groups import KVGroup, group_key, skipped_blocks
from deferdump.reference.hashing import prefix_block_hashes
from deferdump.reference.metadata import DeferDumpMetadata, RequestDispatchMeta
from deferdump.reference.views import CachedRequestView, NewRequestView, RequestView, StepView

BLOCK_SIZE = 4
WINDOW = 3  # below the block size: only the block holding the last computed token stays in the window
NUM_BLOCKS = 12
GROUPS = (KVGroup(("full.0",), None), KVGroup(("sw.0",), WINDOW))


def _caches() -> dict[str, torch.Tensor]:
    """Two layers, one per group (vLLM's CPU layout), every block filled with its own distinct bytes."""
    generator = torch.Generator().manual_seed(7)
    return {name: torch.randn(NUM_BLOCKS, 2, BLOCK_SIZE, 8, generator=generator) for name in ("full.0", "sw.0")}


def _pair(fence: str = "freed", store: ManualStore | None = None) -> tuple[DirectConnector, DirectConnector, ManualStore, dict[str, torch.Tensor]]:
    config = ConnectorConfig(block_size=BLOCK_SIZE, verify_dumps=True, hybrid_fence=fence)
    store = store if store is not None else ManualStore(auto_complete_on_wait=True)  # a wait drains, as a blocking one does
    scheduler = DirectConnector(config, Role.SCHEDULER, store=store, groups=GROUPS)
    worker = DirectConnector(config, Role.WORKER, store=store, device=LateCopyDevice(), groups=GROUPS)
    caches = _caches()
    worker.register_kv_caches(caches)
    return scheduler, worker, store, caches


def _view(req_id: str, tokens: int, base: int) -> RequestView:
    return RequestView(req_id, tuple(range(base, base + tokens)), tokens)


def _admit(scheduler: DirectConnector, view: RequestView) -> None:
    matched, _ = scheduler.get_num_new_matched_tokens(view, 0)
    scheduler.update_state_after_alloc(view, [], matched)


def _step(worker: DirectConnector, meta, write: dict[str, list[int]] | None = None, caches=None) -> None:
    """One worker step in vLLM's order: fence, forward (writes new KV into the given layers' blocks), save."""
    worker.handle_preemptions(meta)
    worker.bind_connector_metadata(meta)
    worker.start_load_kv()
    for layer, blocks in (write or {}).items():
        caches[layer][blocks] = torch.full_like(caches[layer][blocks], 99.0)  # the new token's KV
    worker.wait_for_save()
    worker.clear_connector_metadata()


def _window_scenario(fence: str):
    """r1 (2 prompt blocks) prefills in two chunks; at its first decode vLLM frees r1's first
    sliding-window block (b2) and gives it, in the same schedule, to r2, whose forward rewrites it."""
    scheduler, worker, store, caches = _pair(fence)
    r1, r2 = _view("r1", 2 * BLOCK_SIZE, 0), _view("r2", 2 * BLOCK_SIZE, 1000)
    _admit(scheduler, r1)
    original_b2 = caches["sw.0"][2].clone()
    m1 = scheduler.build_connector_meta(StepView(new_requests=(NewRequestView("r1", r1.token_ids, 8, (1,), 0, 4, ((2,),)),)))
    assert m1.request_meta["r1"].dump_group_block_ids == ((2,),) and m1.freed_block_ids == frozenset()
    _step(worker, m1)
    task1 = worker._pending_dump_tasks[0]
    assert task1.block_ids == (1, 2)  # one task reads the block of both groups
    m2 = scheduler.build_connector_meta(StepView(cached_requests=(CachedRequestView("r1", (3,), False, 4, 4, ((4,),)),)))
    assert m2.freed_block_ids == frozenset()  # 4 computed tokens: every one still in the window of the next
    _step(worker, m2)
    _admit(scheduler, r2)
    m3 = scheduler.build_connector_meta(StepView(
        new_requests=(NewRequestView("r2", r2.token_ids, 8, (5,), 0, 4, ((2,),)),),
        cached_requests=(CachedRequestView("r1", (), False, 8, 1, ((),)),),
    ))
    assert m3.freed_block_ids == frozenset({2})  # r1's first sliding-window block left the window
    _step(worker, m3, write={"sw.0": [2], "full.0": [5]}, caches=caches)
    return scheduler, worker, store, caches, task1, original_b2


def test_fence_waits_the_dump_reading_a_freed_block_before_the_forward_rewrites_it() -> None:
    _, worker, store, _, task1, original_b2 = _window_scenario("freed")
    assert task1.task in store.waited  # the fence waited it in handle_preemptions, before the forward
    assert task1 not in worker._pending_dump_tasks
    hashes = prefix_block_hashes(tuple(range(8)), BLOCK_SIZE)
    load = store.load([group_key(hashes[0], 1)])
    store.complete(load)
    assert torch.equal(store.wait(load)[0], original_b2.contiguous().view(torch.uint8).reshape(-1))
    worker.shutdown()
    assert worker.verify_mismatches == 0


def test_merged_behaviour_rewrites_a_freed_block_under_its_pending_dump() -> None:
    _, worker, store, _, task1, _ = _window_scenario("none")
    assert task1 in worker._pending_dump_tasks  # nothing waited it: no preemption, no finish
    worker.shutdown()  # the deferred copy reads b2 only now, after r2's forward rewrote it
    assert worker.verify_mismatches == 1


def test_coarse_fence_waits_every_pending_dump_whenever_a_block_was_freed() -> None:
    scheduler, worker, store, caches = _pair("all_on_free")

    meta = DeferDumpMetadata({"a": RequestDispatchMeta(dump_hashes=(b"a",), dump_block_ids=(1,), dump_group_block_ids=((2,),)),
                              "b": RequestDispatchMeta(dump_hashes=(b"b",), dump_block_ids=(3,), dump_group_block_ids=((4,),))})
    worker.bind_connector_metadata(meta)
    worker.wait_for_save()
    worker.clear_connector_metadata()
    assert len(worker._pending_dump_tasks) == 1
    worker.handle_preemptions(DeferDumpMetadata(freed_block_ids=frozenset({9})))  # read by no task
    assert worker._pending_dump_tasks == []  # over-waited: the fine fence would have kept it
    _, fine, _, _ = _pair("freed")
    fine.bind_connector_metadata(meta)
    fine.wait_for_save()
    fine.handle_preemptions(DeferDumpMetadata(freed_block_ids=frozenset({9})))
    assert len(fine._pending_dump_tasks) == 1
    fine.handle_preemptions(DeferDumpMetadata(freed_block_ids=frozenset({4})))
    assert fine._pending_dump_tasks == []


def test_finish_records_window_frees_and_the_undelayed_frees() -> None:
    scheduler, _, _, _ = _pair()
    r1 = _view("r1", 2 * BLOCK_SIZE, 0)
    _admit(scheduler, r1)
    scheduler.build_connector_meta(StepView(new_requests=(NewRequestView("r1", r1.token_ids, 8, (1, 3), 0, 8, ((2, 4),)),)))
    delay, params = scheduler.request_finished_all_groups(r1, ((1, 3), (0, 4)))  # b2 freed before the call
    assert (delay, params) == (True, None)  # tracked: the delayed free holds b1, b3, b4
    meta = scheduler.build_connector_meta(StepView(finished_req_ids=frozenset({"r1"})))
    assert meta.freed_block_ids == frozenset({2})
    r2 = _view("r2", 3, 500)  # shorter than a block: never dumped, never tracked, freed at once
    _admit(scheduler, r2)
    scheduler.build_connector_meta(StepView(new_requests=(NewRequestView("r2", r2.token_ids, 3, (6,), 0, 3, ((7,),)),)))
    assert scheduler.request_finished_all_groups(r2, ((6,), (7,))) == (False, None)


def test_preemption_frees_every_group_block_of_the_victim() -> None:
    scheduler, _, _, _ = _pair()
    r1 = _view("r1", 2 * BLOCK_SIZE, 0)
    _admit(scheduler, r1)
    scheduler.build_connector_meta(StepView(new_requests=(NewRequestView("r1", r1.token_ids, 8, (1,), 0, 4, ((2,),)),)))
    meta = scheduler.build_connector_meta(StepView(preempted_req_ids=frozenset({"r1"})))
    assert meta.freed_block_ids == frozenset({1, 2})


def test_per_group_loads_write_each_group_layer_from_its_own_keys() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    scheduler, worker, _, caches = _pair(store=store)
    r1 = _view("r1", 2 * BLOCK_SIZE + 1, 0)
    _admit(scheduler, r1)
    meta = scheduler.build_connector_meta(StepView(new_requests=(NewRequestView("r1", r1.token_ids, 9, (1, 3), 0, 8, ((2, 4),)),)))
    _step(worker, meta)
    worker._flush_pending_dump_tasks(None)
    dumped = {layer: caches[layer][[1, 3] if layer == "full.0" else [2, 4]].clone() for layer in caches}
    # the same prompt again: a whole-prompt store hit, loaded into fresh blocks of both groups
    again = _view("r2", 2 * BLOCK_SIZE + 1, 0)
    matched, _ = scheduler.get_num_new_matched_tokens(again, 0)
    assert matched == 2 * BLOCK_SIZE
    scheduler.update_state_after_alloc(again, [], matched)
    load_meta = scheduler.build_connector_meta(StepView(new_requests=(NewRequestView("r2", again.token_ids, 9, (5, 7, 9), 8, 1, ((6, 8, 10),)),)))
    assert load_meta.request_meta["r2"].load_group_block_ids == ((6, 8),)
    worker.bind_connector_metadata(load_meta)
    worker.start_load_kv()
    assert worker.get_block_ids_with_load_errors() == set()
    assert torch.equal(caches["full.0"][[5, 7]], dumped["full.0"])
    assert torch.equal(caches["sw.0"][[6, 8]], dumped["sw.0"])
    worker.shutdown()


def test_config_rejects_an_unknown_fence_and_hybrid_groups_outside_direct() -> None:
    with pytest.raises(ConfigError, match="hybrid_fence"):
        ConnectorConfig.from_extra_config({"hybrid_fence": "sometimes"})
    with pytest.raises(ConfigError, match="variant"):
        OuterConnector(ConnectorConfig(variant="layerwise", block_size=4), Role.SCHEDULER, store=ManualStore(), groups=GROUPS)
    assert ConnectorConfig().hybrid_fence == "freed"


def test_register_rejects_groups_whose_blocks_differ_in_size() -> None:
    worker = DirectConnector(ConnectorConfig(block_size=BLOCK_SIZE), Role.WORKER, store=ManualStore(),
                             device=LateCopyDevice(), groups=(KVGroup(("a",)), KVGroup(("b", "c"), WINDOW)))
    caches = {name: torch.zeros(NUM_BLOCKS, 2, BLOCK_SIZE, 8) for name in ("a", "b", "c")}
    with pytest.raises(ConfigError, match="differ in size"):
        worker.register_kv_caches(caches)


def test_skipped_blocks_follows_vllm_sliding_window_manager() -> None:
    # get_num_skipped_tokens(7) == 4 with window 4 (vLLM's docstring example): one block of 4 skipped
    assert skipped_blocks(7, 4, 4) == 1
    assert skipped_blocks(8, WINDOW, BLOCK_SIZE) == 1 and skipped_blocks(4, WINDOW, BLOCK_SIZE) == 0


def test_a_sliding_window_first_group_is_refused() -> None:
    """The first group keys the blocks and only the other groups' window frees are tracked: a core whose first
    (or only) group is sliding-window would dump blocks vLLM frees while the request runs, unfenced."""
    with pytest.raises(ConfigError, match="first KV-cache group must be full attention"):
        DirectConnector(ConnectorConfig(block_size=BLOCK_SIZE), Role.WORKER, store=ManualStore(),
                        groups=(KVGroup(("sw.0",), WINDOW),))
    with pytest.raises(ConfigError, match="first KV-cache group must be full attention"):
        DirectConnector(ConnectorConfig(block_size=BLOCK_SIZE), Role.SCHEDULER, store=ManualStore(),
                        groups=(KVGroup(("sw.0",), WINDOW), KVGroup(("full.0",), None)))
