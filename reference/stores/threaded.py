"""Task machinery shared by the real stores: submit → worker thread → check/wait, with UCM's semantics.

`MemoryStore` and `FileStore` differ only in where a block's bytes live; everything the protocol's safety
rests on is here, once: a dump's job first waits for its payload (the device copy still reading the KV
blocks; the copy's done-callback, or for payloads that can only be polled a `PayloadWatcher`, queues the
job once the copy is done, so no worker idles meanwhile), then writes block by block on the store's
long-lived worker threads (`WorkQueue`); `check` reads the job's done flag; `wait` erases the task under
the lock and then blocks until the job *really* ended — on a timeout it asks the job to stop and keeps
draining, and only then raises. Capacity, LRU and pinning live in `BlockLedger`.
"""
from __future__ import annotations

import abc
import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence

import torch

from deferdump.reference.errors import DeferDumpError
from deferdump.reference.stores.block_ledger import BlockLedger
from deferdump.reference.stores.payload_watcher import PayloadWatcher
from deferdump.reference.stores.work_queue import WorkQueue
from deferdump.reference.stores.base import (
    BlockPayload,
    KVStore,
    LoadError,
    StagedRows,
    StoreError,
    StoreFull,
    StoreStats,
    StoreTask,
    SubmitError,
    TaskNotFound,
)

logger = logging.getLogger(__name__)


class BadBlock(DeferDumpError):
    """A stored block cannot be returned as data (missing, truncated, checksum mismatch).

    The record decoders (`file.decode_block_view`) raise it; inside a store the job that reads a block catches
    it, fails that load (a `LoadError`) and forgets a corrupt copy, so no store method lets it out."""

    def __init__(self, reason: str, *, corrupt: bool) -> None:
        super().__init__(reason)
        self.corrupt = corrupt  # True: the stored copy exists but is bad and must be forgotten


class _Cancelled(StoreError):
    """A timed-out task's job stopped before its next block."""


class CancelFlag:
    """Set by a timed-out `wait`: the job stops before its next block (a flag, not an `Event`: nobody
    blocks on it, and the forward's thread makes one per dump)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class _Job:
    """A submitted task: its body, its outcome once `done`, and whether a timed-out wait asked it to stop.

    `done`, `result` and `error` change only under the store's lock, which its condition notifies."""

    __slots__ = ("store", "task", "body", "cancel", "done", "result", "error")

    def __init__(self, store: "ThreadedStore", task: StoreTask, body: Callable[[CancelFlag], torch.Tensor | None]) -> None:
        self.store = store
        self.task = task
        self.body = body
        self.cancel = CancelFlag()
        self.done = False
        self.result: torch.Tensor | None = None
        self.error: StoreError | None = None

    def run(self) -> None:
        """On a store worker (`WorkQueue`)."""
        self.store._execute(self)

    def launch(self) -> None:
        """The payload's copy is done (its callback or the watcher, on that thread): queue the job."""
        self.store._launch(self)


def _check_hashes(block_hashes: Sequence[bytes]) -> tuple[bytes, ...]:
    hashes = tuple(block_hashes)
    if set(map(type, hashes)) <= {bytes} and b"" not in hashes:  # the common case, in C-level scans
        return hashes
    for block_hash in hashes:
        if not isinstance(block_hash, bytes) or not block_hash:
            raise ValueError(f"block hashes must be non-empty bytes, got {block_hash!r}")
    return hashes


