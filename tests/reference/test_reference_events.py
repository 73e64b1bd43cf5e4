"""EventRegistry: non-zero handles, release exactly once, live and leak counts."""
from __future__ import annotations

import pytest

from deferdump.reference import EventHandleError, EventRegistry


def test_acquire_gives_distinct_non_zero_handles_holding_their_event() -> None:
    events = EventRegistry()
    first, second = events.acquire("e1"), events.acquire("e2")
    assert 0 not in (first, second) and first != second
    assert (events.get(first), events.get(second)) == ("e1", "e2")
    assert events.live() == 2 and events.live_handles() == {first, second}


def test_release_exactly_once_then_double_release_raises_and_is_counted() -> None:
    events = EventRegistry()
    handle = events.acquire(object())
    events.release(handle)
    assert events.live() == 0 and (events.acquired, events.released) == (1, 1)
    with pytest.raises(EventHandleError, match="twice"):
        events.release(handle)
    with pytest.raises(EventHandleError):
        events.release(12345)
    with pytest.raises(EventHandleError):
        events.get(handle)
    assert events.bad_releases == 2 and events.released == 1


def test_close_counts_live_handles_as_leaked() -> None:
    events = EventRegistry()
    events.release(events.acquire())
    events.acquire()
    events.acquire()
    assert events.close() == 2
    assert events.leaked == 2 and events.live() == 0
    assert events.close() == 0 and events.leaked == 2
