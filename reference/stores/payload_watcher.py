"""Start work once a device copy finished, without parking a worker thread on it meanwhile.

A dump's payload is the device copy still reading KV blocks; its bytes exist only once `done()`. If the
store's workers blocked in `payload.result()`, a few slow (or, in tests, deliberately held) copies would
starve every other dump and load. One watcher thread instead polls `done()` of the waiting payloads with
a short back-off and hands each finished one to its callback (which submits the write job).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from deferdump.reference.stores.openmp import serial_openmp_in_this_thread
from deferdump.reference.stores.base import BlockPayload

logger = logging.getLogger(__name__)

MIN_POLL_S = 0.0002
MAX_POLL_S = 0.005


@dataclasses.dataclass
class _Watched:
    payload: BlockPayload
    callback: Callable[[], None]


class PayloadWatcher:
    """Calls `callback()` once `payload.done()`; the thread starts on first use and stops at `close()`."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._watched: list[_Watched] = []
        self._busy = 0  # entries taken from the list whose callbacks are still running
        self._closing = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def when_done(self, payload: BlockPayload, callback: Callable[[], None]) -> None:
        with self._cond:
            if self._closing:
                raise RuntimeError("payload watcher is closed")
            self._watched.append(_Watched(payload, callback))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"{self._name}-watcher", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def watching(self) -> int:
        with self._cond:
            return len(self._watched) + self._busy

    def drain(self) -> None:
        """Block until every watched payload finished and its callback ran."""
        with self._cond:
            while self._watched or self._busy:
                self._cond.wait(0.05)

    def close(self) -> None:
        """Drain, then stop the thread."""
        self.drain()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        serial_openmp_in_this_thread()  # callbacks run here (reference/stores/openmp.py)
        interval = MIN_POLL_S
        while True:
            with self._cond:
                while not self._watched and not self._closing:
                    self._cond.wait()
                    interval = MIN_POLL_S
                if self._closing and not self._watched:
                    return
                ready = [entry for entry in self._watched if _is_done(entry.payload)]
                if ready:
                    self._watched = [entry for entry in self._watched if entry not in ready]
                    self._busy += len(ready)
                else:
                    self._cond.wait(interval)
                    interval = min(interval * 2, MAX_POLL_S)
                    continue
            interval = MIN_POLL_S
            for entry in ready:
                try:
                    entry.callback()
                except Exception:  # a callback must not kill the watcher: the task would hang forever
                    logger.exception("payload watcher callback failed")
                finally:
                    with self._cond:
                        self._busy -= 1
                        self._cond.notify_all()


def _is_done(payload: BlockPayload) -> bool:
    try:
        return bool(payload.done())
    except Exception:  # a broken copy is finished: its result() raises and fails the task
        return True
