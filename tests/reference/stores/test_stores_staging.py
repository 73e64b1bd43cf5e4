"""The one-copy dump path: a `CpuDevice` gathers a dump straight into `MemoryStore`'s pooled rows, which
the store then keeps; rows it does not keep go back to the pool; nothing leaks, nothing is shared wrongly."""
from __future__ import annotations

import threading

import pytest
import torch

from deferdump.reference.devices import CpuDevice
from deferdump.reference.errors import DeviceError
from deferdump.reference.stores.base import ReadyPayload, StagedRows, StoreFull
from deferdump.reference.stores.memory import MemoryStore
from deferdump.reference.stores.row_pool import RowPool

NUM_BLOCKS, LAYERS, ROW = 16, 3, 3 * 2 * 4 * 8 * 2  # blocks; layers; bytes of one block over all layers


def _caches() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {f"layer{i}": torch.randn(2, NUM_BLOCKS, 4, 8, dtype=torch.float16) for i in range(LAYERS)}


def _h(i: int) -> bytes:
    return i.to_bytes(4, "little") * 8


@pytest.fixture
def device():
    dev = CpuDevice(1)
    dev.register(_caches(), NUM_BLOCKS)
    yield dev
    dev.close()


def _leak_free(store: MemoryStore) -> None:
    staged, kept, _free = store.pool.counts()
    assert staged == 0
    assert kept == store.stats().blocks + store.releasing_bytes() // ROW


def test_gathered_rows_are_kept_without_a_copy_and_hold_the_blocks_bytes(device: CpuDevice) -> None:
    ids = [5, 1, 9, 3]
    with MemoryStore(8) as store:
        staged = store.staging(len(ids), ROW)
        assert isinstance(staged, StagedRows) and len(staged.segments) == 1
        addresses = [row.data_ptr() for row in staged.rows()]
        payload = device.read_blocks(ids, into=staged)
        store.wait(store.dump([_h(i) for i in ids], payload))
        expected = device.read_blocks(ids).result()
        assert torch.equal(store.wait(store.load([_h(i) for i in ids])), expected)
        assert [store._blocks[_h(i)].data_ptr() for i in ids] == addresses, "kept in place: one copy per byte"
        _leak_free(store)


def test_fragmented_free_rows_become_several_segments_gathered_in_order(device: CpuDevice) -> None:
    with MemoryStore(6) as store:
        for i in range(6):  # six one-row stagings: rows 0..5 of one width, kept
            store.wait(store.dump([_h(100 + i)], device.read_blocks([i], into=store.staging(1, ROW))))
        ids = [7, 8, 2]
        staged = store.staging(3, ROW)  # evictions only free rows at the next job; a fresh chunk serves this
        store.wait(store.dump([_h(i) for i in ids], device.read_blocks(ids, into=staged)))
        # rows 0..2 were evicted (LRU); give them back, then ask for 3 rows when 0,1,2 are not all free
        store.wait(store.dump([_h(200)], device.read_blocks([4], into=store.staging(1, ROW))))
        pool = RowPool()
        rows = [pool.keep(torch.full((ROW,), i, dtype=torch.uint8)) for i in range(5)]
        pool.give_back(rows[1])
        pool.give_back(rows[3])
        split = pool.stage(3, ROW)
        assert [int(s.shape[0]) for s in split.segments] == [1, 1, 1]
        device.read_blocks([0, 1, 2], into=split).result()
        assert torch.equal(torch.stack(split.rows()), device.read_blocks([0, 1, 2]).result())
        split.release()
        assert pool.counts() == (0, 3, 3)
        expected = device.read_blocks(ids).result()
        assert torch.equal(store.wait(store.load([_h(i) for i in ids])), expected)
        _leak_free(store)


def test_rows_of_a_block_already_stored_go_back_to_the_pool(device: CpuDevice) -> None:
    with MemoryStore(8) as store:
        store.wait(store.dump([_h(1)], ReadyPayload(device.read_blocks([1]).result())))
        staged = store.staging(2, ROW)
        store.wait(store.dump([_h(1), _h(2)], device.read_blocks([1, 2], into=staged)))  # _h(1): dedupe
        assert store.pool.counts()[0] == 0, "the deduplicated row was released, not kept"
        _leak_free(store)


def test_a_payload_from_elsewhere_is_copied_into_the_pool(device: CpuDevice) -> None:
    data = device.read_blocks([0, 1]).result()
    with MemoryStore(4) as store:
        store.wait(store.dump([_h(0), _h(1)], ReadyPayload(data)))
        data.zero_()  # the caller may reuse its buffer once the task ended
        assert torch.equal(store.wait(store.load([_h(0), _h(1)])), device.read_blocks([0, 1]).result())
        _leak_free(store)


