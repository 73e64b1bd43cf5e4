"""FileStore durability: a half-written file is never visible, a corrupt or truncated one is a load error
naming its hash (never data), an unusable directory is refused at construction, the index matches disk."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from deferdump.reference.stores.file import HEADER_NBYTES, FileStore, StoreDirectoryError
from deferdump.reference.stores.base import LoadError, ReadyPayload, StoreError

BLOCK_NBYTES = 256


def _data(n: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, BLOCK_NBYTES), dtype=torch.uint8, generator=generator)


def _hash(i: int) -> bytes:
    return bytes([0xAB, i]) * 16


def _files(directory: Path, pattern: str) -> list[Path]:
    return sorted(directory.rglob(pattern))


def _assert_index_matches_disk(store: FileStore) -> None:
    stats = store.stats()
    assert store.disk_usage() == (stats.blocks, stats.bytes)


@pytest.fixture
def store(tmp_path: Path):
    with FileStore(tmp_path / "store") as opened:
        yield opened


# ------------------------------------------------------------------ crash safety
def test_failed_rename_leaves_no_visible_or_temporary_file(store: FileStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(src: object, dst: object) -> None:
        raise OSError(5, "simulated I/O error during rename")

    monkeypatch.setattr(os, "replace", crash)
    task = store.dump([_hash(1)], ReadyPayload(_data(1)))
    with pytest.raises(StoreError, match="simulated I/O error"):
        store.wait(task)
    monkeypatch.undo()
    assert store.lookup_prefix([_hash(1)]) == 0
    assert _files(store.directory, "*.blk") == [] and _files(store.directory, "*.tmp") == []
    assert store.stats().dumps_failed == 1 and store.stats().pending == 0
    _assert_index_matches_disk(store)


CRASHING_WRITER = textwrap.dedent(
    """
    import os, sys, torch
    from deferdump.reference.stores.file import FileStore
    from deferdump.reference.stores.base import ReadyPayload
    directory, crash_at = sys.argv[1], sys.argv[2]
    store = FileStore(directory)
    store.wait(store.dump([bytes([1]) * 32], ReadyPayload(torch.full((1, 256), 1, dtype=torch.uint8))))
    if crash_at == "fsync":       # killed while the temporary file's bytes are not yet durable
        real_fsync = os.fsync
        def fsync(fd):
            if os.fstat(fd).st_size > 0 and not os.path.isdir(f"/proc/self/fd/{fd}"):
                os.ftruncate(fd, 100)  # only part of the bytes reached the disk
                os._exit(9)
            real_fsync(fd)
        os.fsync = fsync
    else:                          # killed between the durable write and the rename
        os.replace = lambda src, dst: os._exit(9)
    store.wait(store.dump([bytes([2]) * 32], ReadyPayload(torch.full((1, 256), 2, dtype=torch.uint8))))
    os._exit(0)
    """
)


@pytest.mark.parametrize("crash_at", ["fsync", "replace"])
def test_killed_writer_leaves_only_ignored_temporary_files(tmp_path: Path, crash_at: str) -> None:
    directory = tmp_path / "store"
    command = [sys.executable, "-c", CRASHING_WRITER, str(directory), crash_at]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 9, result.stderr
    leftovers = _files(directory, "*.tmp")
    assert len(leftovers) == 1, "the crash happened mid-write"
    assert [p.name for p in _files(directory, "*.blk")] == [f"{(bytes([1]) * 32).hex()}.blk"]
    with FileStore(directory) as reopened:
        assert reopened.lookup_prefix([bytes([2]) * 32]) == 0, "a half-written block must never be visible"
        assert reopened.lookup_prefix([bytes([1]) * 32]) == 1
        assert not leftovers[0].exists(), "crash leftovers are cleaned at start"
        loaded = reopened.wait(reopened.load([bytes([1]) * 32]))
        assert loaded is not None and torch.equal(loaded, torch.full((1, 256), 1, dtype=torch.uint8))
        with pytest.raises(LoadError):
            reopened.wait(reopened.load([bytes([2]) * 32]))
        _assert_index_matches_disk(reopened)


# ------------------------------------------------------- corruption and truncation
def _store_three(store: FileStore) -> torch.Tensor:
    data = _data(3, seed=3)
    store.wait(store.dump([_hash(0), _hash(1), _hash(2)], ReadyPayload(data)))
    return data


def _flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "damage",
    ["flip-magic", "flip-version", "flip-length", "flip-digest", "flip-hash", "flip-payload-first", "flip-payload-last",
     "truncate-empty", "truncate-header", "truncate-payload", "append-byte"],
)
def test_damaged_file_is_a_load_error_naming_its_hash_never_data(store: FileStore, damage: str) -> None:
    _store_three(store)
    path = store.path_of(_hash(1))
    size = path.stat().st_size
    offsets = {"flip-magic": 0, "flip-version": 8, "flip-length": 16, "flip-digest": 30, "flip-hash": HEADER_NBYTES,
               "flip-payload-first": HEADER_NBYTES + 32, "flip-payload-last": size - 1}
    if damage in offsets:
        _flip(path, offsets[damage])
    elif damage == "append-byte":
        path.write_bytes(path.read_bytes() + b"\x00")
    else:
        keep = {"truncate-empty": 0, "truncate-header": HEADER_NBYTES - 1, "truncate-payload": size - 7}[damage]
        os.truncate(path, keep)
    assert store.lookup_prefix([_hash(0), _hash(1), _hash(2)]) == 3, "lookup answers from the index, unread"
    task = store.load([_hash(0), _hash(1), _hash(2)])
    with pytest.raises(LoadError) as info:
        store.wait(task)
    assert info.value.bad_hashes == (_hash(1),)
    assert _hash(1).hex() in str(info.value)
    assert not path.exists(), "the bad file is removed so the next lookup misses"
    assert store.lookup_prefix([_hash(0), _hash(1), _hash(2)]) == 1
    assert store.stats().loads_failed == 1 and store.stats().pending == 0
    _assert_index_matches_disk(store)


def test_file_holding_another_blocks_bytes_is_rejected(store: FileStore) -> None:
    data = _store_three(store)
    store.path_of(_hash(0)).write_bytes(store.path_of(_hash(2)).read_bytes())
    with pytest.raises(LoadError, match="different block hash") as info:
        store.wait(store.load([_hash(0)]))
    assert info.value.bad_hashes == (_hash(0),)
    loaded = store.wait(store.load([_hash(2)]))
    assert loaded is not None and torch.equal(loaded[0], data[2])


def test_file_deleted_behind_the_stores_back_is_a_load_error(store: FileStore) -> None:
    _store_three(store)
    store.path_of(_hash(2)).unlink()
    with pytest.raises(LoadError, match="file missing") as info:
        store.wait(store.load([_hash(2)]))
    assert info.value.bad_hashes == (_hash(2),)
    _assert_index_matches_disk(store)


def test_damaged_file_found_after_reopening_is_still_detected(tmp_path: Path) -> None:
    with FileStore(tmp_path) as store:
        _store_three(store)
        path = store.path_of(_hash(0))
    os.truncate(path, path.stat().st_size // 2)
    with FileStore(tmp_path) as reopened:
        with pytest.raises(LoadError) as info:
            reopened.wait(reopened.load([_hash(0)]))
        assert info.value.bad_hashes == (_hash(0),)
        _assert_index_matches_disk(reopened)


# ------------------------------------------------------------------ directory
def test_directory_under_a_regular_file_is_refused_at_construction(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    with pytest.raises(StoreDirectoryError, match="not-a-directory.*not usable"):
        FileStore(blocker / "store")
    with pytest.raises(StoreDirectoryError, match="not usable"):
        FileStore(blocker)


def test_read_only_directory_is_refused_at_construction(tmp_path: Path) -> None:
    """A read-only bind mount stops root too; without mount rights, /sys (read-only for everyone) does."""
    with pytest.raises(StoreDirectoryError, match="not usable"):
        FileStore("/sys/deferdump-store")


def test_invalid_capacity_is_a_value_error(tmp_path: Path) -> None:
    for bad in (0, -3, 1.5, True, "8"):
        with pytest.raises(ValueError, match="capacity_blocks"):
            FileStore(tmp_path, capacity_blocks=bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ index
def test_index_ignores_foreign_files_and_matches_disk(tmp_path: Path) -> None:
    (tmp_path / "README").write_text("not a block")
    (tmp_path / "zz").mkdir()
    (tmp_path / "zz" / "nothex.blk").write_text("not a block")
    with FileStore(tmp_path) as store:
        _store_three(store)
        _assert_index_matches_disk(store)
        assert store.stats().blocks == 3
    assert (tmp_path / "README").exists() and (tmp_path / "zz" / "nothex.blk").exists()


def test_blocks_written_by_another_instance_are_found_and_loaded(tmp_path: Path) -> None:
    """vLLM's scheduler (lookups) and worker (dumps) are separate processes sharing one directory."""
    with FileStore(tmp_path) as scheduler_side, FileStore(tmp_path) as worker_side:
        assert scheduler_side.lookup_prefix([_hash(0)]) == 0
        data = _store_three(worker_side)
        assert scheduler_side.lookup_prefix([_hash(0), _hash(1), _hash(2), _hash(3)]) == 3
        loaded = scheduler_side.wait(scheduler_side.load([_hash(2), _hash(0)]))
        assert loaded is not None and torch.equal(loaded, data[[2, 0]])
        _assert_index_matches_disk(scheduler_side)


def test_reopening_with_a_smaller_capacity_evicts_oldest_files(tmp_path: Path) -> None:
    with FileStore(tmp_path) as store:
        for i in range(4):
            store.wait(store.dump([_hash(i)], ReadyPayload(_data(1, seed=i))))
            os.utime(store.path_of(_hash(i)), (1_000_000 + i, 1_000_000 + i))
    with FileStore(tmp_path, capacity_blocks=2) as small:
        assert small.lookup_prefix([_hash(2), _hash(3)]) == 2
        assert small.lookup_prefix([_hash(0)]) == 0 and small.lookup_prefix([_hash(1)]) == 0
        assert small.stats().evicted == 2
        _assert_index_matches_disk(small)
