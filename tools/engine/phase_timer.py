"""Per-step wall-clock time of each phase of the step loop (bench figures come from here).

A phase may be entered several times in one step (e.g. `save_kv_layer` once per layer); its times add
up. `end_step()` closes the step and keeps one `{phase: seconds}` dict per step, so medians and
distributions per phase are computed after the run, never inside it.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator


class PhaseTimer:
    """Accumulates seconds per phase for the current step; keeps every closed step.

    `keep_steps=False` keeps only running totals (`totals`, `closed`): a 100,000-request soak would
    otherwise hold one dict per step and its resident memory would grow with the run.
    """

    def __init__(self, *, keep_steps: bool = True) -> None:
        self._current: dict[str, float] = {}
        self.keep_steps = keep_steps
        self.steps: list[dict[str, float]] = []
        self.totals: dict[str, float] = {}
        self.closed = 0

    @contextlib.contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - started)

    def add(self, phase: str, seconds: float) -> None:
        self._current[phase] = self._current.get(phase, 0.0) + seconds

    def end_step(self) -> dict[str, float]:
        """Close the current step and return its phases."""
        closed, self._current = self._current, {}
        if self.keep_steps:
            self.steps.append(closed)
        for phase, seconds in closed.items():
            self.totals[phase] = self.totals.get(phase, 0.0) + seconds
        self.closed += 1
        return closed

    def series(self, phase: str) -> list[float]:
        """Seconds of `phase` in every closed step (0.0 where the step never entered it)."""
        return [step.get(phase, 0.0) for step in self.steps]

    def total(self, phases: tuple[str, ...]) -> list[float]:
        """Per step, the sum of several phases."""
        return [sum(step.get(phase, 0.0) for phase in phases) for step in self.steps]


def summarize(values: list[float]) -> dict[str, float | int | None]:
    """Median, min, max and count of raw figures (None when there are none)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
