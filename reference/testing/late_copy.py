"""The late-copy device: a `CpuDevice` whose dump copies read their source blocks as late as possible.

A shipped TEST DOUBLE, the one late-copy device of the project (property tests, conformance replays, soak,
and real vLLM through the `test_late_copy` config key). On a real copy engine a dump's copy can start long
after it was submitted; on a `CpuDevice` it usually finishes within microseconds, so a block freed or
rewritten too early would rarely overlap a read in flight and a broken protocol would pass by luck. This
device reads late, in one of three modes:

- on result (`lag_s=None`, the default): a copy reads its blocks only when the store consumes the payload
  (`result()`). Deterministic, for stores whose tasks finish when a test says so (`ManualStore`: property
  tests, conformance replays). A threaded store waits for `done()` before consuming, so it would wait
  forever: use a lag or hold there.
- lag (`lag_s >= 0`): a copy thread reads the blocks after a seeded random lag in [0, lag_s] (a slow copy
  engine); `done()` turns true then, and `result()` waits for it. For threaded stores (soak runs).
- hold (`hold=True`): a copy reads only once the connector begins a blocking wait on dump tasks after the
  copy was submitted (`before_dump_wait`, which the connector calls in `get_finished`, `handle_preemptions`
  and its fence, and `shutdown`): the latest moment the protocol admits it needs the bytes. The held copies
  are read then, on the waiting thread, before it blocks, so the result is deterministic whatever the
  machine's speed. `hold_timeout_s` is a safety net only: a copy still held that long is read by a
  watchdog thread and counted in `timeouts` (a protocol that never waits its dumps). `held` counts every
  held copy. For threaded stores inside real vLLM (`test_late_copy: "hold"`).

Either way a block rewritten before its dump read it shows up as wrong stored bytes. `settle` cancels a
copy that has not read yet (it will never read), or waits out one that is reading. Checksums
(`checksum_blocks`, taken on the connector's thread at submit) are never late.
"""
from __future__ import annotations

import concurrent.futures
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from deferdump.reference.devices import CpuDevice, DeviceError
from deferdump.reference.stores.base import BlockPayload

logger = logging.getLogger(__name__)

DEFAULT_HOLD_TIMEOUT_S = 60.0  # hold mode's safety net: far beyond any protocol wait in the tests


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


