"""Several TLC checks at once: each its own JVM, so threads only wait on subprocesses.

``deferdump check`` and ``deferdump bench`` (the CI tier's wall time) share this runner, so the figure the
bench reports is the time the command takes.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from deferdump.tools.tlc.manifest import CheckOutcome, ModelEntry, check_model
from deferdump.tools.tlc.output import Progress

__all__ = ["Job", "default_jobs", "model_job", "run_checks"]

Job = Callable[[Callable[[Progress], None], threading.Event], CheckOutcome]
"""A check: a function of (progress callback, cancel event)."""


def model_job(entry: ModelEntry, *, workers: int | None = None, timeout: float | None = None) -> Job:
    """The check of one manifest model as a :data:`Job` (``workers``/``timeout`` override the entry's)."""
    def run_model(progress: Callable[[Progress], None], cancel: threading.Event) -> CheckOutcome:
        return check_model(entry, workers=workers, timeout=timeout, progress=progress, cancel=cancel)
    return run_model


def default_jobs() -> int:
    """Checks run at once by default: one per CPU this process may use (TLC runs one worker each)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def run_checks(jobs: Sequence[tuple[str, Job]], parallel: int = 1, *,
               on_change: Callable[[list[str], int], None] | None = None) -> list[CheckOutcome]:
    """Run the checks, ``parallel`` at a time; outcomes come back in the order of ``jobs``.

    ``on_change(running, finished)`` hears what the running checks last reported (label and distinct
    states) and how many have finished. A KeyboardInterrupt in the calling thread (Ctrl-C) or a check
    raising sets the shared cancel event, which kills every running JVM, drops the checks not yet
    started, and re-raises.
    """
    outcomes: list[CheckOutcome | None] = [None] * len(jobs)
    cancel = threading.Event()
    running: dict[str, str] = {}
    finished = 0
    lock = threading.Lock()

    def changed() -> None:
        if on_change is not None:
            with lock:
                state = list(running.values()), finished
            on_change(*state)

    def run_one(index: int) -> None:
        nonlocal finished
        label, job = jobs[index]
        if cancel.is_set():
            return
        with lock:
            running[label] = label
        changed()

        def on_progress(report: Progress) -> None:
            if report.distinct_states is not None:
                with lock:
                    running[label] = f"{label}: {report.distinct_states:,} distinct states"
                changed()

        try:
            outcomes[index] = job(on_progress, cancel)
        except BaseException:
            cancel.set()  # before this thread takes the next check
            raise
        finally:
            with lock:
                running.pop(label, None)
                finished += 1
            changed()

    pool = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="deferdump-check")
    futures = [pool.submit(run_one, index) for index in range(len(jobs))]
    try:
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)  # Ctrl-C interrupts this wait
        for future in futures:
            if future in done:
                future.result()  # re-raises a check's exception at once, whatever its position
        for future in futures:
            future.result()
    except BaseException:
        cancel.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [outcome for outcome in outcomes if outcome is not None]
