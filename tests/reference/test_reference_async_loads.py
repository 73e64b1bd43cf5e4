"""Asynchronous loads (`load_async`): the scheduler parks and sends the load, the worker runs it on the store's
tasks beside the forward and reports it in finished_recving once its blocks are written; failures, aborts
during a load, a request with a dump and a load at once, and the TEST-ONLY broken mode of real bug P8."""
from __future__ import annotations

import pytest
import torch

from deferdump.reference import ConnectorConfig, DeferDumpMetadata, DirectConnector, ManualStore, RequestDispatchMeta, Role
from deferdump.reference.errors import ConfigError
from deferdump.reference.groups import KVGroup, group_key
from deferdump.reference.hashing import prefix_block_hashes
from support.reference import BLOCK_SIZE, cached_req, cpu_kv_caches, new_req, request, run_save_step, step, worker

ASYNC = ConnectorConfig(block_size=BLOCK_SIZE, load_async=True)


def _scheduler(store: ManualStore, config: ConnectorConfig = ASYNC) -> DirectConnector:
    return DirectConnector(config, Role.SCHEDULER, store=store)


def _warm_store(tokens: int, seed: int = 1) -> tuple[ManualStore, dict[str, torch.Tensor], list[int]]:
    """A store holding the first full blocks of `request("a", tokens)` as dumped from blocks 3, 5, 9."""
    store = ManualStore(auto_complete_on_wait=True)
    source = cpu_kv_caches(seed=seed)
    dumper = worker(store, kv_caches=source, deferred=False)
    sched = _scheduler(store, ConnectorConfig(block_size=BLOCK_SIZE))
    req = request("a", tokens)
    sched.get_num_new_matched_tokens(req, 0)
    sched.update_state_after_alloc(req, [3, 5, 9], 0)
    run_save_step(dumper, sched.build_connector_meta(step(new=[new_req(req, [3, 5, 9], tokens)])))
    assert dumper.get_finished({"a"}) == ({"a"}, None)
    return store, source, [3, 5, 9]


def _zeros() -> dict[str, torch.Tensor]:
    return {name: torch.zeros_like(t) for name, t in cpu_kv_caches().items()}


def _park(sched: DirectConnector, req_id: str, tokens: int, blocks: list[int]) -> DeferDumpMetadata:
    """vLLM's admission of an async hit: lookup, allocate, park (not scheduled), then the step's metadata."""
    req = request(req_id, tokens)
    external, load_async = sched.get_num_new_matched_tokens(req, 0)
    assert load_async and external > 0
    sched.update_state_after_alloc(req, blocks, external)
    return sched.build_connector_meta(step())


def test_lookup_answers_load_async_only_for_a_hit_and_only_when_configured() -> None:
    store, _, _ = _warm_store(12)
    assert _scheduler(store).get_num_new_matched_tokens(request("b", 13), 0) == (12, True)
    assert _scheduler(store).get_num_new_matched_tokens(request("c", 13, base=500), 0) == (0, False)
    sync = _scheduler(store, ConnectorConfig(block_size=BLOCK_SIZE))
    assert sync.get_num_new_matched_tokens(request("b", 13), 0) == (12, False)


def test_a_parked_request_gets_its_load_in_the_next_metadata_and_is_written_only_in_get_finished() -> None:
    store, source, dumped = _warm_store(12)
    store.auto_complete_on_wait = False  # a wait on a running load would raise: the worker must never block
    sched = _scheduler(store)
    meta = _park(sched, "b", 13, [0, 1, 2, 4])
    load = meta.request_meta["b"]
    assert load.load_async and load.load_block_ids == (0, 1, 2) and not load.has_dump()
    assert sched.receiving_request_ids() == {"b"}
    assert sched._async_dump_req_ids == set()

    target = _zeros()
    conn = worker(store, config=ASYNC, kv_caches=target, deferred=False)
    run_save_step(conn, meta)
    assert conn.receiving_request_ids() == {"b"}
    assert all(torch.count_nonzero(t) == 0 for t in target.values())  # submitted, nothing written yet
    assert conn.get_finished(set()) == (None, None)  # still running: not reported, not waited
    [task] = store.pending_tasks()
    store.complete(task)
    assert conn.get_finished(set()) == (None, {"b"})
    for name in source:
        assert torch.equal(target[name][[0, 1, 2]], source[name][dumped])
    assert conn.get_block_ids_with_load_errors() == set() and conn.receiving_request_ids() == frozenset()
    assert conn.get_finished(set()) == (None, None)  # reported once

    sched.update_connector_output({"b"})
    assert sched.receiving_request_ids() == frozenset()
    # vLLM schedules it as new with the hit computed: no second load, the last token computed and not dumped
    meta = sched.build_connector_meta(step(new=[new_req(request("b", 13), [0, 1, 2, 4], 1, 12)]))
    assert "b" not in meta.request_meta


