"""A CPU device whose dump copies start late: a slow copy engine, so source reads stay open for a while.

On a `CpuDevice` a dump's copy usually finishes within microseconds, so a block freed or rewritten too
early would rarely overlap a read in flight, and a broken protocol would pass a soak by luck. This device
delays each copy by a random lag (seeded) before reading the blocks, keeping the read window open across
the steps where the protocol must protect it. It only uses the public `Device` API of `CpuDevice`.
"""
from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from deferdump.reference.devices import CpuDevice, FuturePayload
from deferdump.reference.kv_layout import KVCacheLayout
from deferdump.reference.stores.base import BlockPayload


class LaggingCpuDevice:
    """`CpuDevice` semantics; each `read_blocks` reads its blocks after a lag drawn from [0, `lag_s`]."""

    def __init__(self, lag_s: float, *, seed: int = 0, copy_threads: int = 1) -> None:
        if lag_s < 0:
            raise ValueError(f"lag_s must be >= 0, got {lag_s}")
        self._inner = CpuDevice(copy_threads)
        self._lag_s = lag_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="deferdump-lagging-copy")

    def register(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int | None = None) -> KVCacheLayout:
        return self._inner.register(kv_caches, num_blocks)

    @property
    def layout(self) -> KVCacheLayout:
        return self._inner.layout

    def record_event(self) -> Any:
        return self._inner.record_event()

    def synchronize(self) -> None:
        self._inner.synchronize()

    def read_blocks(
        self, block_ids: Sequence[int], *, after: Any | None = None, layer_names: Sequence[str] | None = None
    ) -> FuturePayload:
        ids = list(block_ids)
        self._inner.layout.select(layer_names)  # unknown layers fail here, at submit, like CpuDevice
        with self._lock:
            lag = self._rng.uniform(0.0, self._lag_s)
        return FuturePayload(self._pool.submit(self._late_copy, ids, after, layer_names, lag))

    def _late_copy(self, ids: list[int], after: Any, layer_names: Sequence[str] | None, lag: float) -> torch.Tensor:
        time.sleep(lag)
        return self._inner.read_blocks(ids, after=after, layer_names=layer_names).result()

    def write_blocks(self, block_ids: Sequence[int], data: torch.Tensor, *, layer_names: Sequence[str] | None = None) -> None:
        self._inner.write_blocks(block_ids, data, layer_names=layer_names)

    def settle(self, payload: BlockPayload) -> None:
        """Return once the copy can no longer read its blocks: cancelled before it started, or finished."""
        if isinstance(payload, FuturePayload) and payload.cancel():
            return
        self._inner.settle(payload)

    def checksum_blocks(self, block_ids: Sequence[int], *, layer_names: Sequence[str] | None = None) -> tuple[int, ...]:
        return self._inner.checksum_blocks(block_ids, layer_names=layer_names)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._inner.close()
