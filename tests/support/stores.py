"""Helpers shared by the store tests: payloads whose device copy ends when the test says so, and a
uniform way to start, release and settle dump tasks on every store kind."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from deferdump.reference.stores.faults import FaultConfig, FaultyStore
from deferdump.reference.stores.file import FileStore
from deferdump.reference.testing.manual_store import ManualStore
from deferdump.reference.stores.memory import MemoryStore
from deferdump.reference.stores.base import KVStore, StoreTask


class GatedPayload:
    """A device copy that is still running until `open()`; then yields `data` or raises."""

    def __init__(self, data: torch.Tensor, *, fail: bool = False) -> None:
        self.data = data
        self.fail = fail
        self.gate = threading.Event()

    def open(self) -> None:
        self.gate.set()

    def done(self) -> bool:
        return self.gate.is_set()

    def result(self) -> torch.Tensor:
        if not self.gate.wait(timeout=30):
            raise RuntimeError("gated payload never opened")
        if self.fail:
            raise RuntimeError("simulated device copy failure")
        return self.data


def rows(n: int, nbytes: int = 16, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, nbytes), dtype=torch.uint8, generator=generator)


def settle(store: KVStore, task: StoreTask, timeout: float = 10.0) -> None:
    """Poll `check` until the task finished (never consumes it)."""
    deadline = time.monotonic() + timeout
    while not store.check(task):
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task.task_id} did not finish within {timeout}s")
        time.sleep(0.002)


class StoreHarness:
    """One store plus the means to hold a dump's transfer open and end it, whatever the store kind."""

    def __init__(self, kind: str, store: KVStore) -> None:
        self.kind = kind
        self.store = store
        self._payloads: dict[int, GatedPayload] = {}

    @property
    def blocking_wait(self) -> bool:
        """Whether `wait` on a running task blocks (real stores) rather than refusing (ManualStore)."""
        return not isinstance(self.store, ManualStore)

    def dump(self, hashes: Sequence[bytes], data: torch.Tensor, *, fail: bool = False) -> StoreTask:
        payload = GatedPayload(data, fail=fail)
        task = self.store.dump(hashes, payload)
        self._payloads[task.task_id] = payload
        return task

    def release(self, task: StoreTask) -> None:
        """End the task's transfer: open its device copy (and, for ManualStore, complete it)."""
        self._payloads[task.task_id].open()
        if isinstance(self.store, ManualStore):
            self.store.complete(task)

    def dump_now(self, hashes: Sequence[bytes], data: torch.Tensor) -> None:
        task = self.dump(hashes, data)
        self.release(task)
        settle(self.store, task)
        self.store.wait(task)

    def load_now(self, hashes: Sequence[bytes]) -> torch.Tensor | None:
        task = self.store.load(hashes)
        if isinstance(self.store, ManualStore):
            self.store.complete(task)
        settle(self.store, task)
        return self.store.wait(task)


STORE_KINDS = ("manual", "memory", "file", "faulty-slow")


def make_harness(kind: str, tmp_path: Path) -> StoreHarness:
    factories: dict[str, Callable[[], KVStore]] = {
        "manual": ManualStore,
        "memory": lambda: MemoryStore(capacity_blocks=64),
        "file": lambda: FileStore(tmp_path / "blocks"),
        "faulty-slow": lambda: FaultyStore(MemoryStore(capacity_blocks=64), FaultConfig(delay_s=0.02, seed=1)),
    }
    return StoreHarness(kind, factories[kind]())
