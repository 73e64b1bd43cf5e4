"""The dump path on queue-fed threads, through its failure paths: a copy that raises, a store write that
fails, a copy cancelled before it ran, and a shutdown with dumps in flight — errors surface on `wait` as
before, handles are released, and neither the copy thread nor the store's worker outlives its owner."""
from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
import torch

from deferdump.reference import ConnectorConfig, OuterConnector, Role
from deferdump.reference.devices import CopyPayload, CpuDevice
from deferdump.reference.stores.base import StoreError
from deferdump.reference.stores.memory import MemoryStore
from support.reference import BLOCK_SIZE, cpu_kv_caches, deployment, dump_meta, run_request, run_save_step
from support.live_threads import new_threads




def _worker(store: MemoryStore, copy_threads: int = 1) -> tuple[OuterConnector, CpuDevice]:
    device = CpuDevice(copy_threads)
    connector = OuterConnector(ConnectorConfig(block_size=BLOCK_SIZE), Role.WORKER, store=store, device=device)
    connector.register_kv_caches(cpu_kv_caches())
    return connector, device


def test_a_copy_that_raises_fails_its_task_on_wait_and_the_handle_is_released() -> None:
    before = set(threading.enumerate())
    store = MemoryStore(16, workers=1)
    connector, device = _worker(store)

    def broken(*_args: object) -> None:
        raise RuntimeError("copy engine fault")

    device._gather_staged = broken  # type: ignore[method-assign]
    run_save_step(connector.inner, dump_meta(("r", [1, 2])))
    pending = list(connector.inner._pending_dump_tasks)
    assert len(pending) == 1 and connector.events.live() == 1
    with pytest.raises(RuntimeError, match="copy engine fault"):
        pending[0].payload.result()
    with pytest.raises(StoreError, match="source copy failed: copy engine fault"):
        store.wait(store.dump([b"x", b"y"], device.read_blocks([3, 4], into=store.staging(2, device.layout.row_nbytes(None)))))
    assert connector.get_finished({"r"}) == ({"r"}, None)  # reported after its (failed) task was waited
    assert connector.inner.wait_failures == 1 and connector.events.live() == 0
    assert connector.metrics.value("deferdump_dumps_failed_total", {"stage": "wait"}) == 1
    assert store.stats().dumps_failed == 2 and store.stats().pending == 0 and store.stats().blocks == 0
    assert store.pool.counts()[:2] == (0, 0), "the failed dumps' staged rows went back to the pool"
    connector.shutdown()
    device.close()
    store.close()
    assert new_threads(before) == set()


def test_a_store_write_that_fails_surfaces_on_wait_and_keeps_nothing() -> None:
    class FailingStore(MemoryStore):
        def _write_block(self, block_hash: bytes, row: torch.Tensor) -> int:
            raise OSError("disk full")

    store = FailingStore(16, workers=1)
    connector, device = _worker(store)
    run_save_step(connector.inner, dump_meta(("r", [1, 2])))
    task = connector.inner._pending_dump_tasks[0].task
    deadline = time.monotonic() + 10
    while not store.check(task):
        assert time.monotonic() < deadline
        time.sleep(0.002)
    connector.get_finished({"r"})
    assert connector.inner.wait_failures == 1 and connector.events.live() == 0
    assert store.stats().dumps_failed == 1 and store.lookup_prefix([b"r:1"]) == 0
    with pytest.raises(StoreError, match=r"dump task \d+ failed: disk full"):
        store.wait(store.dump([b"k"], device.read_blocks([5])))
    connector.shutdown()
    device.close()
    store.close()


def test_a_copy_cancelled_before_it_ran_never_reads_and_its_callbacks_still_run() -> None:
    device = CpuDevice(1)
    caches = cpu_kv_caches()
    device.register(caches)
    gate = threading.Event()
    blocker = device._pool.submit(gate.wait)  # the only copy thread is busy: the next copy stays queued
    payload = device.read_blocks([1, 2])
    heard: list[bool] = []
    payload.add_done_callback(lambda: heard.append(payload.done()))
    assert isinstance(payload, CopyPayload) and not payload.done()
    caches["layer.0"][1].fill_(9.0)
    assert payload.cancel() and payload.cancel(), "cancelled, and it stays cancelled"
    assert payload.done() and heard == [True]
    with pytest.raises(concurrent.futures.CancelledError):
        payload.result()
    gate.set()
    blocker.result(5)
    device.settle(payload)  # nothing left to wait for
    fresh = device.read_blocks([1]).result()  # the copy thread goes on with the next copies
    layer0 = caches["layer.0"][1].contiguous().view(torch.uint8).flatten()
    assert torch.equal(fresh[0, : layer0.numel()], layer0)
    device.close()


def test_shutdown_with_dumps_in_flight_waits_them_and_leaves_no_thread() -> None:
    before = set(threading.enumerate())
    config = ConnectorConfig(block_size=BLOCK_SIZE, store="memory", capacity_blocks=32, copy_threads=2)
    caches = cpu_kv_caches()
    scheduler, worker = deployment(config, caches)
    run_request(scheduler, worker, "warm", 8, [0, 1])  # starts the copy threads and the store's worker
    device = worker.inner.device
    assert isinstance(device, CpuDevice)
    gates = [threading.Event(), threading.Event()]
    blockers = [device._pool.submit(gate.wait) for gate in gates]  # both copy threads busy
    run_save_step(worker.inner, dump_meta(("a", [3, 4]), ("b", [5])))
    pending = list(worker.inner._pending_dump_tasks)
    assert len(pending) == 1 and not pending[0].payload.done()
    store = worker.store
    closer = threading.Thread(target=worker.shutdown)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "shutdown waits for the dump in flight"
    for gate in gates:
        gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert [b.result(5) for b in blockers] == [True, True]
    assert worker.events.live() == 0 and worker.inner._pending_dump_tasks == []
    assert store.stats().pending == 0 and store.stats().dumps_completed == 2
    assert store.lookup_prefix([b"a:3", b"a:4", b"b:5"]) == 3, "the in-flight dump was stored whole"
    expected = torch.cat([caches[name][3].contiguous().view(torch.uint8).flatten() for name in sorted(caches)])
    assert torch.equal(store._blocks[b"a:3"], expected)
    assert new_threads(before) == set(), "copy threads and store workers all joined"
