"""Dump-then-load round trips of real tensors, byte for byte, through MemoryStore and FileStore."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from deferdump.reference.stores.file import FileStore
from deferdump.reference.stores.memory import MemoryStore
from deferdump.reference.stores.base import KVStore, ReadyPayload

DTYPES = [torch.uint8, torch.float16, torch.bfloat16, torch.float32]
BLOCK_NBYTES = [4, 1024, 64 * 1024]


def _kv_blocks(dtype: torch.dtype, n: int, block_nbytes: int, seed: int) -> torch.Tensor:
    """n KV blocks of `dtype` (random, incl. NaN/Inf bit patterns for floats), as host uint8 rows."""
    generator = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n, block_nbytes), dtype=torch.uint8, generator=generator)
    if dtype == torch.uint8:
        return raw
    values = torch.randn((n, block_nbytes // dtype.itemsize), generator=generator).to(dtype)
    values[0, 0] = float("nan")
    values[-1, -1] = float("-inf")
    as_bytes = values.view(torch.uint8)
    assert as_bytes.shape == (n, block_nbytes)
    return as_bytes


def _round_trip(store: KVStore, data: torch.Tensor, tag: int) -> torch.Tensor:
    hashes = [tag.to_bytes(4, "big") + i.to_bytes(4, "big") for i in range(data.shape[0])]
    store.wait(store.dump(hashes, ReadyPayload(data)), timeout=30)
    assert store.lookup_prefix(hashes) == len(hashes)
    loaded = store.wait(store.load(hashes), timeout=30)
    assert loaded is not None
    return loaded


@pytest.mark.parametrize("block_nbytes", BLOCK_NBYTES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["memory", "file"])
def test_round_trip_is_byte_exact(kind: str, dtype: torch.dtype, block_nbytes: int, tmp_path: Path) -> None:
    data = _kv_blocks(dtype, n=5, block_nbytes=block_nbytes, seed=block_nbytes)
    store: KVStore = MemoryStore(capacity_blocks=16) if kind == "memory" else FileStore(tmp_path)
    with store:
        loaded = _round_trip(store, data, tag=block_nbytes)
    assert loaded.dtype == torch.uint8 and loaded.shape == data.shape
    assert torch.equal(loaded, data)  # bytes equal: the dtype's values (NaN bit patterns included) are too


def test_dumped_bytes_do_not_alias_the_payload(tmp_path: Path) -> None:
    """The device reuses its staging buffer after the task: the store must have copied the bytes."""
    data = _kv_blocks(torch.uint8, n=2, block_nbytes=64, seed=1)
    original = data.clone()
    with MemoryStore(capacity_blocks=4) as store:
        store.wait(store.dump([b"a", b"b"], ReadyPayload(data)))
        data.fill_(0)
        loaded = store.wait(store.load([b"a", b"b"]))
    assert loaded is not None and torch.equal(loaded, original)


def test_file_store_round_trip_survives_reopening(tmp_path: Path) -> None:
    data = _kv_blocks(torch.bfloat16, n=4, block_nbytes=2048, seed=9)
    hashes = [bytes([7, i]) * 16 for i in range(4)]
    with FileStore(tmp_path) as store:
        store.wait(store.dump(hashes, ReadyPayload(data)))
        before = store.stats()
    with FileStore(tmp_path) as reopened:
        after = reopened.stats()
        assert (after.blocks, after.bytes) == (before.blocks, before.bytes) == (4, reopened.disk_usage()[1])
        assert reopened.lookup_prefix(hashes) == 4
        loaded = reopened.wait(reopened.load(hashes[::-1]))
    assert loaded is not None and torch.equal(loaded, data.flip(0))
