"""The protocol core on real tensors and the ManualStore: UCM PR #989's worker and scheduler semantics."""
from __future__ import annotations

import inspect
import pickle

import pytest
import torch

from deferdump.reference import (
    ConnectorConfig,
    CPConnector,
    DeferDumpMetadata,
    DirectConnector,
    LayerWiseConnector,
    ManualStore,
    OuterConnector,
    RequestDispatchMeta,
    Role,
    RoleError,
)
from deferdump.reference.hashing import prefix_block_hashes
from deferdump.reference.metrics import ConnectorMetrics
from support.reference import (
    BLOCK_SIZE,
    cached_req,
    cpu_kv_caches,
    dump_meta,
    new_req,
    request,
    run_save_step,
    step,
    worker,
)


# ----------------------------------------------------------------------- ownership
def test_build_connector_meta_is_defined_only_in_direct_and_cp_resolves_it_by_mro() -> None:
    owners = [cls for cls in (DirectConnector, LayerWiseConnector, CPConnector) if "build_connector_meta" in vars(cls)]
    assert owners == [DirectConnector]
    assert CPConnector.__mro__[:3] == (CPConnector, LayerWiseConnector, DirectConnector)
    assert CPConnector.build_connector_meta is DirectConnector.build_connector_meta
    assert "bind_connector_metadata" in vars(CPConnector)
    assert {"save_kv_layer", "wait_for_save"} <= set(vars(LayerWiseConnector))


def test_outer_connector_forwards_every_method_of_the_call_surface() -> None:
    surface = [name for name, _ in inspect.getmembers(DirectConnector, inspect.isfunction) if not name.startswith("_")]
    missing = [name for name in surface if name not in vars(OuterConnector)]
    assert missing == []
    for name in ("request_finished", "request_finished_all_groups", "get_finished", "handle_preemptions", "shutdown"):
        assert name in vars(OuterConnector)


@pytest.mark.parametrize(
    ("variant", "cls"), [("direct", DirectConnector), ("layerwise", LayerWiseConnector), ("cp", CPConnector)]
)
def test_outer_connector_chooses_the_inner_class_from_config(variant: str, cls: type) -> None:
    outer = OuterConnector(ConnectorConfig(variant=variant, block_size=4), Role.SCHEDULER, store=ManualStore())
    assert type(outer.inner) is cls


def test_role_is_checked_and_coerced() -> None:
    store = ManualStore()
    scheduler = DirectConnector(ConnectorConfig(block_size=4), "scheduler", store=store)
    assert scheduler.role is Role.SCHEDULER and Role.coerce(1) is Role.WORKER
    with pytest.raises(RoleError):
        scheduler.wait_for_save()
    with pytest.raises(RoleError):
        worker(store).build_connector_meta(step())


# ------------------------------------------------------------------- scheduler side
def scheduler(store: ManualStore, **config: object) -> DirectConnector:
    return DirectConnector(ConnectorConfig(block_size=BLOCK_SIZE, **config), Role.SCHEDULER, store=store)


def test_chunked_prefill_dumps_each_full_prompt_block_exactly_once() -> None:
    store = ManualStore()
    sched = scheduler(store)
    req = request("r", 14)  # 3 full blocks + 2 tokens
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    sched.update_state_after_alloc(req, [7, 8], 0)
    chunks = [
        step(new=[new_req(req, [7, 8], 5)]),  # tokens 0..4: block 0 full
        step(cached=[cached_req("r", [9], 6, 5)]),  # tokens 5..10: block 1 full, block 2 not yet
        step(cached=[cached_req("r", [10], 3, 11)]),  # tokens 11..13: block 2 full, block 3 partial
        step(cached=[cached_req("r", [], 1, 14)]),  # decode: nothing
    ]
    slices = [sched.build_connector_meta(s).request_meta.get("r") for s in chunks]
    hashes = prefix_block_hashes(req.token_ids, BLOCK_SIZE)
    assert [m.dump_block_ids if m else () for m in slices] == [(7,), (8,), (9,), ()]
    assert [m.dump_hashes if m else () for m in slices] == [(hashes[0],), (hashes[1],), (hashes[2],), ()]
    assert sched._async_dump_req_ids == {"r"}
    assert sched.request_finished(req, [7, 8, 9, 10]) == (True, None)
    assert sched.request_finished(req, []) == (False, None)  # discarded at the first answer


