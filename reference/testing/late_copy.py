"""The late-copy device: a `CpuDevice` whose dump copies read their source blocks as late as possible.

On a real copy engine a dump's copy can start long after it was submitted; on a `CpuDevice` it usually
finishes within microseconds, so a block freed or rewritten too early would rarely overlap a read in
flight and a broken protocol would pass by luck. This device makes the read as late as the store lets
it: a copy reads its blocks only when the store consumes the payload (`result()`), and — with
`lag_s > 0` — not before a random lag (seeded, drawn from [0, lag_s]) after submission has passed.
A block rewritten before its dump finished therefore shows up as wrong stored bytes, deterministically
under `ManualStore` (the test decides when a task consumes its payload) and with wall-clock lags under a
threaded store. `settle` cancels a copy that has not read yet, or waits for one that is reading.

One device serves the property tests, the conformance replay and the simulated engine's soak runs.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from deferdump.reference.devices import CpuDevice, DeviceError
from deferdump.reference.stores.base import BlockPayload


class LatePayload:
    """A copy that reads its blocks when first asked for (not before `not_before`), or never if cancelled."""

    def __init__(self, gather: Callable[[], torch.Tensor], not_before: float = 0.0) -> None:
        self._gather = gather
        self._not_before = not_before
        self._lock = threading.Lock()
        self._data: torch.Tensor | None = None
        self._cancelled = False

    def done(self) -> bool:
        with self._lock:
            return self._data is not None or self._cancelled

    @property
    def read(self) -> bool:
        """Whether the source blocks were read."""
        with self._lock:
            return self._data is not None

    def result(self) -> torch.Tensor:
        with self._lock:
            if self._cancelled:
                raise DeviceError("device copy was cancelled before it read its blocks")
            if self._data is None:
                delay = self._not_before - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self._data = self._gather()
            return self._data

    def cancel(self) -> bool:
        """True when the copy will never read (cancelled now or before); waits out a read in progress."""
        with self._lock:
            if self._data is None:
                self._cancelled = True
            return self._cancelled


class LateCopyDevice(CpuDevice):
    """`CpuDevice` semantics; every `read_blocks` reads its blocks when the store consumes the payload,
    after a seeded lag in [0, `lag_s`] (0: no wall-clock lag). `read_fail_next` makes the next N reads
    raise `DeviceError` (a fault hook: nothing is read)."""

    def __init__(self, lag_s: float = 0.0, *, seed: int = 0) -> None:
        if lag_s < 0:
            raise ValueError(f"lag_s must be >= 0, got {lag_s}")
        super().__init__(copy_threads=1)
        self.read_fail_next = 0
        self._lag_s = lag_s
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()

    def read_blocks(
        self, block_ids: Sequence[int], *, after: Any | None = None, layer_names: Sequence[str] | None = None
    ) -> LatePayload:
        if self.read_fail_next > 0:
            self.read_fail_next -= 1
            raise DeviceError(f"injected device read failure of {len(block_ids)} block(s) (read_fail_next)")
        ids = self._caches.checked_index(block_ids)
        layers = self.layout.select(layer_names)
        not_before = 0.0
        if self._lag_s > 0:
            with self._rng_lock:
                not_before = time.monotonic() + self._rng.uniform(0.0, self._lag_s)
        return LatePayload(lambda: self._gather(ids, layers), not_before)

    def settle(self, payload: BlockPayload) -> None:
        if isinstance(payload, LatePayload):
            payload.cancel()
            return
        super().settle(payload)
