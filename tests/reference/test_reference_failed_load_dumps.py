"""A request whose load failed in a step gets no dump in that step, stays tracked, and is dumped again after
vLLM rolls it back (kv_load_failure_policy "recompute")."""
from __future__ import annotations

import pytest

from deferdump.reference import (
    ConnectorConfig,
    DeferDumpMetadata,
    DirectConnector,
    LayerWiseConnector,
    ManualStore,
    RequestDispatchMeta,
    Role,
)
from support.reference import (
    BLOCK_SIZE,
    cached_req,
    cpu_kv_caches,
    new_req,
    request,
    run_save_step,
    step,
    worker,
)

LAYERS = ("layer.0", "layer.1")


def scheduler(store: ManualStore) -> DirectConnector:
    return DirectConnector(ConnectorConfig(block_size=BLOCK_SIZE), Role.SCHEDULER, store=store)


def _partial_hit(load_hashes: tuple[bytes, ...]) -> DeferDumpMetadata:
    """Request "a" loads blocks 4, 5 and computes (and dumps) block 6 in the same step; "b" only dumps."""
    return DeferDumpMetadata({
        "a": RequestDispatchMeta(
            load_hashes=load_hashes, load_block_ids=(4, 5), dump_hashes=(b"a:6",), dump_block_ids=(6,)
        ),
        "b": RequestDispatchMeta(dump_hashes=(b"b:7",), dump_block_ids=(7,)),
    })


def _dumped_requests(conn: DirectConnector) -> set[str]:
    return set().union(*(p.request_ids for p in conn._pending_dump_tasks))


@pytest.mark.parametrize("cls", [DirectConnector, LayerWiseConnector])
def test_a_request_whose_load_failed_in_the_step_is_tracked_but_not_dumped(cls: type[DirectConnector]) -> None:
    store = ManualStore(auto_complete_on_wait=True)
    conn = worker(store, cls=cls, kv_caches=cpu_kv_caches())
    run_save_step(conn, _partial_hit((b"missing-1", b"missing-2")), layers=LAYERS)
    assert _dumped_requests(conn) == {"b"}
    assert all(6 not in p.block_ids for p in conn._pending_dump_tasks)
    assert conn._async_dump_req_ids == {"a", "b"}  # still tracked: the scheduler delays its free
    assert conn.get_block_ids_with_load_errors() == {4, 5}
    for task in store.pending_tasks():
        store.complete(task)
    assert conn.get_finished({"a", "b"}) == ({"a", "b"}, None)  # reported without a task to wait
    assert conn._pending_dump_tasks == [] and conn.events.live() == 0


def test_a_successful_load_keeps_the_dump_of_the_block_computed_after_it() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    source = cpu_kv_caches(seed=1)
    dumper = worker(store, kv_caches=source, deferred=False)
    run_save_step(dumper, DeferDumpMetadata({"x": RequestDispatchMeta(dump_hashes=(b"h4", b"h5"), dump_block_ids=(4, 5))}))
    assert dumper.get_finished({"x"}) == ({"x"}, None)
    conn = worker(store, kv_caches=cpu_kv_caches())
    run_save_step(conn, _partial_hit((b"h4", b"h5")))
    assert conn.get_block_ids_with_load_errors() == set()
    assert _dumped_requests(conn) == {"a", "b"}


def test_the_failed_loads_of_one_step_do_not_skip_the_next_steps_dumps() -> None:
    store = ManualStore()
    conn = worker(store, kv_caches=cpu_kv_caches())
    run_save_step(conn, _partial_hit((b"missing-1", b"missing-2")))
    assert _dumped_requests(conn) == {"b"}
    run_save_step(conn, DeferDumpMetadata({"a": RequestDispatchMeta(dump_hashes=(b"a:4",), dump_block_ids=(4,))}))
    assert _dumped_requests(conn) == {"a", "b"}


def test_a_deferred_wait_for_save_still_sees_the_failed_load_after_the_errors_were_collected() -> None:
    """Spec decoding (`defer_finalize`): vLLM collects get_block_ids_with_load_errors before wait_for_save."""
    store = ManualStore()
    conn = worker(store, kv_caches=cpu_kv_caches())
    conn.bind_connector_metadata(_partial_hit((b"missing-1", b"missing-2")))
    conn.start_load_kv()
    assert conn.get_block_ids_with_load_errors() == {4, 5}
    conn.wait_for_save()
    conn.clear_connector_metadata()
    assert _dumped_requests(conn) == {"b"}


def test_the_scheduler_dumps_the_blocks_of_a_rolled_back_request_again() -> None:
    """vLLM truncates num_computed_tokens at the first failed block; the recomputed blocks are dumped anew."""
    sched = scheduler(ManualStore())
    req = request("a", 3 * BLOCK_SIZE)
    sched.get_num_new_matched_tokens(req, 0)
    sched.update_state_after_alloc(req, [3, 5, 9], 0)
    first = sched.build_connector_meta(step(new=[new_req(req, [3, 5, 9], 2 * BLOCK_SIZE)]))
    assert first.request_meta["a"].dump_block_ids == (3, 5)
    rolled_back = sched.build_connector_meta(step(cached=[cached_req("a", [], 3 * BLOCK_SIZE, 0)]))
    assert rolled_back.request_meta["a"].dump_block_ids == (3, 5, 9)
    assert "a" in sched._async_dump_req_ids


def test_a_running_request_that_was_not_rolled_back_is_not_dumped_twice() -> None:
    sched = scheduler(ManualStore())
    req = request("a", 3 * BLOCK_SIZE)
    sched.get_num_new_matched_tokens(req, 0)
    sched.update_state_after_alloc(req, [3, 5, 9], 0)
    sched.build_connector_meta(step(new=[new_req(req, [3, 5, 9], 2 * BLOCK_SIZE)]))
    later = sched.build_connector_meta(step(cached=[cached_req("a", [], BLOCK_SIZE, 2 * BLOCK_SIZE)]))
    assert later.request_meta["a"].dump_block_ids == (9,)