def test_a_resumed_request_uses_the_resent_block_list_even_without_a_fresh_lookup() -> None:
    """vLLM re-looks-up a resumed request (a new plan); should it not, the stale block list must not
    be extended: a resumed request's blocks are all new, and its dump slice must name them."""
    sched = scheduler(ManualStore())
    req = request("r", 8)  # 2 full blocks
    sched.get_num_new_matched_tokens(req, 0)
    sched.update_state_after_alloc(req, [3], 0)
    first = sched.build_connector_meta(step(new=[new_req(req, [3], BLOCK_SIZE)])).request_meta["r"]
    assert first.dump_block_ids == (3,)
    resumed = sched.build_connector_meta(step(cached=[cached_req("r", [5, 6], BLOCK_SIZE, BLOCK_SIZE, resumed=True)]))
    assert resumed.request_meta["r"].dump_block_ids == (6,)  # block 1 of [5, 6]; an extended [3, 5, 6] gives 5
    assert sched._async_dump_req_ids == {"r"}


def test_store_hits_give_a_load_range_and_dumps_start_after_them() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    sched = scheduler(store)
    first = request("a", 12)
    sched.get_num_new_matched_tokens(first, 0)
    sched.update_state_after_alloc(first, [0, 1, 2], 0)
    meta = sched.build_connector_meta(step(new=[new_req(first, [0, 1, 2], 12)]))
    run_save_step(worker(store), meta)
    for task in store.pending_tasks():
        store.complete(task)
    second = request("b", 18)  # same first 12 tokens, then 6 more
    assert sched.get_num_new_matched_tokens(second, 0) == (12, False)
    sched.update_state_after_alloc(second, [5, 6, 7, 8, 9], 12)
    assert sched.metrics.value("deferdump_external_hit_tokens_total") == 12
    m = sched.build_connector_meta(step(new=[new_req(second, [5, 6, 7, 8, 9], 6, 12)])).request_meta["b"]
    hashes = prefix_block_hashes(second.token_ids, BLOCK_SIZE)
    assert (m.load_hashes, m.load_block_ids) == (tuple(hashes[:3]), (5, 6, 7))
    assert (m.dump_hashes, m.dump_block_ids) == ((hashes[3],), (8,))


def test_full_hit_recomputes_the_last_token_and_dumps_nothing() -> None:
    store = ManualStore()
    sched = scheduler(store)
    req = request("a", 8)
    for h in prefix_block_hashes(req.token_ids, BLOCK_SIZE):
        store._blocks[h] = torch.zeros(4, dtype=torch.uint8)
    assert sched.get_num_new_matched_tokens(req, 0) == (7, False)
    sched.update_state_after_alloc(req, [1, 2], 7)
    meta = sched.build_connector_meta(step(new=[new_req(req, [1, 2], 1, 7)]))
    assert meta.request_meta["a"].load_block_ids == (1, 2) and not meta.request_meta["a"].has_dump()
    assert sched.request_finished(req, [1, 2]) == (False, None)


def test_request_within_hbm_hit_or_shorter_than_a_block_is_never_tracked() -> None:
    sched = scheduler(ManualStore())
    short = request("s", 3)
    assert sched.get_num_new_matched_tokens(short, 0) == (0, False)
    cached = request("c", 8)
    assert sched.get_num_new_matched_tokens(cached, 8) == (0, False)
    meta = sched.build_connector_meta(step(new=[new_req(short, [1], 3), new_req(cached, [2, 3], 0, 8)]))
    assert meta.request_meta == {} and sched._async_dump_req_ids == set()