def test_a_failed_async_load_is_still_reported_and_its_blocks_are_load_errors() -> None:
    store = ManualStore()
    conn = worker(store, config=ASYNC, kv_caches=_zeros(), deferred=False)
    meta = DeferDumpMetadata({"a": RequestDispatchMeta(load_hashes=(b"h1", b"h2"), load_block_ids=(4, 5), load_async=True)})
    run_save_step(conn, meta)
    [task] = store.pending_tasks()
    store.fail(task)
    assert conn.get_finished(set()) == (None, {"a"})
    assert conn.get_block_ids_with_load_errors() == {4, 5}
    assert conn.take_failed_recving() == set()  # one KV-cache group: block-level errors, vLLM keeps the prefix
    assert conn.metrics.value("deferdump_load_error_blocks_total") == 2


def test_a_refused_async_load_submit_is_reported_as_a_failed_load_in_the_next_get_finished() -> None:
    store = ManualStore()
    store.submit_fail_next = 1
    conn = worker(store, config=ASYNC, kv_caches=_zeros(), deferred=False)
    run_save_step(conn, DeferDumpMetadata({"a": RequestDispatchMeta((b"h1",), (4,), load_async=True)}))
    assert conn.get_finished(set()) == (None, {"a"})
    assert conn.get_block_ids_with_load_errors() == {4}


def test_a_check_failure_keeps_the_load_for_a_later_get_finished() -> None:
    store = ManualStore()
    conn = worker(store, config=ASYNC, kv_caches=_zeros(), deferred=False)
    run_save_step(conn, DeferDumpMetadata({"a": RequestDispatchMeta((b"h1",), (4,), load_async=True)}))
    [task] = store.pending_tasks()
    store.fail(task)
    store.check_fail = True
    assert conn.get_finished(set()) == (None, None)
    store.check_fail = False
    assert conn.get_finished(set()) == (None, {"a"})


def test_an_abort_during_the_load_is_reported_when_the_load_ends_and_the_scheduler_does_not_delay_it() -> None:
    store, _, _ = _warm_store(12)
    store.auto_complete_on_wait = False
    sched = _scheduler(store)
    meta = _park(sched, "b", 13, [0, 1, 2, 4])
    # vLLM finishes a WAITING_FOR_REMOTE_KVS request with its own delayed free: the connector must not add one
    assert sched.request_finished(request("b", 13), [0, 1, 2, 4]) == (False, None)
    conn = worker(store, config=ASYNC, kv_caches=_zeros(), deferred=False)
    run_save_step(conn, meta)
    assert conn.get_finished({"b"}) == (None, None)  # the abort reaches the worker while the load runs
    [task] = store.pending_tasks()
    store.complete(task)
    assert conn.get_finished(set()) == (None, {"b"})  # the report vLLM's delayed free waits for (real bug P8)
    assert store.outstanding_tasks() == []


def test_the_p8_broken_mode_drops_an_aborted_request_from_the_receive_set() -> None:
    store = ManualStore()
    config = ConnectorConfig(block_size=BLOCK_SIZE, load_async=True, test_drop_aborted_recving=True)
    conn = worker(store, config=config, kv_caches=_zeros(), deferred=False)
    run_save_step(conn, DeferDumpMetadata({"a": RequestDispatchMeta((b"h1",), (4,), load_async=True)}))
    [task] = store.pending_tasks()
    store.complete(task)
    assert conn.get_finished({"a"}) == (None, None)  # finished_recving never comes: vLLM holds the blocks forever
    assert conn.get_finished(set()) == (None, None)
    assert store.outstanding_tasks() == [] and conn.receiving_request_ids() == frozenset()


