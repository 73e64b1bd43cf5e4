"""Fault injection around any store: refused submits, failing checks and waits, slow tasks.

The connector must survive every way UCM's store can fail (a refused submit, a failing `check`, a
failing or slow `wait`) without freeing a block early or leaking a task or event handle. `FaultyStore` produces those failures
reproducibly (one seeded RNG, one draw per decision) while keeping the store's own guarantees: an
injected submit failure starts nothing, an injected check failure keeps the task, an injected wait
failure first drains the inner task (its transfer really stopped) and erases it, exactly like a UCM
wait that times out.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import math
import random
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from deferdump.reference.stores.base import (
    BlockPayload, KVStore, StagedRows, StoreError, StoreStats, StoreTask, SubmitError, TaskNotFound,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FaultConfig:
    """Fault rates (probability per call, in [0, 1]), the longest extra task delay, and the RNG seed.

    Each submit (`dump`/`load`) fails with `submit_fail`, each `check` with `check_fail`, each `wait`
    with `wait_fail`; each task is slowed by a delay drawn uniformly from [0, `delay_s`].
    """

    submit_fail: float = 0.0
    check_fail: float = 0.0
    wait_fail: float = 0.0
    delay_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("submit_fail", "check_fail", "wait_fail"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"FaultConfig.{name} must be a probability in [0, 1], got {value!r}")
        if isinstance(self.delay_s, bool) or not isinstance(self.delay_s, (int, float)) or not (
            math.isfinite(self.delay_s) and self.delay_s >= 0
        ):
            raise ValueError(f"FaultConfig.delay_s must be a finite number >= 0, got {self.delay_s!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"FaultConfig.seed must be an integer, got {self.seed!r}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> "FaultConfig":
        """Build from a config dict; an unknown key is a `ValueError` naming it."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise ValueError(f"unknown fault key(s) {unknown}; expected some of {sorted(known)}")
        return cls(**dict(mapping))

    @property
    def active(self) -> bool:
        """Whether any fault or delay would ever be injected."""
        return bool(self.submit_fail or self.check_fail or self.wait_fail or self.delay_s)


class FaultyStore(KVStore):
    """Wraps `inner`, injecting the faults of `faults`; `injected` counts what was injected, by kind."""

    def __init__(self, inner: KVStore, faults: FaultConfig) -> None:
        self.inner = inner
        self.faults = faults
        self.injected: collections.Counter[str] = collections.Counter()
        self._rng = random.Random(faults.seed)
        self._ready_at: dict[int, float] = {}  # task id -> monotonic time before which the task looks unfinished
        self._lock = threading.Lock()

    def _draw(self, rate: float) -> bool:
        if rate <= 0.0:
            return False
        with self._lock:
            return self._rng.random() < rate

    def lookup_prefix(self, block_hashes: Sequence[bytes]) -> int:
        return self.inner.lookup_prefix(block_hashes)

    def dump(self, block_hashes: Sequence[bytes], payload: BlockPayload) -> StoreTask:
        self._maybe_refuse("dump")
        return self._slowed(self.inner.dump(block_hashes, payload))

    def staging(self, num_rows: int, row_nbytes: int) -> StagedRows | None:
        return self.inner.staging(num_rows, row_nbytes)

    def load(self, block_hashes: Sequence[bytes]) -> StoreTask:
        self._maybe_refuse("load")
        return self._slowed(self.inner.load(block_hashes))

    def check(self, task: StoreTask) -> bool:
        done = self.inner.check(task)  # an unknown task is TaskNotFound, not an injected fault
        if self._draw(self.faults.check_fail):
            self._count("check")
            raise StoreError(f"injected check failure on {task.kind} task {task.task_id}")
        with self._lock:
            ready_at = self._ready_at.get(task.task_id, 0.0)
        return done and time.monotonic() >= ready_at

    def wait(self, task: StoreTask, timeout: float | None = None) -> torch.Tensor | None:
        inject = self._draw(self.faults.wait_fail)
        with self._lock:
            ready_at = self._ready_at.pop(task.task_id, 0.0)
        remaining = ready_at - time.monotonic()
        timed_out = timeout is not None and remaining > timeout
        if remaining > 0:
            time.sleep(remaining)  # a slow task: even a timed-out wait drains it before reporting
        if inject or timed_out:
            try:
                self.inner.wait(task)  # drain and erase; TaskNotFound still propagates
            except TaskNotFound:
                raise
            except StoreError as exc:
                if self._still_known(task):
                    raise  # the inner wait did not drain the task (e.g. ManualStore "would block"): never hide it
                logger.debug("inner error hidden by an injected wait fault: %s", exc)
            if timed_out:
                raise StoreError(f"{task.kind} task {task.task_id} timed out after {timeout}s (slow task, drained)")
            self._count("wait")
            raise StoreError(f"injected wait failure on {task.kind} task {task.task_id} (transfer drained)")
        return self.inner.wait(task, timeout)

    def stats(self) -> StoreStats:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()

    def _still_known(self, task: StoreTask) -> bool:
        try:
            self.inner.check(task)
        except TaskNotFound:
            return False
        except StoreError:
            return True
        return True

    def _count(self, kind: str) -> None:
        with self._lock:
            self.injected[kind] += 1

    def _maybe_refuse(self, kind: str) -> None:
        if self._draw(self.faults.submit_fail):
            self._count("submit")
            raise SubmitError(f"injected {kind} submit failure")

    def _slowed(self, task: StoreTask) -> StoreTask:
        if self.faults.delay_s > 0:
            with self._lock:
                delay = self._rng.uniform(0.0, self.faults.delay_s)
                self._ready_at[task.task_id] = time.monotonic() + delay
                self.injected["delay"] += 1
        return task