class _CopyHold:
    """Hold mode's state: the copies not yet released, in submission order, and a timeout watchdog."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.held = 0  # copies ever held
        self.timeouts = 0  # copies the watchdog released (no connector wait came within timeout_s)
        self._queue: list[tuple[LatePayload, float]] = []  # (copy, deadline), deadlines ascending
        self._cond = threading.Condition()
        self._closed = False
        self._watchdog: threading.Thread | None = None

    def hold(self, payload: LatePayload) -> None:
        with self._cond:
            if self._closed:
                raise DeviceError("LateCopyDevice is closed")
            self._queue.append((payload, time.monotonic() + self.timeout_s))
            self.held += 1
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, name="deferdump-late-copy-watchdog", daemon=True)
                self._watchdog.start()
            self._cond.notify_all()

    def release_all(self) -> None:
        """Read every held copy now, on the calling thread (the connector, about to block on dump tasks)."""
        with self._cond:
            released, self._queue = self._queue, []
        for payload, _ in released:
            payload.read_now()

    def forget(self, payload: LatePayload) -> None:
        """A settled (cancelled) copy is no longer held."""
        with self._cond:
            self._queue = [(p, deadline) for p, deadline in self._queue if p is not payload]

    def close(self) -> None:
        """Stop the watchdog; copies still held are cancelled (they will never read)."""
        with self._cond:
            self._closed = True
            left, self._queue = self._queue, []
            self._cond.notify_all()
            watchdog = self._watchdog
        for payload, _ in left:
            payload.cancel()
        if watchdog is not None:
            watchdog.join()

    def _watch(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._queue or self._queue[0][1] > time.monotonic()):
                    self._cond.wait(None if not self._queue else self._queue[0][1] - time.monotonic())
                if self._closed:
                    return
                now = time.monotonic()
                expired = [entry for entry in self._queue if entry[1] <= now]
                self._queue = self._queue[len(expired) :]
                self.timeouts += len(expired)
            logger.warning(
                "LateCopyDevice: %d held copy(ies) released by the %.1f s timeout (no connector wait came)",
                len(expired), self.timeout_s,
            )
            for payload, _ in expired:
                payload.read_now()


class LateCopyDevice(CpuDevice):
    """`CpuDevice` semantics with late reads (see the module docstring). `read_fail_next` makes the next N
    `read_blocks` raise `DeviceError` (a fault hook: nothing is read)."""

    gathers_into_staging = False  # its late copies gather into payloads of their own, never a store's rows

    def __init__(
        self,
        lag_s: float | None = None,
        *,
        seed: int = 0,
        copy_threads: int = 2,
        hold: bool = False,
        hold_timeout_s: float = DEFAULT_HOLD_TIMEOUT_S,
    ) -> None:
        if lag_s is not None and lag_s < 0:
            raise ValueError(f"lag_s must be >= 0 or None, got {lag_s}")
        if hold and lag_s is not None:
            raise ValueError("hold and lag_s are two different modes: give one of them")
        if not hold_timeout_s > 0:
            raise ValueError(f"hold_timeout_s must be > 0, got {hold_timeout_s}")
        super().__init__(copy_threads=1)
        self.read_fail_next = 0
        self._lag_s = lag_s
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._late_pool: concurrent.futures.ThreadPoolExecutor | None = None
        if lag_s is not None:
            self._late_pool = concurrent.futures.ThreadPoolExecutor(copy_threads, thread_name_prefix="deferdump-late-copy")
        self._hold = _CopyHold(hold_timeout_s) if hold else None

    @property
    def mode(self) -> str:
        """"on_result", "lag" or "hold" (see the module docstring)."""
        return "hold" if self._hold is not None else "lag" if self._late_pool is not None else "on_result"

    @property
    def held(self) -> int:
        """Hold mode: copies held so far (0 in the other modes)."""
        return self._hold.held if self._hold is not None else 0

    @property
    def timeouts(self) -> int:
        """Hold mode: held copies released by `hold_timeout_s` instead of a connector wait."""
        return self._hold.timeouts if self._hold is not None else 0

    def read_blocks(
        self, block_ids: Sequence[int], *, after: Any | None = None, layer_names: Sequence[str] | None = None
    ) -> LatePayload:
        if self.read_fail_next > 0:
            self.read_fail_next -= 1
            raise DeviceError(f"injected device read failure of {len(block_ids)} block(s) (read_fail_next)")
        ids = self._caches.checked_index(block_ids)
        layers = self.layout.select(layer_names)
        payload = LatePayload(lambda: self._gather(ids, layers), read_on_result=self.mode == "on_result")
        if self._hold is not None:
            self._hold.hold(payload)
        elif self._late_pool is not None:
            assert self._lag_s is not None
            with self._rng_lock:
                lag = self._rng.uniform(0.0, self._lag_s)
            self._late_pool.submit(_read_after, payload, lag)
        return payload

    def before_dump_wait(self) -> None:
        """Hold mode: the connector is about to block on dump tasks, so every held copy reads now."""
        if self._hold is not None:
            self._hold.release_all()

    def settle(self, payload: BlockPayload) -> None:
        if isinstance(payload, LatePayload):
            payload.cancel()
            if self._hold is not None:
                self._hold.forget(payload)
            return
        super().settle(payload)

    def close(self) -> None:
        if self._hold is not None:
            self._hold.close()
        if self._late_pool is not None:
            self._late_pool.shutdown(wait=True)
        super().close()


def _read_after(payload: LatePayload, lag: float) -> None:
    time.sleep(lag)
    payload.read_now()