def test_a_request_with_a_pending_dump_and_then_a_load_is_reported_once_after_both() -> None:
    """Preempted after dumping, resumed with an async hit: its old dump is waited before the load is submitted
    and it leaves the dump tracking on both sides, so an abort during the load gets one report (recving)."""
    store = ManualStore()
    conn = worker(store, config=ASYNC, kv_caches=cpu_kv_caches(), deferred=False)
    run_save_step(conn, DeferDumpMetadata({"a": RequestDispatchMeta(dump_hashes=(b"a:1",), dump_block_ids=(1,))}))
    [dump] = store.pending_tasks()
    assert conn._async_dump_req_ids == {"a"}
    store.complete(dump)  # the flush below waits it (a ManualStore wait needs a finished task)
    run_save_step(conn, DeferDumpMetadata({"a": RequestDispatchMeta((b"a:1",), (6,), load_async=True)}))
    assert conn._pending_dump_tasks == [] and conn._async_dump_req_ids == set()
    [load] = store.pending_tasks()
    assert conn.get_finished({"a"}) == (None, None)
    store.complete(load)
    assert conn.get_finished(set()) == (None, {"a"})

    sched = _scheduler(ManualStore())
    sched._async_dump_req_ids.add("z")  # tracked from dumps before its preemption
    sched._request_plans["z"] = plan = _plan_with_hit(sched, "z")
    plan.async_load_pending, plan.vllm_block_ids[:] = True, [7, 8, 9]
    assert sched.build_connector_meta(step()).request_meta["z"].load_async
    assert sched._async_dump_req_ids == set()
    assert sched.request_finished(request("z", 9), [7, 8, 9]) == (False, None)


def _plan_with_hit(sched: DirectConnector, req_id: str):
    from deferdump.reference.connectors import RequestPlan

    hashes = tuple(prefix_block_hashes(tuple(range(9)), BLOCK_SIZE, 1))
    return RequestPlan(hashes=hashes, hbm_hit_blocks=0, total_hit_blocks=2, num_token_ids=9, token_processed=8)


def test_a_rolled_back_async_load_dumps_the_blocks_vllm_recomputes() -> None:
    store, _, _ = _warm_store(12)
    sched = _scheduler(store)
    _park(sched, "b", 16, [0, 1, 2, 4])
    sched.update_connector_output({"b"})
    # the load of block 1 failed: vLLM truncated the request at 4 tokens (block 0 valid) and schedules the rest
    meta = sched.build_connector_meta(step(new=[new_req(request("b", 16), [0, 1, 2, 4], 12, 4)]))
    assert meta.request_meta["b"].dump_block_ids == (1, 2, 4)
    assert not meta.request_meta["b"].has_load()


def test_a_successful_async_full_hit_dumps_nothing_again() -> None:
    store, _, _ = _warm_store(12)
    sched = _scheduler(store)
    _park(sched, "b", 12, [0, 1, 2])
    sched.update_connector_output({"b"})
    meta = sched.build_connector_meta(step(new=[new_req(request("b", 12), [0, 1, 2], 1, 11)]))
    assert "b" not in meta.request_meta


def test_a_parked_request_that_vllm_schedules_at_once_loads_synchronously() -> None:
    store, _, _ = _warm_store(12)
    sched = _scheduler(store)
    req = request("b", 13)
    external, _ = sched.get_num_new_matched_tokens(req, 0)
    sched.update_state_after_alloc(req, [0, 1, 2, 4], external)
    meta = sched.build_connector_meta(step(new=[new_req(req, [0, 1, 2, 4], 1, 12)]))
    assert meta.request_meta["b"].load_block_ids == (0, 1, 2) and not meta.request_meta["b"].load_async
    assert sched.receiving_request_ids() == frozenset()


