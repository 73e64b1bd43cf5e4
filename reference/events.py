"""Event-handle registry: every dump's device event is acquired once and released exactly once.

UCM keeps device events in a dict keyed by an integer handle and destroys them per task after its wait
or after a failed submit. Handle 0 means "no event" (the caller synchronized instead).
Releasing a handle twice, or one never acquired, is a bug in the caller and raises.
"""
from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

from deferdump.reference.errors import EventHandleError

logger = logging.getLogger(__name__)


class EventRegistry:
    """Integer handles for device events; counts acquisitions, releases and handles leaked at close."""

    def __init__(self) -> None:
        self._events: dict[int, Any] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.acquired: int = 0
        self.released: int = 0
        self.leaked: int = 0  # handles still live when `close()` ran
        self.bad_releases: int = 0  # double or unknown releases (each also raised)

    def acquire(self, event: Any = None) -> int:
        """Register `event` (any object, e.g. a `torch.cuda.Event`) and return its non-zero handle."""
        with self._lock:
            handle = next(self._ids)
            self._events[handle] = event
            self.acquired += 1
            return handle

    def get(self, handle: int) -> Any:
        """The event behind a live handle."""
        with self._lock:
            if handle not in self._events:
                raise EventHandleError(f"event handle {handle} is not live")
            return self._events[handle]

    def release(self, handle: int) -> None:
        """Drop the event (its last reference destroys it). Raises on a double or unknown release."""
        with self._lock:
            if self._events.pop(handle, _MISSING) is _MISSING:
                self.bad_releases += 1
                raise EventHandleError(f"event handle {handle} released twice or never acquired")
            self.released += 1

    def live(self) -> int:
        """How many handles are acquired and not yet released."""
        with self._lock:
            return len(self._events)

    def live_handles(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._events)

    def close(self) -> int:
        """Drop every live handle, counting each as leaked; returns how many leaked now."""
        with self._lock:
            leaked_now = len(self._events)
            if leaked_now:
                logger.warning("event registry closed with %d live handle(s): counted as leaked", leaked_now)
            self.leaked += leaked_now
            self._events.clear()
            return leaked_now


_MISSING = object()
