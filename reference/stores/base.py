"""The store interface every dump/load back-end implements (MemoryStore, FileStore, test stores).

It mirrors the task semantics of UCM's store base class `UcmKVStoreBaseV1`, because the protocol's
safety argument rests on them:

- `dump`/`load` start asynchronous work and return an opaque `StoreTask` at once; a refused submit
  raises (`SubmitError`, `StoreFull`) and leaves nothing behind.
- `check(task)` never blocks and never consumes the task: True once it finished, successfully or not.
- `wait(task)` blocks until the task has *really stopped touching its source/destination memory*, then
  erases it: a second `wait` (or a `check` after it) raises `TaskNotFound`. A failed task raises
  `StoreError` from `wait` only after its transfer stopped.
"""
from __future__ import annotations

import abc
import dataclasses
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch

from deferdump.reference.errors import DeferDumpError


class StoreError(DeferDumpError, RuntimeError):
    """A store operation failed (the message says which and why)."""


class TaskNotFound(StoreError):
    """`check`/`wait` on a task the store does not know: never submitted, or already waited."""


class SubmitError(StoreError):
    """The store refused to start a task (nothing was started, nothing is pending)."""


class StoreFull(SubmitError):
    """A dump was refused because the store has no room left; the refusal is counted in `StoreStats`."""


class LoadError(StoreError):
    """A block could not be loaded: missing, truncated, or failing its checksum. Never returned as data."""

    def __init__(self, message: str, bad_hashes: Sequence[bytes] = ()) -> None:
        super().__init__(message)
        self.bad_hashes: tuple[bytes, ...] = tuple(bad_hashes)


class StagedRows:
    """Rows for n blocks in a store's own, reused host memory, which the device gathers a dump straight into.

    Why: on a CPU the dump path's cost is its copies. Gathering into a fresh payload and then copying each
    row into the store costs two copies per byte, the first into freshly faulted pages; gathering into rows
    the store keeps costs one copy into memory touched before. `segments` are 2-D uint8 views
    [k_i, row_nbytes] covering rows 0..n-1 in order (a pool hands out runs of adjacent rows).

    Ownership: the store keeps the rows its dump stores. `release()` hands every other row back: the store's
    dump job calls it once the job ended (the copy had finished before the job started); whoever staged rows
    for a dump that was never submitted calls it after settling the copy. Idempotent.
    """

    def __init__(self, segments: Sequence[torch.Tensor], release: Callable[["StagedRows"], None] | None = None) -> None:
        self._segments: tuple[torch.Tensor, ...] | None = _checked_segments(segments)
        self.row_nbytes = int(self._segments[0].shape[1])
        self.num_rows = sum(int(s.shape[0]) for s in self._segments)
        self._make: Callable[[], Sequence[torch.Tensor]] | None = None
        self._release = release
        self._lock = threading.Lock()

    @classmethod
    def deferred(
        cls, num_rows: int, row_nbytes: int, make_segments: Callable[[], Sequence[torch.Tensor]],
        release: Callable[["StagedRows"], None] | None = None,
    ) -> "StagedRows":
        """Rows whose segment views `make_segments` builds on first use of `segments` (or `rows`).

        Why: a dump stages its rows on the forward's thread, where each tensor view costs microseconds of
        dispatch; the device's copy thread, which gathers into the segments, builds them instead. The views
        must cover `num_rows` rows of `row_nbytes` bytes, as for the constructor (checked when built)."""
        if num_rows < 1 or row_nbytes < 1:
            raise ValueError(f"staged rows need a positive row count and width, got {num_rows} x {row_nbytes}")
        staged = cls.__new__(cls)
        staged._segments = None
        staged.row_nbytes = row_nbytes
        staged.num_rows = num_rows
        staged._make = make_segments
        staged._release = release
        staged._lock = threading.Lock()
        return staged

    @classmethod
    def taken_on_first_use(
        cls, num_rows: int, row_nbytes: int, take: Callable[[], "StagedRows | None"]
    ) -> "StagedRows":
        """Rows that `take()` stages (e.g. `store.staging`) only when `segments` is first used, and `release`
        hands back; if `take()` offers none by then, a fresh tensor of that shape stands in.

        Why: staging picks and books a dump's rows; done on the device's copy thread, which uses them first,
        the forward's thread (`wait_for_save`) does not pay for it. Whoever releases must know the copy no
        longer runs (as for any staging: after settling it, or once it is done)."""
        taken: list[StagedRows] = []

        def make_segments() -> Sequence[torch.Tensor]:
            rows = take()
            if rows is None:
                with torch.inference_mode(False):  # a copy thread outside inference mode writes it
                    return [torch.empty((num_rows, row_nbytes), dtype=torch.uint8)]
            taken.append(rows)
            return rows.segments

        def release(_staged: StagedRows) -> None:
            for rows in taken:
                rows.release()

        return cls.deferred(num_rows, row_nbytes, make_segments, release)

    @property
    def segments(self) -> tuple[torch.Tensor, ...]:
        """The 2-D uint8 views [k_i, row_nbytes] covering rows 0..n-1 in order."""
        segments = self._segments
        if segments is None:
            with self._lock:
                if self._segments is None:
                    assert self._make is not None
                    built = _checked_segments(self._make())
                    shape = (sum(int(s.shape[0]) for s in built), int(built[0].shape[1]))
                    if shape != (self.num_rows, self.row_nbytes):
                        raise ValueError(f"staged segments cover {shape}, expected {(self.num_rows, self.row_nbytes)}")
                    self._segments = built
                segments = self._segments
        return segments

    def rows(self) -> list[torch.Tensor]:
        """One 1-D view per block, in order."""
        return [row for segment in self.segments for row in segment.unbind(0)]

    def release(self) -> None:
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release(self)


