"""The late-copy device: a `CpuDevice` whose dump copies read their source blocks as late as possible.

On a real copy engine a dump's copy can start long after it was submitted; on a `CpuDevice` it usually
finishes within microseconds, so a block freed or rewritten too early would rarely overlap a read in
flight and a broken protocol would pass by luck. This device reads late, in one of two ways:

- `lag_s=None` (the default): a copy reads its blocks only when the store consumes the payload
  (`result()`). Deterministic, for stores whose tasks finish when a test says so (`ManualStore`: property
  tests, conformance replays). A threaded store waits for `done()` before consuming, so it would wait
  forever: use a lag there.
- `lag_s >= 0`: a copy thread reads the blocks after a seeded random lag in [0, lag_s] (a slow copy
  engine); `done()` turns true then, and `result()` waits for it. For threaded stores (soak runs).

Either way a block rewritten before its dump read it shows up as wrong stored bytes. `settle` cancels a
copy that has not read yet (it will never read), or waits out one that is reading.
"""
from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from deferdump.reference.devices import CpuDevice, DeviceError
from deferdump.reference.stores.base import BlockPayload


class LatePayload:
    """A copy that reads its blocks once (on `read()`), or never if cancelled first."""

    def __init__(self, gather: Callable[[], torch.Tensor], *, read_on_result: bool) -> None:
        self._gather = gather
        self._read_on_result = read_on_result
        self._lock = threading.Lock()
        self._settled = threading.Event()  # read (or failed) or cancelled
        self._data: torch.Tensor | None = None
        self._error: BaseException | None = None
        self._cancelled = False

    def done(self) -> bool:
        return self._settled.is_set()

    @property
    def read(self) -> bool:
        """Whether the source blocks were read."""
        with self._lock:
            return self._data is not None

    def read_now(self) -> None:
        """Read the source blocks unless already read or cancelled."""
        with self._lock:
            if self._data is None and self._error is None and not self._cancelled:
                try:
                    self._data = self._gather()
                except BaseException as exc:  # handed to result(), like a failed copy on a copy thread
                    self._error = exc
            self._settled.set()

    def result(self) -> torch.Tensor:
        if self._read_on_result:
            self.read_now()
        else:
            self._settled.wait()
        with self._lock:
            if self._cancelled:
                raise DeviceError("device copy was cancelled before it read its blocks")
            if self._error is not None:
                raise self._error
            assert self._data is not None
            return self._data

    def cancel(self) -> bool:
        """True when the copy will never read (cancelled now or before); waits out a read in progress."""
        with self._lock:
            if self._data is None and self._error is None:
                self._cancelled = True
                self._settled.set()
            return self._cancelled


class LateCopyDevice(CpuDevice):
    """`CpuDevice` semantics with late reads (see the module docstring). `read_fail_next` makes the next N
    `read_blocks` raise `DeviceError` (a fault hook: nothing is read)."""

    gathers_into_staging = False  # its late copies gather into payloads of their own, never a store's rows

    def __init__(self, lag_s: float | None = None, *, seed: int = 0, copy_threads: int = 2) -> None:
        if lag_s is not None and lag_s < 0:
            raise ValueError(f"lag_s must be >= 0 or None, got {lag_s}")
        super().__init__(copy_threads=1)
        self.read_fail_next = 0
        self._lag_s = lag_s
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._late_pool: concurrent.futures.ThreadPoolExecutor | None = None
        if lag_s is not None:
            self._late_pool = concurrent.futures.ThreadPoolExecutor(copy_threads, thread_name_prefix="deferdump-late-copy")

    def read_blocks(
        self, block_ids: Sequence[int], *, after: Any | None = None, layer_names: Sequence[str] | None = None
    ) -> LatePayload:
        if self.read_fail_next > 0:
            self.read_fail_next -= 1
            raise DeviceError(f"injected device read failure of {len(block_ids)} block(s) (read_fail_next)")
        ids = self._caches.checked_index(block_ids)
        layers = self.layout.select(layer_names)
        payload = LatePayload(lambda: self._gather(ids, layers), read_on_result=self._late_pool is None)
        if self._late_pool is not None:
            assert self._lag_s is not None
            with self._rng_lock:
                lag = self._rng.uniform(0.0, self._lag_s)
            self._late_pool.submit(_read_after, payload, lag)
        return payload

    def settle(self, payload: BlockPayload) -> None:
        if isinstance(payload, LatePayload):
            payload.cancel()
            return
        super().settle(payload)

    def close(self) -> None:
        if self._late_pool is not None:
            self._late_pool.shutdown(wait=True)
        super().close()


def _read_after(payload: LatePayload, lag: float) -> None:
    time.sleep(lag)
    payload.read_now()