def test_lookup_failure_is_a_miss() -> None:
    store = ManualStore()
    store.lookup_prefix = lambda hashes: (_ for _ in ()).throw(RuntimeError("down"))  # type: ignore[method-assign]
    assert scheduler(store).get_num_new_matched_tokens(request("a", 8), 0) == (0, False)


def test_metadata_pickles() -> None:
    meta = DeferDumpMetadata({"a": RequestDispatchMeta((b"h",), (1,), (b"d",), (2,))}, frozenset({"p"}), {"a": 1})
    assert pickle.loads(pickle.dumps(meta)) == meta


# ---------------------------------------------------------------------- worker side
def test_wait_for_save_submits_one_task_per_step_without_waiting() -> None:
    store = ManualStore()  # waiting an unfinished task raises "would block"
    conn = worker(store)
    run_save_step(conn, dump_meta(("a", [1, 2]), ("b", [3])))
    assert len(store.submitted) == 1 and store.waited == []
    [pending] = conn._pending_dump_tasks
    assert pending.request_ids == {"a", "b"} and pending.block_ids == (1, 2, 3) and pending.event_handle != 0
    assert conn._async_dump_req_ids == {"a", "b"} and conn.events.live() == 1


def test_wait_for_save_reaps_finished_tasks_and_keeps_running_ones() -> None:
    store = ManualStore()
    conn = worker(store)
    run_save_step(conn, dump_meta(("a", [1])))
    run_save_step(conn, dump_meta(("b", [2])))
    first, second = store.submitted
    store.complete(first)
    run_save_step(conn, DeferDumpMetadata())
    assert store.waited == [first]
    assert [p.task for p in conn._pending_dump_tasks] == [second] and conn.events.live() == 1
    assert conn._async_dump_req_ids == {"a", "b"}  # polling never reports


def test_get_finished_waits_overlapping_tasks_and_reports_exactly_finished_and_tracked() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    conn = worker(store)
    run_save_step(conn, dump_meta(("a", [1]), ("b", [2])))
    run_save_step(conn, dump_meta(("c", [3])))
    ab, c = store.submitted
    assert conn.get_finished({"a", "untracked"}) == ({"a"}, None)
    assert store.waited == [ab]  # the whole task, though only "a" finished
    assert [p.task for p in conn._pending_dump_tasks] == [c] and conn.events.live() == 1
    assert conn.get_finished({"b"}) == ({"b"}, None)  # its task is gone: reported at once
    assert store.waited == [ab]
    assert conn.get_finished({"b"}) == (None, None)  # reported once
    assert conn.get_finished(set()) == (None, None)
    assert conn.reported_total == 2
    assert conn.metrics.value("deferdump_get_finished_wait_seconds_count") == 2


def test_wait_failure_drops_the_task_releases_the_handle_and_still_reports() -> None:
    store = ManualStore()
    conn = worker(store)
    run_save_step(conn, dump_meta(("a", [1])))
    store.fail(store.submitted[0])
    assert conn.get_finished({"a"}) == ({"a"}, None)
    assert conn._pending_dump_tasks == [] and conn.events.live() == 0 and conn.events.released == 1
    assert conn.wait_failures == 1
    assert conn.metrics.value("deferdump_dumps_failed_total", {"stage": "wait"}) == 1


def test_submit_failure_releases_the_handle_at_once_and_keeps_the_ids_tracked() -> None:
    store = ManualStore()
    store.submit_fail_next = 1
    conn = worker(store)
    run_save_step(conn, dump_meta(("a", [1, 2])))
    assert conn._pending_dump_tasks == [] and conn.events.live() == 0 and conn.events.acquired == 1
    assert conn._async_dump_req_ids == {"a"} and conn.submit_failures == 1
    assert conn.get_finished({"a"}) == ({"a"}, None)
    assert conn.metrics.value("deferdump_dumps_failed_total", {"stage": "submit"}) == 1


