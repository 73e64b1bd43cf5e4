"""Run by tests/reference/test_reference_openmp.py in a process of its own, with OMP_NUM_THREADS=2 (the suite
runs its workers with 1, under which no team is ever created): prints what each kind of thread did, as JSON."""
from __future__ import annotations

import concurrent.futures
import ctypes
import json
import os
import threading

import torch

from deferdump.reference.stores.openmp import serial_openmp_in_this_thread
from deferdump.reference.stores.payload_watcher import PayloadWatcher
from deferdump.reference.stores.work_queue import WorkQueue

BIG = 4_000_000  # elements: far above ATen's grain size (32,768), so the copy opens a parallel region


def omp_max_threads() -> int:
    return ctypes.CDLL(None).omp_get_max_threads()


def threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def copy() -> dict[str, int]:
    """A dump-sized copy in the calling thread: the OS threads it created, and the thread's OpenMP size."""
    before = threads()
    source = torch.ones(BIG)
    torch.empty_like(source).copy_(source * 2)
    return {"created": len(threads() - before), "max_threads": omp_max_threads()}


def in_new_thread(serial: bool) -> dict[str, int]:
    out: list[dict[str, int]] = []

    def job() -> None:
        took = serial_openmp_in_this_thread() if serial else False
        out.append({**copy(), "took": int(took)})

    thread = threading.Thread(target=job)
    thread.start()
    thread.join()
    return out[0]


def main() -> None:
    copy()  # the main thread's own team exists before anything is counted
    report: dict[str, object] = {"main_before": omp_max_threads(), "torch_before": torch.get_num_threads()}
    report["plain"] = in_new_thread(serial=False)
    report["serial"] = in_new_thread(serial=True)
    work = WorkQueue("openmp-probe", 2)
    try:
        report["work_queue"] = [future.result(timeout=60) for future in [work.submit(copy) for _ in range(4)]]
    finally:
        work.close()

    class Done:
        def done(self) -> bool:
            return True

    seen: concurrent.futures.Future[dict[str, int]] = concurrent.futures.Future()
    watcher = PayloadWatcher("openmp-probe")
    try:
        watcher.when_done(Done(), lambda: seen.set_result(copy()))  # type: ignore[arg-type]
        report["watcher"] = seen.result(timeout=60)
    finally:
        watcher.close()
    report["main_after"] = omp_max_threads()
    report["torch_after"] = torch.get_num_threads()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