def test_a_resumed_request_after_an_async_load_keeps_its_plan() -> None:
    store, _, _ = _warm_store(12)
    sched = _scheduler(store)
    _park(sched, "b", 16, [0, 1, 2, 4])
    sched.update_connector_output({"b"})
    meta = sched.build_connector_meta(step(cached=[cached_req("b", [0, 1, 2, 4], 4, 12, resumed=True)]))
    assert meta.request_meta["b"].dump_block_ids == (4,)


def test_hybrid_async_load_failure_is_a_failed_receive_without_block_errors() -> None:
    groups = (KVGroup(("layer.0",), None), KVGroup(("layer.1",), 3))
    store = ManualStore()
    conn = DirectConnector(ASYNC, Role.WORKER, store=store, groups=groups)
    conn.register_kv_caches(_zeros())
    meta = DeferDumpMetadata({"a": RequestDispatchMeta(
        (b"h1", b"h2"), (4, 5), load_group_block_ids=((0, 7),), load_async=True)})
    run_save_step(conn, meta)
    tasks = store.pending_tasks()
    assert [t.block_hashes for t in tasks][0] == (b"h1", b"h2") and len(tasks) == 2  # one task per group
    store.fail(tasks[0])  # the full-attention group's load fails, the sliding-window group's succeeds
    store.seed({group_key(b"h2", 1): torch.zeros(conn.device.layout.row_nbytes(("layer.1",)), dtype=torch.uint8)})
    store.complete(tasks[1])
    assert conn.get_finished(set()) == (None, {"a"})
    assert conn.get_block_ids_with_load_errors() == set()  # vLLM 0.32 raises on block errors with two groups
    assert conn.take_failed_recving() == {"a"} and conn.take_failed_recving() == set()


def test_shutdown_stops_every_pending_load() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    conn = worker(store, config=ASYNC, kv_caches=_zeros(), deferred=False)
    run_save_step(conn, DeferDumpMetadata({"a": RequestDispatchMeta((b"h1",), (4,), load_async=True)}))
    conn.shutdown()
    assert store.outstanding_tasks() == [] and conn.receiving_request_ids() == frozenset()


@pytest.mark.parametrize(("values", "key"), [
    ({"load_async": True, "variant": "layerwise"}, "load_async"),
    ({"load_async": "yes"}, "load_async"),
    ({"test_drop_aborted_recving": True}, "test_drop_aborted_recving"),
])
def test_bad_load_async_configs_name_their_key(values: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        ConnectorConfig.from_extra_config(values)


def test_a_step_without_a_forward_yields_to_a_pending_load_and_only_then(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM calls get_finished before clear_connector_metadata; a step that scheduled nothing (every request
    parked) sleeps once, briefly, so the store's threads get the GIL the engine loop would keep."""
    from deferdump.reference import connectors

    store, _, _ = _warm_store(12)
    store.auto_complete_on_wait = False
    sched = _scheduler(store)
    parked = _park(sched, "b", 13, [0, 1, 2, 4])
    assert parked.forward is False  # nothing scheduled: vLLM only polls
    running = sched.build_connector_meta(step(new=[new_req(request("c", 5, base=700), [6], 5)]))
    assert running.forward is True
    idle = sched.build_connector_meta(step())

    sleeps: list[float] = []
    real_sleep = connectors.time.sleep
    monkeypatch.setattr(connectors.time, "sleep", lambda seconds: (sleeps.append(seconds), real_sleep(seconds)))
    conn = worker(store, config=ASYNC, kv_caches=_zeros(), deferred=False)

    def poll(meta: DeferDumpMetadata) -> tuple[object, object]:
        conn.bind_connector_metadata(meta)
        conn.start_load_kv()
        conn.wait_for_save()
        try:
            return conn.get_finished(set())
        finally:
            conn.clear_connector_metadata()

    assert poll(parked) == (None, None) and sleeps == [connectors.IDLE_LOAD_YIELD_S]  # load running, no forward
    assert poll(running) == (None, None) and len(sleeps) == 1  # a forward ran: the engine is busy anyway
    assert poll(idle) == (None, None) and len(sleeps) == 2
    [task] = store.pending_tasks()
    store.complete(task)
    assert poll(idle) == (None, {"b"}) and len(sleeps) == 2  # the load ended: reported, no yield
    assert poll(idle) == (None, None) and len(sleeps) == 2  # nothing pending: no yield
