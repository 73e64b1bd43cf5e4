"""Stagings taken on first use: the copy thread, not the forward's, picks and books a dump's rows; the
store still keeps them in place (one copy per byte), releases what it does not keep, and a staging
released before its copy ran never took a row."""
from __future__ import annotations

import threading

import torch

from deferdump.reference import ConnectorConfig, DirectConnector, Role
from deferdump.reference.devices import CpuDevice
from deferdump.reference.stores.base import StagedRows
from deferdump.reference.stores.memory import MemoryStore
from support.reference import BLOCK_SIZE, cpu_kv_caches, dump_meta, run_save_step

ROW = 64


def test_rows_are_taken_by_the_thread_that_first_uses_them_and_released_by_release() -> None:
    with MemoryStore(8) as store:
        takers: list[str] = []

        def take() -> StagedRows | None:
            takers.append(threading.current_thread().name)
            return store.staging(3, ROW)

        staged = StagedRows.taken_on_first_use(3, ROW, take)
        assert takers == [] and store.pool.counts() == (0, 0, 0), "nothing staged on the caller's thread"
        user = threading.Thread(target=lambda: staged.segments, name="copy-thread")
        user.start()
        user.join()
        assert takers == ["copy-thread"] and store.pool.counts() == (3, 0, 0)
        assert (staged.num_rows, staged.row_nbytes) == (3, ROW)
        kept = store.pool.keep(staged.rows()[1])  # what the store's job does with a row it stores
        assert kept.data_ptr() == staged.rows()[1].data_ptr()
        staged.release()
        staged.release()  # idempotent
        assert store.pool.counts() == (0, 1, 2)


def test_a_staging_released_before_its_first_use_takes_nothing() -> None:
    with MemoryStore(8) as store:
        staged = StagedRows.taken_on_first_use(2, ROW, lambda: store.staging(2, ROW))
        staged.release()
        assert store.pool.counts() == (0, 0, 0) and store.pool.nbytes() == 0


def test_a_store_that_offers_no_rows_gets_a_fresh_tensor_instead() -> None:
    staged = StagedRows.taken_on_first_use(2, ROW, lambda: None)
    with torch.inference_mode():
        segments = staged.segments  # built inside inference mode, still writable outside it
    assert [tuple(s.shape) for s in segments] == [(2, ROW)] and not segments[0].is_inference()
    staged.release()


def test_the_connector_stages_later_dumps_on_the_copy_thread_and_the_store_keeps_them_in_place() -> None:
    class Watched(MemoryStore):
        def __init__(self) -> None:
            super().__init__(32, workers=1)
            self.stagers: list[str] = []

        def staging(self, num_rows: int, row_nbytes: int) -> StagedRows | None:
            self.stagers.append(threading.current_thread().name)
            return super().staging(num_rows, row_nbytes)

    store, device, caches = Watched(), CpuDevice(1), cpu_kv_caches()
    connector = DirectConnector(ConnectorConfig(block_size=BLOCK_SIZE), Role.WORKER, store=store, device=device)
    connector.register_kv_caches(caches)
    for step, blocks in enumerate(([1, 2], [3], [4, 5, 6])):
        run_save_step(connector, dump_meta((f"r{step}", blocks)))
        connector.get_finished({f"r{step}"})
    me = threading.current_thread().name
    assert store.stagers[0] == me, "the first dump learns that the store stages"
    assert store.stagers[1:] and all(name.startswith("deferdump-copy") for name in store.stagers[1:])
    assert store.stats().blocks == 6 and store.stats().dumps_completed == 3
    staged, kept, _free = store.pool.counts()
    assert staged == 0 and kept == 6, "every stored block is a pool row, kept in place"
    for step, blocks in enumerate(([1, 2], [3], [4, 5, 6])):
        for block in blocks:
            expected = torch.cat([caches[name][block].contiguous().view(torch.uint8).flatten() for name in sorted(caches)])
            assert torch.equal(store._blocks[f"r{step}:{block}".encode()], expected)
    connector.shutdown()
    device.close()
    store.close()
