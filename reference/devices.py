"""Devices: copy whole KV blocks out of (dumps) and back into (loads) the registered KV caches.

A dump's *source read* is asynchronous: `read_blocks` returns a `BlockPayload` at once and the caller
(the forward pass) never blocks on it. Until the payload is done, the source blocks are being read —
exactly the window the deferred-dump protocol must keep them from being freed and rewritten.

- `CpuDevice`: copies on long-lived copy threads fed by a queue (torch kernels release the GIL). Given
  `into` (a store's `StagedRows`), it gathers straight into the store's own rows: one copy per dumped byte.
- `CudaDevice`: a dedicated copy stream that first waits on an event recorded on the compute stream,
  gathers the blocks with one `index_select` per layer into a staging tensor and copies it with one
  `non_blocking` D2H copy into pinned host memory; completion is an event (`query`/`synchronize`).
  This is vLLM's offloading connector's design (a copy stream ordered after the compute stream by an
  event, into pinned host buffers), batched.

The connector calls `before_dump_wait` whenever it is about to block on pending dump tasks: a no-op here,
it lets the test double `LateCopyDevice` (reference/testing/late_copy.py) hold copies until that moment.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from deferdump.reference.errors import DeviceError
from deferdump.reference.kv_layout import KVCacheLayout, LayerLayout, describe_kv_caches
from deferdump.reference.stores.base import BlockPayload, StagedRows
from deferdump.reference.stores.work_queue import WorkQueue

logger = logging.getLogger(__name__)


@runtime_checkable
class Device(Protocol):
    """What the connector needs from a device (see module docstring)."""

    def register(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int | None = None) -> KVCacheLayout: ...

    @property
    def layout(self) -> KVCacheLayout: ...

    def record_event(self) -> Any | None: ...

    def synchronize(self) -> None: ...

    def read_blocks(
        self,
        block_ids: Sequence[int],
        *,
        after: Any | None = None,
        layer_names: Sequence[str] | None = None,
        into: StagedRows | None = None,
    ) -> BlockPayload: ...

    def write_blocks(
        self, block_ids: Sequence[int], data: torch.Tensor, *, layer_names: Sequence[str] | None = None
    ) -> None: ...

    def settle(self, payload: BlockPayload) -> None: ...

    def before_dump_wait(self) -> None:
        """The connector is about to block on pending dump tasks (`get_finished`, `handle_preemptions`,
        `shutdown`). A hook for devices that schedule copies by the protocol's waits (the test double
        `LateCopyDevice` in hold mode reads its held copies here); a no-op for real devices."""
        ...

    def checksum_blocks(
        self, block_ids: Sequence[int], *, layer_names: Sequence[str] | None = None
    ) -> tuple[int, ...]: ...

    def close(self) -> None: ...


def checksum_rows(data: torch.Tensor) -> tuple[int, ...]:
    """CRC-32 of each row of a host uint8 tensor [n, nbytes] (verify_dumps)."""
    host = data.detach().cpu().contiguous()
    return tuple(zlib.crc32(row.numpy().tobytes()) for row in host)


class _RegisteredCaches:
    """The KV tensors and their layout; shared by both devices."""

    def __init__(self) -> None:
        self._caches: dict[str, torch.Tensor] = {}
        self._layout: KVCacheLayout | None = None

    def register(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int | None) -> KVCacheLayout:
        self._caches = dict(kv_caches)
        self._layout = describe_kv_caches(self._caches, num_blocks)
        return self._layout

    @property
    def layout(self) -> KVCacheLayout:
        if self._layout is None:
            raise DeviceError("register_kv_caches was not called: no KV caches to copy from")
        return self._layout

    def tensor(self, layer: LayerLayout) -> torch.Tensor:
        return self._caches[layer.name]

    def checked_index(self, block_ids: Sequence[int]) -> list[int]:
        ids = list(map(int, block_ids))
        num_blocks = self.layout.num_blocks
        if ids and (min(ids) < 0 or max(ids) >= num_blocks):  # C-level scans; the list only on a failure
            bad = [b for b in ids if not 0 <= b < num_blocks]
            raise DeviceError(f"block ids {bad[:8]} outside [0, {num_blocks})")
        return ids


_QUEUED, _RUNNING, _DONE = 0, 1, 2


class CopyPayload:
    """A `BlockPayload` filled by a `CpuDevice` copy thread (into `staged` rows, when given).

    Why not a `Future`: the forward's thread makes one per dump, and a future's condition and lock cost it
    more than the copy's own bookkeeping. State is a plain attribute (`done` reads it without a lock); the
    device's one condition guards transitions and wakes whoever waits in `result`.
    """

    __slots__ = ("_fn", "_args", "staged", "_sync", "_state", "_value", "_error", "_callbacks")

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], sync: threading.Condition, staged: StagedRows | None = None
    ) -> None:
        self._fn: Callable[..., Any] | None = fn
        self._args: tuple[Any, ...] = args
        self.staged = staged
        self._sync = sync
        self._state = _QUEUED
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[], None]] | None = None

    def run(self) -> None:
        """The copy (device thread): skipped if cancelled first; then its waiters and callbacks hear of it."""
        with self._sync:
            if self._state != _QUEUED:
                return
            self._state = _RUNNING
        fn, args = self._fn, self._args
        try:
            value, error = fn(*args), None  # type: ignore[misc]
        except BaseException as exc:  # handed to result(), as an executor future would
            value, error = None, exc
        self._finish(value, error)

    def done(self) -> bool:
        return self._state == _DONE

    def result(self) -> Any:
        if self._state != _DONE:
            with self._sync:
                while self._state != _DONE:
                    self._sync.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once the copy finished, failed or was cancelled (at once if it already did), on
        the thread that finished it: a store starts its write job then, with no polling delay."""
        with self._sync:
            if self._state != _DONE:
                if self._callbacks is None:
                    self._callbacks = [callback]
                else:
                    self._callbacks.append(callback)
                return
        _call_back(callback)

    def cancel(self) -> bool:
        """Cancel a copy that has not started; True when it will never touch the source."""
        with self._sync:
            if self._state != _QUEUED:
                return self._state == _DONE and isinstance(self._error, _Cancelled)
            callbacks = self._settle(None, _Cancelled())
        _call_all(callbacks)
        return True

    def _finish(self, value: Any, error: BaseException | None) -> None:
        with self._sync:
            callbacks = self._settle(value, error)
        _call_all(callbacks)

    def _settle(self, value: Any, error: BaseException | None) -> list[Callable[[], None]] | None:
        """Done, with `value` or `error` (lock held); returns the callbacks to run once it is released."""
        self._value, self._error, self._state = value, error, _DONE
        self._fn, self._args = None, ()
        callbacks, self._callbacks = self._callbacks, None
        self._sync.notify_all()
        return callbacks