def test_submit_failure_at_the_device_read_leaves_no_task_and_releases_the_handle() -> None:
    """The read fails before any payload exists: nothing to settle, the handle still goes back at once."""
    store = ManualStore()
    conn = worker(store)
    conn.device.read_fail_next = 1
    run_save_step(conn, dump_meta(("a", [1, 2])))
    assert store.submitted == [] and conn._pending_dump_tasks == []
    assert conn.events.live() == 0 and conn.events.acquired == 1 and conn.events.released == 1
    assert conn._async_dump_req_ids == {"a"} and conn.submit_failures == 1
    run_save_step(conn, dump_meta(("a", [3])))  # the hook fired once: the next step submits
    assert len(store.submitted) == 1 and len(conn._pending_dump_tasks) == 1
    assert conn.get_finished({"a"}) == ({"a"}, None)


def test_submit_failure_stops_a_running_thread_pool_copy_before_returning() -> None:
    store = ManualStore()
    store.submit_fail_next = 1
    conn = worker(store, deferred=False)  # real CpuDevice thread pool
    run_save_step(conn, dump_meta(("a", [1, 2])))
    assert conn._pending_dump_tasks == [] and conn.events.live() == 0
    conn.shutdown()


def test_check_failure_keeps_the_task_for_a_later_wait() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    conn = worker(store)
    run_save_step(conn, dump_meta(("a", [1])))
    store.complete(store.submitted[0])
    store.check_fail = True
    run_save_step(conn, DeferDumpMetadata())
    assert len(conn._pending_dump_tasks) == 1 and store.waited == []
    store.check_fail = False
    assert conn.get_finished({"a"}) == ({"a"}, None) and store.waited == store.submitted


@pytest.mark.parametrize("as_set", [False, True])
def test_handle_preemptions_waits_only_tasks_of_preempted_requests(as_set: bool) -> None:
    store = ManualStore(auto_complete_on_wait=True)
    conn = worker(store)
    run_save_step(conn, dump_meta(("a", [1])))
    run_save_step(conn, dump_meta(("b", [2])))
    a_task, b_task = store.submitted
    conn.handle_preemptions({"b"} if as_set else dump_meta(preempted=["b"]))
    assert store.waited == [b_task] and [p.task for p in conn._pending_dump_tasks] == [a_task]
    assert conn._async_dump_req_ids == {"a", "b"}  # preempted ids stay tracked
    conn.handle_preemptions(DeferDumpMetadata())
    conn.handle_preemptions(None)
    assert store.waited == [b_task]
    assert conn.get_finished({"b"}) == ({"b"}, None)
    assert conn.metrics.value("deferdump_handle_preemptions_wait_seconds_count") == 1


def test_mla_rank_other_than_zero_tracks_and_reports_without_dumping() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    config = ConnectorConfig(block_size=BLOCK_SIZE, is_mla=True)
    rank0, rank1 = (worker(store, config=config, rank=r, world_size=2) for r in (0, 1))
    for conn in (rank0, rank1):
        run_save_step(conn, dump_meta(("a", [1])))
    assert len(store.submitted) == 1 and rank1._pending_dump_tasks == []
    assert rank1._async_dump_req_ids == {"a"}
    assert rank0.get_finished({"a"}) == rank1.get_finished({"a"}) == ({"a"}, None)


def test_tp_ranks_store_their_shards_under_distinct_keys() -> None:
    store = ManualStore()
    rank0, rank1 = (worker(store, rank=r, world_size=2) for r in (0, 1))
    for conn in (rank0, rank1):
        run_save_step(conn, dump_meta(("a", [1])))
    keys0, keys1 = (t.block_hashes for t in store.submitted)
    assert keys0 == (b"a:1",) and keys1 != keys0


def test_shutdown_drains_every_task_and_releases_every_handle() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    conn = worker(store)
    for i in range(3):
        run_save_step(conn, dump_meta((f"r{i}", [i])))
    store.fail(store.submitted[1])
    conn.shutdown()
    assert conn._pending_dump_tasks == [] and conn.events.live() == 0
    assert conn.events.released == conn.events.acquired == 3 and store.outstanding_tasks() == []
    assert conn.metrics.value("deferdump_pending_dump_tasks") == 0
    assert conn.metrics.value("deferdump_live_event_handles") == 0


