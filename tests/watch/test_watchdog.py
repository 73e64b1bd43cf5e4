"""The watchdog on a stand-in scheduler: a hang needs both time and completed engine steps without
progress, so one slow step (a loaded machine's first prefill) is not a hang, and a stuck step is one."""
from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from deferdump.tools.watch.verdict import HANG, ScenarioResult
from deferdump.tools.watch.watchdog import MIN_IDLE_STEPS, Watchdog, stall_bound


class Status(enum.Enum):
    RUNNING = 1
    FINISHED_STOPPED = 2


@dataclass
class Request:
    num_computed_tokens: int = 16
    num_output_tokens: int = 0
    status: Status = Status.FINISHED_STOPPED


@dataclass
class Manager:
    def get_block_ids(self, rid: str) -> tuple[list[int], ...]:
        return ([1, 2, 0],)


@dataclass
class Scheduler:
    requests: dict[str, Request] = field(default_factory=dict)
    kv_cache_manager: Manager = field(default_factory=Manager)


class Verdicts:
    def __init__(self) -> None:
        self.got: list[ScenarioResult] = []
        self.event = threading.Event()

    def __call__(self, result: ScenarioResult) -> None:
        self.got.append(result)
        self.event.set()


def _watch(scheduler: Scheduler, bound: float, stall_after: float | None = None) -> tuple[Watchdog, Verdicts]:
    verdicts = Verdicts()
    dog = Watchdog("prefix", bound, verdicts, stall_after=stall_after)
    dog.start(scheduler)
    return dog, verdicts


def _step_for(dog: Watchdog, seconds: float, change: Any = None, until: threading.Event | None = None) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (until is not None and until.is_set()):
        dog.stepped()
        if change is not None:
            change()
        time.sleep(0.02)


def test_steps_without_progress_are_a_hang_naming_the_holders() -> None:
    dog, verdicts = _watch(Scheduler({"r0-p0": Request()}), bound=0.3)
    stepping = threading.Thread(target=_step_for, args=(dog, 10.0, None, verdicts.event))
    stepping.start()
    assert verdicts.event.wait(10.0)
    dog.stop()
    stepping.join()
    (result,) = verdicts.got
    assert result.verdict == HANG
    assert "no progress for 0.3 s" in result.detail
    assert "r0-p0 (finished_stopped, 2 blocks)" in result.detail


def test_one_long_step_is_not_a_hang() -> None:
    """Far past the bound with no step completed, but under the stall bound: no verdict."""
    scheduler = Scheduler({"r0-p0": Request(status=Status.RUNNING)})
    dog, verdicts = _watch(scheduler, bound=0.2)
    dog.stepped()  # fewer than MIN_IDLE_STEPS, then one step that runs on
    assert not verdicts.event.wait(1.5)
    dog.stop()
    dog.join(2.0)
    assert verdicts.got == []


def test_a_stuck_step_is_a_hang_after_the_stall_bound() -> None:
    dog, verdicts = _watch(Scheduler({"r0-p0": Request(status=Status.RUNNING)}), bound=0.2, stall_after=0.6)
    assert verdicts.event.wait(10.0)
    dog.stop()
    (result,) = verdicts.got
    assert result.verdict == HANG and "one engine step has run for 0.6 s" in result.detail
    assert "r0-p0 (running, 2 blocks)" in result.detail


def test_progress_every_step_is_never_a_hang() -> None:
    request = Request(status=Status.RUNNING)
    dog, verdicts = _watch(Scheduler({"r0-p0": request}), bound=0.2, stall_after=0.6)

    def advance() -> None:
        request.num_output_tokens += 1

    _step_for(dog, 1.5, advance)
    dog.stop()
    dog.join(2.0)
    assert verdicts.got == []


def test_no_requests_is_never_a_hang() -> None:
    dog, verdicts = _watch(Scheduler(), bound=0.1, stall_after=0.3)
    _step_for(dog, 1.0)
    assert not verdicts.event.wait(0.5)
    dog.stop()
    assert verdicts.got == []


@pytest.mark.parametrize(("bound", "expected"), [(10, 60.0), (20, 120.0), (1, 60.0)])
def test_stall_bound_is_a_generous_multiple(bound: float, expected: float) -> None:
    assert stall_bound(bound) == expected
    assert MIN_IDLE_STEPS >= 2
