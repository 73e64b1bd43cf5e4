"""Long-lived worker threads fed by a plain queue: what runs a `CpuDevice`'s copies and a store's jobs.

Why not a `ThreadPoolExecutor`: a dump's copy and its store job are submitted from the forward's thread
(`wait_for_save`), and an executor's `submit` builds a `Future` (a condition and its lock), a work item,
and checks whether to start a thread, on every call. Here the caller queues an object it already has (the
payload, the job), which signals its own completion through a flag its owner reads: a submit is one
`SimpleQueue.put`. The threads start on the first job and live until `close`, or until the queue is
garbage collected, or at interpreter exit (as an executor's: queued jobs still run, then the threads end).
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from deferdump.reference.stores.openmp import serial_openmp_in_this_thread

logger = logging.getLogger(__name__)


class Job(Protocol):
    """Queued work: `run` must not raise (it reports its own outcome to whoever waits for it)."""

    def run(self) -> None: ...


class WorkQueue:
    """`threads` worker threads running queued jobs in FIFO order (one thread: one at a time, in order)."""

    def __init__(self, name: str, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._name = name
        self._count = threads
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False
        # Stops the threads if this object is dropped unclosed; holds the queue, not `self`.
        self._stopper = weakref.finalize(self, _stop, self._queue, threads)
        self._stopper.atexit = False  # interpreter exit is `_at_exit`'s: it must come before threads are joined

    def put(self, job: Job) -> None:
        """Queue `job`; a thread runs it. Raises `RuntimeError` once the queue is closed."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: cannot queue work after close")
            if not self._threads:
                self._start()
            self._queue.put(job)

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        """Run `fn(*args)` on a worker, in order with the queued jobs; the general form, with a `Future`."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.put(_Call(future, fn, args))
        return future

    def alive(self) -> int:
        """How many worker threads are running (0 before the first job and after `close`)."""
        with self._lock:
            return sum(thread.is_alive() for thread in self._threads)

    def close(self) -> None:
        """Run every job already queued, then stop the threads and join them. Idempotent."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        self._stopper()  # queues one stop marker per thread, after every queued job
        _LIVE.discard(self._stopper)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()

    def _start(self) -> None:
        _LIVE.difference_update([stopper for stopper in _LIVE if not stopper.alive])  # queues collected unclosed
        for index in range(self._count):
            thread = threading.Thread(target=_work, args=(self._queue,), name=f"{self._name}-{index}")
            thread.start()
            self._threads.append(thread)
        _LIVE.add(self._stopper)


class _Call:
    """`WorkQueue.submit`'s job: runs a callable into a `Future`."""

    __slots__ = ("future", "fn", "args")

    def __init__(self, future: concurrent.futures.Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.future, self.fn, self.args = future, fn, args

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.fn(*self.args))
        except BaseException as exc:  # handed to whoever holds the future, as an executor does
            self.future.set_exception(exc)


def _work(jobs: queue.SimpleQueue[Job | None]) -> None:
    _batch_policy()
    serial_openmp_in_this_thread()  # a copy's parallel region must not slow the forward's (reference/stores/openmp.py)
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            job.run()
        except BaseException:  # a job must report its own failure; the thread must not die of one that does not
            logger.exception("work queue job %r raised", job)
        del job  # no reference kept while idle


def _batch_policy() -> None:
    """Run this thread as batch work (Linux `SCHED_BATCH`): a job is queued by the forward's thread, and a
    woken worker of the normal policy preempts it on its core, only to block at once on the GIL the forward
    holds; under `SCHED_BATCH` the wakeup does not preempt, so the forward runs on (measured: the queueing
    `read_blocks` 0.035 ms instead of 0.042-0.058 ms inside a step at load 7, docs/benchmarks-history.md). The
    worker still gets its fair share of the CPU. Left as it is where the platform has no such policy."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))  # 0: the calling thread
    except OSError as exc:  # a sandbox refusing it: the jobs run all the same
        logger.debug("SCHED_BATCH refused for %s: %s", threading.current_thread().name, exc)


def _stop(jobs: queue.SimpleQueue[Job | None], threads: int) -> None:
    for _ in range(threads):
        jobs.put(None)


_LIVE: set[weakref.finalize] = set()  # stoppers of queues whose threads were started and not yet stopped


def _at_exit() -> None:
    """At interpreter exit, before non-daemon threads are joined: let every queue finish and stop."""
    for stopper in list(_LIVE):
        stopper()
    _LIVE.clear()


# What concurrent.futures does for its executors' threads (runs before non-daemon threads are joined); a
# Python without that private hook falls back to atexit, which runs after the join: close queues explicitly.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_at_exit)
else:  # pragma: no cover - CPython 3.9+ has the hook
    import atexit

    atexit.register(_at_exit)