_Cancelled = concurrent.futures.CancelledError  # what a cancelled copy's result() raises, as a future's did


def _call_all(callbacks: list[Callable[[], None]] | None) -> None:
    for callback in callbacks or ():
        _call_back(callback)


def _call_back(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:  # the copy thread must not die of it
        logger.exception("device copy done-callback failed")


class CpuEvent:
    """A compute-stream event on CPU: work is synchronous, so recording it is all there is."""

    __slots__ = ()


class CpuDevice:
    """KV caches in host memory; copies run on `copy_threads` long-lived worker threads, in order."""

    gathers_into_staging = True  # read_blocks(into=StagedRows) writes the store's rows directly

    def __init__(self, copy_threads: int = 2) -> None:
        if copy_threads < 1:
            raise ValueError(f"copy_threads must be >= 1, got {copy_threads}")
        self._caches = _RegisteredCaches()
        self._pool = WorkQueue("deferdump-copy", copy_threads)
        self._sync = threading.Condition(threading.Lock())  # the payloads' state changes and their waiters
        self._closed = threading.Event()

    def register(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int | None = None) -> KVCacheLayout:
        for name, tensor in kv_caches.items():
            if tensor.device.type != "cpu":
                raise DeviceError(f"CpuDevice: layer {name} lives on {tensor.device}, not on the CPU")
        return self._caches.register(kv_caches, num_blocks)

    @property
    def layout(self) -> KVCacheLayout:
        return self._caches.layout

    def record_event(self) -> CpuEvent:
        return CpuEvent()

    def synchronize(self) -> None:
        """Nothing is queued asynchronously on the CPU compute path."""

    def read_blocks(
        self,
        block_ids: Sequence[int],
        *,
        after: Any | None = None,
        layer_names: Sequence[str] | None = None,
        into: StagedRows | None = None,
    ) -> CopyPayload:
        if self._closed.is_set():
            raise DeviceError("CpuDevice is closed")
        ids = self._caches.checked_index(block_ids)
        layers = self.layout.select(layer_names)
        if into is not None:
            _check_staged(into, len(ids), self.layout.row_nbytes(layer_names))
            payload = CopyPayload(self._gather_staged, (ids, layers, into), self._sync, into)
            self._pool.put(payload)
            return payload
        # Allocated here, not on the copy thread: a payload larger than a glibc per-thread arena (64 MiB)
        # would be mmap'd fresh and page-faulted on every dump there; the caller's arena can reuse it.
        # vLLM calls wait_for_save inside torch.inference_mode(): a tensor made there is an inference tensor,
        # which the copy thread (outside inference mode) may not write into. The payload is a normal tensor.
        with torch.inference_mode(False):
            out = torch.empty((len(ids), sum(layer.block_nbytes for layer in layers)), dtype=torch.uint8)
        payload = CopyPayload(self._gather, (ids, layers, out), self._sync)
        self._pool.put(payload)
        return payload

    def _gather(self, ids: list[int], layers: tuple[LayerLayout, ...], out: torch.Tensor | None = None) -> torch.Tensor:
        index = torch.tensor(ids, dtype=torch.long)
        if out is None:
            out = torch.empty((len(ids), sum(layer.block_nbytes for layer in layers)), dtype=torch.uint8)
        offset = 0
        for layer in layers:
            layer.gather_into(self._caches.tensor(layer), index, out[:, offset : offset + layer.block_nbytes])
            offset += layer.block_nbytes
        return out

    def _gather_staged(self, ids: list[int], layers: tuple[LayerLayout, ...], into: StagedRows) -> StagedRows:
        """Each run of adjacent staged rows is one `out` of `_gather` (one index_select per layer)."""
        start = 0
        for segment in into.segments:
            count = int(segment.shape[0])
            self._gather(ids[start : start + count], layers, segment)
            start += count
        return into

    def write_blocks(
        self, block_ids: Sequence[int], data: torch.Tensor, *, layer_names: Sequence[str] | None = None
    ) -> None:
        ids = self._caches.checked_index(block_ids)
        layers = self.layout.select(layer_names)
        _check_rows(data, len(ids), layers)
        index = torch.tensor(ids, dtype=torch.long)
        offset = 0
        for layer in layers:
            layer.scatter(self._caches.tensor(layer), index, data[:, offset : offset + layer.block_nbytes])
            offset += layer.block_nbytes

    def settle(self, payload: BlockPayload) -> None:
        """Return only once the copy can no longer touch its source blocks (cancel it, or let it finish)."""
        if isinstance(payload, CopyPayload) and (payload.done() or payload.cancel()):
            return  # finished (or failed) already: nothing left to wait for
        _drain(payload)

    def before_dump_wait(self) -> None:
        """Nothing to do: copies run on their own (see `Device.before_dump_wait`)."""

    def checksum_blocks(self, block_ids: Sequence[int], *, layer_names: Sequence[str] | None = None) -> tuple[int, ...]:
        ids = self._caches.checked_index(block_ids)
        return checksum_rows(self._gather(ids, self.layout.select(layer_names)))

    def close(self) -> None:
        """Finish the queued copies (their payloads stay valid), then stop and join the copy threads."""
        self._closed.set()
        self._pool.close()


class CudaPayload:
    """Pinned host bytes filled by a D2H copy on the copy stream; done when its event fired."""

    def __init__(self, host: torch.Tensor, done_event: Any, keepalive: tuple[torch.Tensor, ...]) -> None:
        self._host = host
        self._done = done_event
        self._keepalive: tuple[torch.Tensor, ...] | None = keepalive  # device tensors the copy still reads

    def done(self) -> bool:
        finished = bool(self._done.query())
        if finished:
            self._keepalive = None
        return finished

    def result(self) -> torch.Tensor:
        self._done.synchronize()
        self._keepalive = None
        return self._host


class CudaDevice:
    """KV caches on a CUDA device; dumps on a dedicated copy stream, loads on a dedicated load stream."""

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        if not torch.cuda.is_available():
            raise DeviceError("CudaDevice needs CUDA, and torch.cuda.is_available() is False")
        self._device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if self._device.type != "cuda":
            raise DeviceError(f"CudaDevice needs a CUDA device, got {self._device}")
        self._copy_stream = torch.cuda.Stream(device=self._device)
        self._load_stream = torch.cuda.Stream(device=self._device)
        self._caches = _RegisteredCaches()

    @property
    def copy_stream(self) -> Any:
        return self._copy_stream

    def register(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int | None = None) -> KVCacheLayout:
        for name, tensor in kv_caches.items():
            if tensor.device != self._device:
                raise DeviceError(f"CudaDevice({self._device}): layer {name} lives on {tensor.device}")
        return self._caches.register(kv_caches, num_blocks)

    @property
    def layout(self) -> KVCacheLayout:
        return self._caches.layout

    def _compute_stream(self) -> Any:
        return torch.cuda.current_stream(self._device)

    def record_event(self) -> Any:
        """An event marking everything queued on the compute stream so far (the KV writes of this step)."""
        event = torch.cuda.Event()
        event.record(self._compute_stream())
        return event

    def synchronize(self) -> None:
        self._compute_stream().synchronize()

    gathers_into_staging = False  # D2H copies land in pinned host buffers of its own

    def read_blocks(
        self,
        block_ids: Sequence[int],
        *,
        after: Any | None = None,
        layer_names: Sequence[str] | None = None,
        into: StagedRows | None = None,
    ) -> CudaPayload:
        if into is not None:
            raise DeviceError("CudaDevice copies into its own pinned buffers; it takes no staged rows")
        ids = self._caches.checked_index(block_ids)
        layers = self.layout.select(layer_names)
        nbytes = sum(layer.block_nbytes for layer in layers)
        host = torch.empty((len(ids), nbytes), dtype=torch.uint8, pin_memory=True)
        index_host = torch.tensor(ids, dtype=torch.long).pin_memory()
        compute = self._compute_stream()
        with torch.cuda.stream(self._copy_stream):
            if after is not None:
                self._copy_stream.wait_event(after)
            else:
                self._copy_stream.wait_stream(compute)
            index = index_host.to(self._device, non_blocking=True)
            parts = [layer.gather(self._caches.tensor(layer), index) for layer in layers]
            staging = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
            host.copy_(staging, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._copy_stream)
        return CudaPayload(host, done, (staging, index, index_host))

    def write_blocks(
        self, block_ids: Sequence[int], data: torch.Tensor, *, layer_names: Sequence[str] | None = None
    ) -> None:
        """Copy host rows into blocks; returns once they landed, and orders the compute stream after them."""
        ids = self._caches.checked_index(block_ids)
        layers = self.layout.select(layer_names)
        _check_rows(data, len(ids), layers)
        source = data.contiguous()
        if not source.is_pinned():
            source = source.pin_memory()
        compute = self._compute_stream()
        with torch.cuda.stream(self._load_stream):
            self._load_stream.wait_stream(compute)
            rows = source.to(self._device, non_blocking=True)
            index = torch.tensor(ids, dtype=torch.long).to(self._device, non_blocking=True)
            offset = 0
            for layer in layers:
                layer.scatter(self._caches.tensor(layer), index, rows[:, offset : offset + layer.block_nbytes])
                offset += layer.block_nbytes
            done = torch.cuda.Event()
            done.record(self._load_stream)
        compute.wait_event(done)
        done.synchronize()  # loads are synchronous in this connector; also keeps `source` alive long enough

    def settle(self, payload: BlockPayload) -> None:
        _drain(payload)

    def before_dump_wait(self) -> None:
        """Nothing to do: copies run on the copy stream on their own (see `Device.before_dump_wait`)."""

    def checksum_blocks(self, block_ids: Sequence[int], *, layer_names: Sequence[str] | None = None) -> tuple[int, ...]:
        ids = self._caches.checked_index(block_ids)
        index = torch.tensor(ids, dtype=torch.long, device=self._device)
        layers = self.layout.select(layer_names)
        parts = [layer.gather(self._caches.tensor(layer), index) for layer in layers]
        return checksum_rows(torch.cat(parts, dim=1) if len(parts) > 1 else parts[0])

    def close(self) -> None:
        self._copy_stream.synchronize()
        self._load_stream.synchronize()


def _drain(payload: BlockPayload) -> None:
    try:
        payload.result()
    except Exception as exc:  # a failed copy has stopped too; the caller only needs it stopped
        logger.debug("settled a failed device copy: %s", exc)


def _check_staged(into: StagedRows, n: int, nbytes: int) -> None:
    if into.num_rows != n or into.row_nbytes != nbytes:
        raise DeviceError(f"staged rows are [{into.num_rows}, {into.row_nbytes}], the copy needs [{n}, {nbytes}]")


def _check_rows(data: torch.Tensor, n: int, layers: tuple[LayerLayout, ...]) -> None:
    nbytes = sum(layer.block_nbytes for layer in layers)
    if data.dtype != torch.uint8 or tuple(data.shape) != (n, nbytes):
        raise DeviceError(f"expected host bytes uint8 [{n}, {nbytes}], got {data.dtype} {tuple(data.shape)}")