def test_event_sync_off_synchronizes_and_uses_handle_zero() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    conn = worker(store, config=ConnectorConfig(block_size=BLOCK_SIZE, enable_event_sync=False))
    run_save_step(conn, dump_meta(("a", [1])))
    assert conn._pending_dump_tasks[0].event_handle == 0 and conn.events.acquired == 0
    assert conn.get_finished({"a"}) == ({"a"}, None)


def test_dump_then_load_round_trips_real_blocks_byte_for_byte() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    config = ConnectorConfig(block_size=BLOCK_SIZE)
    source = cpu_kv_caches(seed=1)
    dumper = worker(store, config=config, kv_caches=source, deferred=False)
    sched = scheduler(store)
    req = request("a", 12)
    sched.get_num_new_matched_tokens(req, 0)
    sched.update_state_after_alloc(req, [3, 5, 9], 0)
    run_save_step(dumper, sched.build_connector_meta(step(new=[new_req(req, [3, 5, 9], 12)])))
    assert dumper.get_finished({"a"}) == ({"a"}, None)

    target = {name: torch.zeros_like(t) for name, t in source.items()}
    loader = worker(store, config=config, kv_caches=target, deferred=False)
    again = request("b", 13)
    assert sched.get_num_new_matched_tokens(again, 0) == (12, False)
    sched.update_state_after_alloc(again, [0, 1, 2, 4], 12)
    run_save_step(loader, sched.build_connector_meta(step(new=[new_req(again, [0, 1, 2, 4], 1, 12)])))
    assert loader.get_block_ids_with_load_errors() == set()
    for name in source:
        assert torch.equal(target[name][[0, 1, 2]], source[name][[3, 5, 9]])
        assert torch.count_nonzero(target[name][4]) == 0
    assert loader.metrics.value("deferdump_loads_completed_total") == 1


def test_failed_load_reports_every_block_once_and_writes_nothing() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    target = {name: torch.zeros_like(t) for name, t in cpu_kv_caches().items()}
    conn = worker(store, kv_caches=target)
    meta = DeferDumpMetadata({"a": RequestDispatchMeta(load_hashes=(b"missing", b"x"), load_block_ids=(4, 5))})
    run_save_step(conn, meta)
    assert conn.get_block_ids_with_load_errors() == {4, 5}
    assert conn.get_block_ids_with_load_errors() == set()
    assert all(torch.count_nonzero(t) == 0 for t in target.values())


def test_verify_dumps_counts_a_block_rewritten_before_its_dump_read_it() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    caches = cpu_kv_caches()
    conn = worker(store, config=ConnectorConfig(block_size=BLOCK_SIZE, verify_dumps=True), kv_caches=caches)
    run_save_step(conn, dump_meta(("a", [1, 2])))
    caches["layer.0"][2].fill_(7.0)  # rewritten while the (deferred) copy has not read it
    conn.get_finished({"a"})
    assert conn.verify_mismatches == 1
    assert conn.metrics.value("deferdump_verify_mismatches_total") == 1
    run_save_step(conn, dump_meta(("b", [3])))
    conn.get_finished({"b"})
    assert conn.verify_mismatches == 1


# ------------------------------------------------------------------ layer-wise and CP
def test_layerwise_submits_one_task_per_layer_once_and_waits_none_in_wait_for_save() -> None:
    store = ManualStore()
    conn = worker(store, cls=LayerWiseConnector)
    conn.bind_connector_metadata(dump_meta(("a", [1, 2])))
    for layer in ("layer.0", "layer.1", "layer.1"):  # a revisited layer dumps once
        conn.save_kv_layer(layer)
    conn.wait_for_save()
    conn.clear_connector_metadata()
    assert len(store.submitted) == 2 and store.waited == []
    assert [p.layer_name for p in conn._pending_dump_tasks] == ["layer.0", "layer.1"]
    assert conn.events.live() == 2 and conn._async_dump_req_ids == {"a"}
    store.auto_complete_on_wait = True
    assert conn.get_finished({"a"}) is not None and store.outstanding_tasks() == conn._pending_dump_tasks == []
    assert conn.events.live() == 0