class ThreadedStore(KVStore):
    """A `KVStore` running dumps and loads on `workers` long-lived threads fed by a queue; subclasses say where
    bytes live."""

    def __init__(self, capacity_blocks: int | None, *, workers: int, name: str) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._ledger = BlockLedger(capacity_blocks)
        self._lock = threading.RLock()
        self._done = threading.Condition(self._lock)  # notified whenever a job ends or is queued
        self._jobs: dict[int, _Job] = {}
        self._unqueued = 0  # jobs waiting for their payload's copy; `close` waits for them to be queued
        self._stats = StoreStats()
        self._closed = False
        self._workers = WorkQueue(name, workers)
        self._watcher = PayloadWatcher(name)  # payloads that can only be polled

    # ------------------------------------------------------ subclass hooks
    @abc.abstractmethod
    def _write_block(self, block_hash: bytes, row: torch.Tensor) -> int:
        """Store one block's bytes durably (worker thread, no lock held); return its stored size."""

    @abc.abstractmethod
    def _read_block(self, block_hash: bytes) -> torch.Tensor:
        """Return one stored block as a 1-D uint8 tensor, or raise `BadBlock` (worker thread)."""

    @abc.abstractmethod
    def _drop_block(self, block_hash: bytes) -> None:
        """Delete a block's bytes after the ledger forgot it (eviction, corruption); called under the lock."""

    def _drop_blocks(self, block_hashes: Sequence[bytes]) -> None:
        """`_drop_block` for each of a dump's evicted blocks, in order; a store may do it in one batch."""
        for block_hash in block_hashes:
            self._drop_block(block_hash)

    def _reclaim(self) -> None:
        """Release what `_drop_block` only unlinked (worker thread, no lock held), so a dump's caller never pays
        for freeing the blocks its dump evicted. Every eviction happens in `dump`, which then starts a job,
        and every job calls this first: dropped bytes live at most until that job starts."""

    # ------------------------------------------------------------- KVStore
    def _adopt_block(self, block_hash: bytes) -> bool:
        """Index a block another store instance wrote (shared back-ends); called under the lock on a miss."""
        return False

    def _known(self, block_hash: bytes) -> bool:
        return block_hash in self._ledger or self._adopt_block(block_hash)

    def lookup_prefix(self, block_hashes: Sequence[bytes]) -> int:
        with self._lock:
            hits = 0
            for block_hash in block_hashes:
                if not self._known(block_hash):
                    break
                self._ledger.touch(block_hash)
                hits += 1
            return hits

    def dump(self, block_hashes: Sequence[bytes], payload: BlockPayload) -> StoreTask:
        hashes = _check_hashes(block_hashes)
        with self._lock:
            self._refuse_if_closed("dump")
            task = StoreTask.new("dump", hashes)
            try:
                evicted = self._ledger.reserve_dump(task.task_id, hashes)
            except StoreFull:
                self._stats.refused_full += 1
                raise
            self._drop_blocks(evicted)
            self._stats.evicted += len(evicted)
            self._start(task, lambda cancel: self._run_dump(task, payload, cancel), payload)
            self._stats.dumps_submitted += 1
            return task

    def load(self, block_hashes: Sequence[bytes]) -> StoreTask:
        hashes = _check_hashes(block_hashes)
        with self._lock:
            self._refuse_if_closed("load")
            task = StoreTask.new("load", hashes)
            self._ledger.pin_load(task.task_id, hashes)
            for block_hash in hashes:
                self._ledger.touch(block_hash)
            self._start(task, lambda cancel: self._run_load(task, cancel))
            return task

    def check(self, task: StoreTask) -> bool:
        with self._lock:
            return self._job(task).done

    def wait(self, task: StoreTask, timeout: float | None = None) -> torch.Tensor | None:
        with self._lock:
            job = self._job(task)
            del self._jobs[task.task_id]  # erased first: a concurrent second wait raises TaskNotFound
            if not job.done and not self._done.wait_for(lambda: job.done, timeout):
                job.cancel.set()
                self._done.wait_for(lambda: job.done)  # drain: the transfer must really stop before we report
                raise StoreError(
                    f"{task.kind} task {task.task_id} timed out after {timeout}s; its transfer was stopped and drained"
                )
        if job.error is not None:
            raise job.error
        return job.result

    def stats(self) -> StoreStats:
        with self._lock:
            snapshot = dataclasses.replace(self._stats)
            snapshot.blocks = len(self._ledger)
            snapshot.bytes = self._ledger.bytes
            snapshot.pending = len(self._jobs)
            return snapshot

    def close(self) -> None:
        """Refuse new tasks, let running ones finish; un-waited tasks can still be waited."""
        with self._lock:
            self._closed = True
            self._done.wait_for(lambda: not self._unqueued)  # every running copy's job is queued
        self._watcher.close()
        self._workers.close()  # runs every queued job, then stops the threads
        self._reclaim()

    def __enter__(self) -> "ThreadedStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------- jobs
    def _start(
        self, task: StoreTask, body: Callable[[CancelFlag], torch.Tensor | None], payload: BlockPayload | None = None
    ) -> None:
        """Register the task (lock held); queue `body` for a worker now, or once `payload`'s copy is done."""
        job = _Job(self, task, body)
        self._jobs[task.task_id] = job
        if payload is None or payload.done():
            self._workers.put(job)
            return
        self._unqueued += 1
        try:
            if callable(getattr(payload, "add_done_callback", None)):
                payload.add_done_callback(job.launch)
            else:
                self._watcher.when_done(payload, job.launch)
        except BaseException:
            self._unqueued -= 1
            raise

    def _launch(self, job: _Job) -> None:
        """Queue a job whose payload's copy is done (on the thread that saw it done)."""
        try:
            self._workers.put(job)
        finally:
            with self._lock:
                self._unqueued -= 1
                self._done.notify_all()

    def _execute(self, job: _Job) -> None:
        """Run one job; whatever happens, count it, free its pins/slots, then mark it done."""
        task = job.task
        result: torch.Tensor | None = None
        error: StoreError | None = None
        try:
            self._reclaim()
            result = job.body(job.cancel)
        except StoreError as exc:
            error = exc
        except Exception as exc:  # a back-end bug or OS error: still a failed task, never a lost one
            logger.exception("%s task %d failed unexpectedly", task.kind, task.task_id)
            error = StoreError(f"{task.kind} task {task.task_id} failed: {exc}")
            error.__cause__ = exc
        with self._lock:
            self._ledger.release(task.task_id)
            key = ("dumps_" if task.kind == "dump" else "loads_") + ("completed" if error is None else "failed")
            setattr(self._stats, key, getattr(self._stats, key) + 1)
            job.result, job.error, job.done = result, error, True
            job.body = None  # type: ignore[assignment]  # drops the payload it closed over
            self._done.notify_all()

    @staticmethod
    def _payload_rows(task: StoreTask, payload: BlockPayload) -> list[torch.Tensor]:
        """The dump's bytes once its device copy finished: one 1-D uint8 row per block, or `StoreError`."""
        try:
            data = payload.result()
        except Exception as exc:
            raise StoreError(f"dump task {task.task_id}: source copy failed: {exc}") from exc
        hashes = task.block_hashes
        if isinstance(data, StagedRows):
            if data.num_rows != len(hashes):
                raise StoreError(f"dump task {task.task_id}: {data.num_rows} staged rows for {len(hashes)} blocks")
            return data.rows()
        well_formed = isinstance(data, torch.Tensor) and data.dtype == torch.uint8 and data.dim() == 2
        if not well_formed or data.shape[0] != len(hashes):
            shape = tuple(data.shape) if isinstance(data, torch.Tensor) else type(data).__name__
            raise StoreError(f"dump task {task.task_id}: payload {shape} does not hold {len(hashes)} uint8 block rows")
        return list(data.unbind(0))

    @staticmethod
    def _release_staged(payload: BlockPayload) -> None:
        """Hand back staged rows the dump did not keep; only called once the payload's copy is done."""
        if payload.done():
            try:
                data = payload.result()
            except Exception:  # a failed copy: it staged nothing it still writes, but release what it held
                data = getattr(payload, "staged", None)
            if isinstance(data, StagedRows):
                data.release()

    def _run_dump(self, task: StoreTask, payload: BlockPayload, cancel: CancelFlag) -> None:
        try:
            self._dump_rows(task, payload, cancel)
        finally:
            self._release_staged(payload)
        return None

    def _dump_rows(self, task: StoreTask, payload: BlockPayload, cancel: CancelFlag) -> None:
        data = self._payload_rows(task, payload)
        hashes = task.block_hashes
        for index, block_hash in enumerate(hashes):
            if cancel.is_set():
                raise _Cancelled(f"dump task {task.task_id} stopped after a timed-out wait ({index} block(s) written)")
            with self._lock:
                if block_hash in self._ledger:
                    self._ledger.touch(block_hash)  # dedupe: already stored by an earlier dump
                    continue
            size = self._write_block(block_hash, data[index])
            with self._lock:
                self._ledger.commit(task.task_id, block_hash, size)
        return None

    def _run_load(self, task: StoreTask, cancel: CancelFlag) -> torch.Tensor:
        rows: list[torch.Tensor] = []
        bad: dict[bytes, str] = {}
        for block_hash in task.block_hashes:
            if cancel.is_set():
                raise _Cancelled(f"load task {task.task_id} stopped after a timed-out wait")
            with self._lock:
                stored = self._known(block_hash)
            if not stored:
                bad[block_hash] = "not stored"
                continue
            try:
                rows.append(self._read_block(block_hash))
            except BadBlock as exc:
                bad[block_hash] = str(exc)
                if exc.corrupt:
                    self._forget_corrupt(block_hash, str(exc))
        if not bad and len({row.numel() for row in rows}) > 1:
            bad = {h: "block sizes differ within one load" for h in task.block_hashes}
        if bad:
            detail = "; ".join(f"{h.hex()}: {reason}" for h, reason in bad.items())
            raise LoadError(f"load task {task.task_id}: {len(bad)} bad block(s): {detail}", list(bad))
        return torch.stack(rows) if rows else torch.empty((0, 0), dtype=torch.uint8)

    def _forget_corrupt(self, block_hash: bytes, reason: str) -> None:
        with self._lock:
            if self._ledger.discard(block_hash):
                logger.warning("store block %s is corrupt (%s): removed", block_hash.hex(), reason)
                self._drop_block(block_hash)

    # ------------------------------------------------------------- helpers
    def _job(self, task: StoreTask) -> _Job:
        job = self._jobs.get(task.task_id)
        if job is None:
            raise TaskNotFound(f"{task.kind} task {task.task_id} is unknown or already waited")
        return job

    def _refuse_if_closed(self, kind: str) -> None:
        if self._closed:
            raise SubmitError(f"{kind} refused: the store is closed")
