"""The queue-fed worker threads behind a device's copies and a store's jobs: FIFO, failures contained,
every queued job run before `close` returns, and no thread left behind (closed, dropped, or at exit)."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import pytest

from deferdump.reference.stores.work_queue import WorkQueue
from support.live_threads import new_threads


class _Record:
    def __init__(self, log: list[int], value: int, gate: threading.Event | None = None) -> None:
        self.log, self.value, self.gate = log, value, gate

    def run(self) -> None:
        if self.gate is not None:
            assert self.gate.wait(10)
        self.log.append(self.value)




def test_one_thread_runs_jobs_in_order_and_close_runs_what_is_queued_then_joins() -> None:
    before = set(threading.enumerate())
    work = WorkQueue("test-queue", 1)
    assert work.alive() == 0, "no thread before the first job"
    log: list[int] = []
    gate = threading.Event()
    work.put(_Record(log, 0, gate))
    for value in range(1, 20):
        work.put(_Record(log, value))
    assert work.alive() == 1 and log == []
    closer = threading.Thread(target=work.close)
    closer.start()
    closer.join(0.1)
    assert closer.is_alive(), "close waits for the queued jobs"
    gate.set()
    closer.join(10)
    assert log == list(range(20))
    assert work.alive() == 0 and new_threads(before) == set()
    with pytest.raises(RuntimeError, match="after close"):
        work.put(_Record(log, 99))
    work.close()  # idempotent


def test_a_raising_job_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    class Boom:
        def run(self) -> None:
            raise RuntimeError("job bug")

    work = WorkQueue("test-queue", 1)
    log: list[int] = []
    work.put(Boom())
    work.put(_Record(log, 1))
    work.close()
    assert log == [1]
    assert "job bug" in caplog.text


def test_submit_hands_results_and_errors_through_a_future_in_order_with_jobs() -> None:
    work = WorkQueue("test-queue", 2)
    try:
        assert work.submit(lambda a, b: a + b, 2, 3).result(5) == 5
        failed = work.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(5)
        assert work.alive() == 2
    finally:
        work.close()
    assert work.alive() == 0


def test_a_queue_dropped_without_close_stops_its_threads() -> None:
    before = set(threading.enumerate())
    work = WorkQueue("test-dropped", 2)
    log: list[int] = []
    work.put(_Record(log, 1))
    del work
    gc.collect()
    assert new_threads(before) == set()
    assert log == [1], "the queued job still ran"


def test_threads_must_be_positive() -> None:
    with pytest.raises(ValueError, match="threads"):
        WorkQueue("bad", 0)


def test_the_interpreter_exits_with_a_queue_never_closed_after_running_its_queued_jobs() -> None:
    """Non-daemon threads blocked on their queue would hang interpreter exit; the exit hook stops them,
    after the jobs already queued (as an executor's threads do)."""
    script = (
        "import threading, time\n"
        "from deferdump.reference.stores.work_queue import WorkQueue\n"
        "work = WorkQueue('exit-test', 1)\n"
        "class Slow:\n"
        "    def run(self):\n"
        "        time.sleep(0.2); print('ran', flush=True)\n"
        "work.put(Slow())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran"


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this platform")
def test_workers_run_as_batch_work_so_a_wakeup_does_not_preempt_the_forward() -> None:
    work = WorkQueue("test-batch", 1)
    try:
        assert work.submit(lambda: os.sched_getscheduler(0)).result(5) == os.SCHED_BATCH
        assert os.sched_getscheduler(0) != os.SCHED_BATCH, "the caller's own policy is untouched"
    finally:
        work.close()