def test_layerwise_round_trip_through_per_layer_keys() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    config = ConnectorConfig(variant="layerwise", block_size=BLOCK_SIZE)
    sched = OuterConnector(config, Role.SCHEDULER, store=store)
    source = cpu_kv_caches(seed=3)
    dumper = worker(store, cls=LayerWiseConnector, config=config, kv_caches=source)
    req = request("a", 8)
    sched.get_num_new_matched_tokens(req, 0)
    sched.update_state_after_alloc(req, [6, 7], 0)
    run_save_step(dumper, sched.build_connector_meta(step(new=[new_req(req, [6, 7], 8)])), layers=list(source))
    dumper.get_finished({"a"})
    target = {name: torch.zeros_like(t) for name, t in source.items()}
    loader = worker(store, cls=LayerWiseConnector, config=config, kv_caches=target)
    again = request("b", 9)
    assert sched.get_num_new_matched_tokens(again, 0) == (8, False)
    sched.update_state_after_alloc(again, [1, 2, 3], 8)
    run_save_step(loader, sched.build_connector_meta(step(new=[new_req(again, [1, 2, 3], 1, 8)])), layers=list(source))
    for name in source:
        assert torch.equal(target[name][[1, 2]], source[name][[6, 7]])


@pytest.mark.parametrize("use_layerwise", [False, True])
def test_cp_ranks_slice_hashes_and_every_rank_tracks_and_reports(use_layerwise: bool) -> None:
    store = ManualStore(auto_complete_on_wait=True)
    config = ConnectorConfig(variant="cp", cp_world_size=2, use_layerwise=use_layerwise, block_size=BLOCK_SIZE)
    sched = OuterConnector(config, Role.SCHEDULER, store=store)
    req = request("a", 8)
    sched.get_num_new_matched_tokens(req, 0)
    sched.update_state_after_alloc(req, [1, 2], 0)
    meta = sched.build_connector_meta(step(new=[new_req(req, [1, 2], 8)]))
    assert len(meta.request_meta["a"].dump_hashes) == 4 and sched._async_dump_req_ids == {"a"}
    ranks = [worker(store, cls=CPConnector, config=config, rank=r, world_size=2) for r in (0, 1)]
    for conn in ranks:
        run_save_step(conn, meta, layers=["layer.0", "layer.1"])
    per_rank = [{k for p in conn._pending_dump_tasks for k in p.task.block_hashes} for conn in ranks]
    assert per_rank[0].isdisjoint(per_rank[1]) and all(len(keys) == (4 if use_layerwise else 2) for keys in per_rank)
    assert [conn.get_finished({"a"}) for conn in ranks] == [({"a"}, None)] * 2
    assert sched.request_finished(req, [1, 2]) == (True, None)
    for task in store.pending_tasks():
        store.complete(task)
    assert sched.get_num_new_matched_tokens(request("b", 8), 0) == (7, False)


def test_outer_connector_owns_the_store_it_makes_and_shutdown_is_idempotent() -> None:
    outer = OuterConnector(ConnectorConfig(block_size=BLOCK_SIZE, capacity_blocks=8), Role.WORKER)
    outer.register_kv_caches(cpu_kv_caches())
    outer.bind_connector_metadata(dump_meta(("a", [1])))
    outer.wait_for_save()
    outer.clear_connector_metadata()
    assert outer.has_connector_metadata() is False
    assert outer.get_finished({"a"}) == ({"a"}, None)
    outer.shutdown()
    outer.shutdown()
    assert outer._pending_dump_tasks == [] and outer.events.live() == 0


def test_each_connector_has_its_own_metrics_registry() -> None:
    a, b = ConnectorMetrics(), ConnectorMetrics()
    a.dumps_submitted.inc()
    assert (a.value("deferdump_dumps_submitted_total"), b.value("deferdump_dumps_submitted_total")) == (1, 0)
