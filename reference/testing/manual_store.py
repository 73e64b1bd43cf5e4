"""A store whose tasks finish only when a test tells them to.

Property tests and the conformance replay need to decide *when* a dump's transfer ends, so that they can
interleave "task completes" with scheduler and worker steps exactly as the spec's `TaskComplete` action
does. `ManualStore` follows `store_base` task semantics (check never consumes, wait erases, a failed task
raises from `wait`) and records every call so a test can assert which tasks were checked and waited.

Two task sets matter and have distinct names:
- `pending_tasks()`: submitted and still *running* (not yet told `complete`/`fail`) — what a test may finish;
- `outstanding_tasks()`: submitted and not yet *waited* (running or finished) — what `stats().pending` counts.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence

import torch

from deferdump.reference.stores.base import (
    BlockPayload,
    KVStore,
    LoadError,
    StoreError,
    StoreStats,
    StoreTask,
    SubmitError,
    TaskNotFound,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _ManualTask:
    """One submitted task and what it will produce when told finished."""

    task: StoreTask
    payload: BlockPayload | None  # dumps only
    finished: bool = False
    error: StoreError | None = None
    result: torch.Tensor | None = None  # loads only, set at completion


class ManualStore(KVStore):
    """An unbounded in-memory store driven by the test: `complete(task)` / `fail(task)` end transfers.

    `wait` on an unfinished task raises `StoreError("would block")` — a test that reaches it has a
    scheduling bug — unless `auto_complete_on_wait=True`, which models a blocking wait that drains the
    transfer (it completes the task first). Fault hooks, set as attributes at any time:
    `submit_fail_next` (the next N submits raise `SubmitError`), `check_fail` (while True, `check` raises
    `StoreError` and keeps the task).
    """

    def __init__(self, *, auto_complete_on_wait: bool = False) -> None:
        self.auto_complete_on_wait = auto_complete_on_wait
        self.submit_fail_next: int = 0
        self.check_fail: bool = False
        self.submitted: list[StoreTask] = []
        self.checked: list[StoreTask] = []
        self.waited: list[StoreTask] = []
        self._tasks: dict[int, _ManualTask] = {}
        self._blocks: dict[bytes, torch.Tensor] = {}
        self._stats = StoreStats()
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- submit
    def lookup_prefix(self, block_hashes: Sequence[bytes]) -> int:
        with self._lock:
            hits = 0
            for block_hash in block_hashes:
                if block_hash not in self._blocks:
                    break
                hits += 1
            return hits

    def dump(self, block_hashes: Sequence[bytes], payload: BlockPayload) -> StoreTask:
        with self._lock:
            self._refuse_if_told("dump")
            task = StoreTask.new("dump", block_hashes)
            self._tasks[task.task_id] = _ManualTask(task, payload)
            self.submitted.append(task)
            self._stats.dumps_submitted += 1
            return task

    def load(self, block_hashes: Sequence[bytes]) -> StoreTask:
        with self._lock:
            self._refuse_if_told("load")
            task = StoreTask.new("load", block_hashes)
            self._tasks[task.task_id] = _ManualTask(task, None)
            self.submitted.append(task)
            return task

    def _refuse_if_told(self, kind: str) -> None:
        if self.submit_fail_next > 0:
            self.submit_fail_next -= 1
            raise SubmitError(f"injected {kind} submit failure (ManualStore.submit_fail_next)")

    # ---------------------------------------------------------- test controls
    def complete(self, task: StoreTask) -> None:
        """End a running task's transfer successfully (a dump stores its payload's bytes now)."""
        with self._lock:
            record = self._running(task)
            record.finished = True
            if task.kind == "dump":
                self._finish_dump(record)
            else:
                self._finish_load(record)

    def fail(self, task: StoreTask, message: str = "injected task failure") -> None:
        """End a running task's transfer with an error that its `wait` will raise."""
        with self._lock:
            record = self._running(task)
            record.finished = True
            record.error = (
                LoadError(message, task.block_hashes) if task.kind == "load" else StoreError(message)
            )
            self._count_failure(task)

    def finished(self, task: StoreTask) -> bool:
        """Whether the task was told finished (not recorded as a `check`). Raises `TaskNotFound`."""
        with self._lock:
            return self._record(task).finished

    def pending_tasks(self) -> list[StoreTask]:
        """Submitted tasks still running, oldest first: those `complete`/`fail` accept."""
        with self._lock:
            return [r.task for r in self._tasks.values() if not r.finished]

    def outstanding_tasks(self) -> list[StoreTask]:
        """Submitted tasks not yet waited (running or finished), oldest first."""
        with self._lock:
            return [r.task for r in self._tasks.values()]

    def seed(self, blocks: dict[bytes, torch.Tensor]) -> None:
        """Store blocks as if dumped earlier (a warm store): later loads and lookups find them.

        Rows must be 1-D uint8 tensors; they are copied. Seeding submits no task.
        """
        for block_hash, row in blocks.items():  # all or nothing
            if row.dim() != 1 or row.dtype != torch.uint8:
                raise ValueError(f"seed row for {block_hash.hex()[:12]} must be 1-D uint8, got "
                                 f"{row.dtype} {tuple(row.shape)}")
        with self._lock:
            self._blocks.update((block_hash, row.clone()) for block_hash, row in blocks.items())

    def stored_hashes(self) -> frozenset[bytes]:
        """Hashes of blocks whose dumps completed."""
        with self._lock:
            return frozenset(self._blocks)

    # ------------------------------------------------------------ task calls
    def check(self, task: StoreTask) -> bool:
        with self._lock:
            record = self._record(task)
            self.checked.append(task)
            if self.check_fail:
                raise StoreError(f"injected check failure on task {task.task_id} (ManualStore.check_fail)")
            return record.finished

    def wait(self, task: StoreTask, timeout: float | None = None) -> torch.Tensor | None:
        with self._lock:
            record = self._record(task)
            if not record.finished:
                if not self.auto_complete_on_wait:
                    raise StoreError(f"would block: task {task.task_id} ({task.kind}) has not finished")
                self.complete(task)
            del self._tasks[task.task_id]
            self.waited.append(task)
            if record.error is not None:
                raise record.error
            return record.result

    def stats(self) -> StoreStats:
        with self._lock:
            snapshot = dataclasses.replace(self._stats)
            snapshot.blocks = len(self._blocks)
            snapshot.bytes = sum(row.numel() for row in self._blocks.values())
            snapshot.pending = len(self._tasks)
            return snapshot

    def close(self) -> None:
        """Nothing runs in the background; outstanding tasks stay for the test to inspect."""

    # --------------------------------------------------------------- helpers
    def _record(self, task: StoreTask) -> _ManualTask:
        record = self._tasks.get(task.task_id)
        if record is None:
            raise TaskNotFound(f"task {task.task_id} ({task.kind}) is unknown or already waited")
        return record

    def _running(self, task: StoreTask) -> _ManualTask:
        record = self._record(task)
        if record.finished:
            raise StoreError(f"task {task.task_id} ({task.kind}) already finished")
        return record

    def _finish_dump(self, record: _ManualTask) -> None:
        hashes = record.task.block_hashes
        assert record.payload is not None
        try:
            data = record.payload.result()
        except Exception as exc:  # the device copy failed: the dump fails, nothing is stored
            record.error = StoreError(f"dump task {record.task.task_id}: source copy failed: {exc}")
            self._count_failure(record.task)
            return
        if data.dim() != 2 or data.shape[0] != len(hashes) or data.dtype != torch.uint8:
            record.error = StoreError(
                f"dump task {record.task.task_id}: payload {data.dtype} {tuple(data.shape)} does not match "
                f"{len(hashes)} blocks"
            )
            self._count_failure(record.task)
            return
        for row, block_hash in zip(data, hashes):
            self._blocks.setdefault(block_hash, row.clone())
        self._stats.dumps_completed += 1

    def _finish_load(self, record: _ManualTask) -> None:
        hashes = record.task.block_hashes
        missing = [h for h in hashes if h not in self._blocks]
        if missing:
            record.error = LoadError(f"load task {record.task.task_id}: {len(missing)} block(s) not stored", missing)
            self._count_failure(record.task)
            return
        rows = [self._blocks[h] for h in hashes]
        if len({row.numel() for row in rows}) > 1:
            record.error = LoadError(f"load task {record.task.task_id}: blocks of different sizes", hashes)
            self._count_failure(record.task)
            return
        record.result = torch.stack(rows) if rows else torch.empty((0, 0), dtype=torch.uint8)
        self._stats.loads_completed += 1

    def _count_failure(self, task: StoreTask) -> None:
        if task.kind == "dump":
            self._stats.dumps_failed += 1
        else:
            self._stats.loads_failed += 1
