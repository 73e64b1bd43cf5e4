"""A block store on disk: one checksummed file per block hash, written atomically.

Crash safety: a block is written to a unique `*.tmp` file in its final directory, fsynced, renamed over
its final name with `os.replace` (atomic on POSIX), and the directory is fsynced. A crash leaves either
the old state or a complete file — never a half-written `*.blk`; leftover `*.tmp` files are removed when
a store opens the directory.

Integrity: each file carries a header (magic, format version, the block hash, payload length, a digest of
hash+payload): format 2 (written) uses xxHash's XXH3-128, ~6 GB/s on one core, so verifying does not cap a
store's bandwidth; format 1 (blake2b-256, ~0.7 GB/s) is still read and verified. Any other version is a bad
record. `load` validates every file it reads; a missing, truncated or corrupted file is
a `LoadError` naming its hash, never data, and the bad file is removed so the next lookup misses.
`lookup_prefix` does NOT read files: it answers from the in-memory index (built from file names and
sizes at start), because vLLM calls it on the scheduler's hot path — a corrupt block is found by the load
that follows, which the connector reports through `get_block_ids_with_load_errors` (vLLM recomputes).
On an index miss it stats the block's path once: vLLM's scheduler and workers are separate processes
with separate `FileStore` instances on one directory, so blocks another instance wrote are adopted.
`stats()` describes this instance's index; it equals `disk_usage()` when one instance owns the directory.

Layout: `<directory>/<first two hex digits>/<hash hex>.blk`.
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
import uuid
from pathlib import Path

import torch
import xxhash

from deferdump.reference.errors import UserError
from deferdump.reference.stores.base import StoreError
from deferdump.reference.stores.threaded import BadBlock, ThreadedStore

logger = logging.getLogger(__name__)

MAGIC = b"DDKVBLK\x00"
FORMAT_VERSION = 2  # written; FORMAT_V1 records are still read
FORMAT_V1 = 1
BLOCK_SUFFIX = ".blk"
TMP_SUFFIX = ".tmp"
_PREFIX = struct.Struct("<8sH")  # magic, version: common to every format
# magic, version, flags, hash length, payload length, digest (v2: XXH3-128, v1: blake2b-256)
_HEADERS = {FORMAT_VERSION: struct.Struct("<8sHHIQ16s"), FORMAT_V1: struct.Struct("<8sHHIQ32s")}
HEADER_NBYTES = _HEADERS[FORMAT_VERSION].size


class StoreDirectoryError(StoreError, UserError):
    """The store directory cannot be created, listed or written (raised at construction)."""


def _digest(block_hash: bytes, payload: bytes | memoryview, version: int = FORMAT_VERSION) -> bytes:
    """The record digest of hash + payload (fed in two parts: no concatenation)."""
    hasher = xxhash.xxh3_128(block_hash) if version == FORMAT_VERSION else hashlib.blake2b(block_hash, digest_size=32)
    hasher.update(payload)
    return hasher.digest()


def encode_block(block_hash: bytes, payload: bytes | memoryview) -> bytes:
    """The stored bytes of one block (a file here, a Redis value in `stores.redis`): header, hash, payload.

    `payload` may be any contiguous byte buffer (a tensor's memoryview): it is copied once, into the record.
    """
    view = memoryview(payload).cast("B")
    header = _HEADERS[FORMAT_VERSION].pack(MAGIC, FORMAT_VERSION, 0, len(block_hash), view.nbytes, _digest(block_hash, view))
    return b"".join((header, block_hash, view))


def decode_block_view(block_hash: bytes, raw: bytes | memoryview) -> memoryview:
    """The payload of a stored record, as a view into `raw` (no copy); raises `BadBlock` saying what is wrong."""
    view = memoryview(raw).cast("B")
    if view.nbytes < _PREFIX.size:
        raise BadBlock(f"truncated: {view.nbytes} bytes, header needs {HEADER_NBYTES}", corrupt=True)
    magic, version = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise BadBlock("not a block file (bad magic)", corrupt=True)
    header = _HEADERS.get(version)
    if header is None:
        raise BadBlock(f"unsupported format version {version}", corrupt=True)
    if view.nbytes < header.size:
        raise BadBlock(f"truncated: {view.nbytes} bytes, a version {version} header needs {header.size}", corrupt=True)
    _magic, _version, flags, hash_len, payload_len, digest = header.unpack_from(view)
    if flags:
        raise BadBlock(f"unknown flags {flags:#x}", corrupt=True)  # no format defines any: not ours, or damaged
    body = view[header.size:]
    if body.nbytes != hash_len + payload_len:
        raise BadBlock(f"truncated: {body.nbytes} body bytes, header says {hash_len + payload_len}", corrupt=True)
    stored_hash, payload = body[:hash_len], body[hash_len:]
    if stored_hash != block_hash:
        raise BadBlock("file holds a different block hash", corrupt=True)
    if _digest(block_hash, payload, version) != digest:
        raise BadBlock("checksum mismatch", corrupt=True)
    return payload


def decode_block(block_hash: bytes, raw: bytes) -> bytes:
    """The payload of a block file's bytes; raises `BadBlock` saying what is wrong."""
    return bytes(decode_block_view(block_hash, raw))


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore(ThreadedStore):
    """Blocks as files under `directory`; unbounded unless `capacity_blocks` is set (then LRU eviction)."""

    def __init__(self, directory: str | os.PathLike[str], capacity_blocks: int | None = None, *, workers: int = 2) -> None:
        super().__init__(capacity_blocks, workers=workers, name="file-store")
        self.directory = Path(directory)
        try:
            self._open_directory()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------- start-up
    def _open_directory(self) -> None:
        """Create/probe the directory, drop crash leftovers, rebuild the index from file names and sizes."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".probe-{uuid.uuid4().hex}{TMP_SUFFIX}"
            with open(probe, "wb") as handle:
                handle.write(b"probe")
                handle.flush()
                os.fsync(handle.fileno())
            probe.unlink()
        except OSError as exc:
            raise StoreDirectoryError(
                f"FileStore directory {str(self.directory)!r} is not usable: {exc.strerror or exc}"
            ) from exc
        found: list[tuple[float, bytes, int]] = []
        removed_tmp = 0
        for root, _dirs, files in os.walk(self.directory):
            for name in files:
                path = Path(root) / name
                if name.endswith(TMP_SUFFIX):
                    path.unlink(missing_ok=True)
                    removed_tmp += 1
                    continue
                block_hash = self._hash_of(path)
                if block_hash is None:
                    continue
                info = path.stat()
                found.append((info.st_mtime, block_hash, info.st_size))
        if removed_tmp:
            logger.warning("FileStore %s: removed %d unfinished *.tmp file(s) left by a crash", self.directory, removed_tmp)
        with self._lock:
            for _mtime, block_hash, size in sorted(found):
                self._ledger.add_existing(block_hash, size)
            for block_hash in self._ledger.shrink_to_capacity():
                self._drop_block(block_hash)
                self._stats.evicted += 1
        logger.info("FileStore %s: %d block(s) indexed", self.directory, len(found))

    def _hash_of(self, path: Path) -> bytes | None:
        """The block hash a file name encodes, or None for files that are not ours."""
        if path.suffix != BLOCK_SUFFIX or path.parent.parent != self.directory:
            return None
        try:
            block_hash = bytes.fromhex(path.stem)
        except ValueError:
            return None
        return block_hash if block_hash and path.parent.name == path.stem[:2] else None

    def _adopt_block(self, block_hash: bytes) -> bool:
        try:
            size = self.path_of(block_hash).stat().st_size
        except OSError:
            return False
        self._ledger.add_existing(block_hash, size)
        return True

    def path_of(self, block_hash: bytes) -> Path:
        """Where a block's file lives (tests corrupt files through it)."""
        hex_name = block_hash.hex()
        return self.directory / hex_name[:2] / f"{hex_name}{BLOCK_SUFFIX}"

    # ---------------------------------------------------------------- hooks
    def _write_block(self, block_hash: bytes, row: torch.Tensor) -> int:
        final = self.path_of(block_hash)
        if not final.parent.is_dir():
            final.parent.mkdir(exist_ok=True)
            _fsync_directory(self.directory)
        data = encode_block(block_hash, row.contiguous().numpy().data)  # one copy: into the record
        tmp = final.with_name(f"{final.name}.{uuid.uuid4().hex}{TMP_SUFFIX}")
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_directory(final.parent)
        return len(data)

    def _read_block(self, block_hash: bytes) -> torch.Tensor:
        try:
            raw = self.path_of(block_hash).read_bytes()
        except FileNotFoundError:
            raise BadBlock("file missing", corrupt=True) from None
        payload = decode_block(block_hash, raw)
        return torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)

    def _drop_block(self, block_hash: bytes) -> None:
        self.path_of(block_hash).unlink(missing_ok=True)

    # ---------------------------------------------------------------- audit
    def disk_usage(self) -> tuple[int, int]:
        """(block files, their bytes) found on disk now — soak tests compare it with `stats()`."""
        files = total = 0
        for root, _dirs, names in os.walk(self.directory):
            for name in names:
                path = Path(root) / name
                if self._hash_of(path) is not None:
                    files += 1
                    total += path.stat().st_size
        return files, total