def test_a_refused_dump_leaves_no_staged_rows(device: CpuDevice) -> None:
    with MemoryStore(2) as store:
        staged = store.staging(3, ROW)
        payload = device.read_blocks([0, 1, 2], into=staged)
        with pytest.raises(StoreFull):
            store.dump([_h(0), _h(1), _h(2)], payload)  # three blocks never fit in two
        device.settle(payload)
        staged.release()  # what the connector does for a refused submit: after settle
        assert store.pool.counts() == (0, 0, 3)
        store.wait(store.dump([_h(0), _h(1)], device.read_blocks([0, 1], into=store.staging(2, ROW))))
        assert store.pool.counts() == (0, 2, 1), "the freed rows were reused, no chunk added"
        _leak_free(store)


def test_staged_rows_of_the_wrong_shape_are_refused(device: CpuDevice) -> None:
    with MemoryStore(4) as store:
        with pytest.raises(DeviceError, match="staged rows"):
            device.read_blocks([0, 1], into=store.staging(3, ROW))
        with pytest.raises(DeviceError, match="staged rows"):
            device.read_blocks([0], into=store.staging(1, ROW - 2))


def test_rows_staged_inside_inference_mode_are_written_by_the_copy_thread(device: CpuDevice) -> None:
    """vLLM dumps inside torch.inference_mode(): the pool's rows must stay normal tensors."""
    with MemoryStore(4) as store:
        with torch.inference_mode():
            staged = store.staging(2, ROW)
            payload = device.read_blocks([3, 4], into=staged)
            task = store.dump([_h(3), _h(4)], payload)
        store.wait(task)
        assert not any(row.is_inference() for row in staged.rows())
        assert torch.equal(store.wait(store.load([_h(3), _h(4)])), device.read_blocks([3, 4]).result())


def test_many_concurrent_staged_dumps_keep_every_block_exact(device: CpuDevice) -> None:
    expected = {i: device.read_blocks([i]).result()[0] for i in range(NUM_BLOCKS)}
    with MemoryStore(10) as store:
        errors: list[BaseException] = []

        def worker(offset: int) -> None:
            try:
                for round_ in range(20):
                    ids = [(offset + round_ + k) % NUM_BLOCKS for k in range(3)]
                    keys = [_h(1000 * offset + 10 * round_ + k) for k in range(3)]
                    try:
                        store.wait(store.dump(keys, device.read_blocks(ids, into=store.staging(3, ROW))))
                    except StoreFull:
                        continue
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(o,)) for o in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for key, row in list(store._blocks.items()):
            offset, rest = divmod(int.from_bytes(key[:4], "little"), 1000)
            round_, k = divmod(rest, 10)
            assert torch.equal(row, expected[(offset + round_ + k) % NUM_BLOCKS])
        _leak_free(store)


def test_a_staging_builds_its_views_where_they_are_first_used_one_per_run_of_adjacent_rows() -> None:
    """The pool stages by bookkeeping only; the views of non-adjacent rows, built on first use, cover
    exactly the staged rows, in order, and the rows' addresses are the ones the pool tracks."""
    pool = RowPool()
    rows = [pool.keep(row) for row in pool.stage(6, ROW).rows()]  # one chunk of six rows, all kept
    for i in (4, 1, 2):
        pool.give_back(rows[i])
    staged = pool.stage(5, ROW)  # free rows 1, 2, 4, then two of a new chunk
    assert staged._segments is None, "no view was made while staging"
    assert (staged.num_rows, staged.row_nbytes) == (5, ROW)
    segments: list[tuple[torch.Tensor, ...]] = []
    thread = threading.Thread(target=lambda: segments.append(staged.segments))  # as a copy thread does
    thread.start()
    thread.join()
    assert [int(s.shape[0]) for s in segments[0]] == [2, 1, 2]
    assert [row.data_ptr() for row in staged.rows()[:3]] == [rows[i].data_ptr() for i in (1, 2, 4)]
    assert staged.segments is segments[0], "built once"
    assert {row.data_ptr() for row in staged.rows()} == pool._staged
    assert pool.counts() == (5, 3, 0)
    staged.release()
    assert pool.counts() == (0, 3, 5)


def test_a_staging_released_before_any_view_was_built_frees_its_rows() -> None:
    """A refused or failed submit releases rows the copy never touched: no view is needed for that."""
    pool = RowPool()
    staged = pool.stage(3, ROW)
    staged.release()
    assert staged._segments is None
    assert pool.counts() == (0, 0, 3)
    staged.release()  # idempotent
    again = pool.stage(3, ROW)
    assert pool.counts() == (3, 0, 0) and pool.nbytes() == 3 * ROW, "the same rows, no new chunk"
    again.release()


def test_deferred_staged_rows_check_the_views_they_build() -> None:
    chunk = torch.zeros((4, ROW), dtype=torch.uint8)
    with pytest.raises(ValueError, match="cover"):
        _ = StagedRows.deferred(3, ROW, lambda: [chunk[0:2]]).segments
    with pytest.raises(ValueError, match="2-D uint8"):
        _ = StagedRows.deferred(2, ROW, lambda: [chunk[0:2].view(torch.int16)]).segments
    with pytest.raises(ValueError, match="positive"):
        StagedRows.deferred(0, ROW, lambda: [chunk])
    assert StagedRows.deferred(4, ROW, lambda: [chunk[0:1], chunk[1:4]]).rows()[3].data_ptr() == chunk[3].data_ptr()