def _checked_segments(segments: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """`segments` as a tuple, refused unless they are 2-D uint8 tensors of one row width."""
    if not segments or any(s.dtype != torch.uint8 or s.dim() != 2 for s in segments):
        raise ValueError("staged rows need at least one 2-D uint8 segment")
    widths = {int(s.shape[1]) for s in segments}
    if len(widths) != 1:
        raise ValueError(f"staged segments differ in row width: {sorted(widths)}")
    return tuple(segments)


@runtime_checkable
class BlockPayload(Protocol):
    """Bytes of n blocks, produced asynchronously by a device copy (the dump's *source read*).

    `result()` blocks until the copy finished and returns a host uint8 tensor of shape [n, block_nbytes], or
    the `StagedRows` the device was asked to gather into; it raises if the copy failed. Until the copy
    finished, the source KV blocks are still being read.
    """

    def done(self) -> bool: ...

    def result(self) -> "torch.Tensor | StagedRows": ...


def payload_row_list(data: "torch.Tensor | StagedRows") -> list[torch.Tensor]:
    """A payload's bytes as one 1-D uint8 row per block."""
    return data.rows() if isinstance(data, StagedRows) else list(data.unbind(0))


class ReadyPayload:
    """A payload whose bytes already exist on the host (tests, synchronous copies)."""

    def __init__(self, data: torch.Tensor) -> None:
        if data.dtype != torch.uint8 or data.dim() != 2:
            raise ValueError(f"payload must be a 2-D uint8 tensor [n, block_nbytes], got {data.dtype} {tuple(data.shape)}")
        self._data = data

    def done(self) -> bool:
        return True

    def result(self) -> torch.Tensor:
        return self._data


_task_ids = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class StoreTask:
    """Opaque handle of one submitted dump or load. Compared by identity of `task_id`."""

    task_id: int
    kind: str  # "dump" | "load"
    block_hashes: tuple[bytes, ...]

    @staticmethod
    def new(kind: str, block_hashes: Sequence[bytes]) -> "StoreTask":
        return StoreTask(next(_task_ids), kind, tuple(block_hashes))


@dataclasses.dataclass
class StoreStats:
    """Counters a store keeps about itself (exported as metrics, asserted by soak tests)."""

    blocks: int = 0  # completed blocks held
    bytes: int = 0  # bytes of completed blocks held
    dumps_submitted: int = 0
    dumps_completed: int = 0
    dumps_failed: int = 0
    loads_completed: int = 0
    loads_failed: int = 0
    refused_full: int = 0
    evicted: int = 0
    pending: int = 0  # tasks submitted and not yet waited


class KVStore(abc.ABC):
    """An external KV block store with asynchronous, task-based dumps and loads."""

    @abc.abstractmethod
    def lookup_prefix(self, block_hashes: Sequence[bytes]) -> int:
        """How many leading hashes are stored *completely* (finished dumps only). Never raises for a miss."""

    @abc.abstractmethod
    def dump(self, block_hashes: Sequence[bytes], payload: BlockPayload) -> StoreTask:
        """Start storing `payload.result()[i]` under `block_hashes[i]`; returns at once."""

    def staging(self, num_rows: int, row_nbytes: int) -> StagedRows | None:
        """Rows of this store's own memory for a device to gather the next dump into, or None (the device
        allocates the payload). Stores that copy each row into memory they keep offer them."""
        return None

    @abc.abstractmethod
    def load(self, block_hashes: Sequence[bytes]) -> StoreTask:
        """Start reading blocks; `wait` on the task returns a host uint8 tensor [n, block_nbytes]."""

    @abc.abstractmethod
    def check(self, task: StoreTask) -> bool:
        """Non-blocking: True once the task finished (successfully or not). Raises `TaskNotFound`."""

    @abc.abstractmethod
    def wait(self, task: StoreTask, timeout: float | None = None) -> torch.Tensor | None:
        """Block until the task stopped, erase it, return the loaded bytes (loads) or None (dumps).

        Raises `TaskNotFound` for an unknown/already-waited task, `StoreError` (e.g. `LoadError`) for a
        failed one — only after its transfer stopped.
        """

    @abc.abstractmethod
    def stats(self) -> StoreStats:
        """A snapshot of the store's counters."""

    def close(self) -> None:
        """Stop background work after draining pending tasks."""
