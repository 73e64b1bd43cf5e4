"""The watchdog of a watched run: a `hang` verdict when the engine steps on without progress, or stalls.

Progress is any change in the scheduler's requests (ids, computed and output tokens, status). A finished
request whose blocks wait for a connector report does not change, and the engine keeps stepping (the
workload loop runs while the scheduler holds requests): a connector that never reports is seen here.
Time alone is not evidence: on a loaded machine one engine step (a first prefill, a compile) can take
longer than the bound. So a hang needs both `bound` seconds and `MIN_IDLE_STEPS` completed engine steps
without progress; an engine stuck inside one step (a connector blocking forever) is a hang after
`stall_bound(bound)` seconds without a completed step.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deferdump.tools.watch.verdict import HANG, ScenarioResult

logger = logging.getLogger(__name__)
MIN_IDLE_STEPS = 3  # completed engine steps without progress before the bound counts
POLL_S = 0.25


def stall_bound(bound: float) -> float:
    """Seconds one engine step may run before the watchdog calls it a hang (a generous multiple)."""
    return max(6 * bound, 60.0)


class Watchdog:
    """Watches the in-process scheduler from a daemon thread; `stepped` is called after each engine step.

    On a hang it calls `on_hang` with the verdict (the runner writes it and ends the process)."""

    def __init__(self, scenario: str, bound: float, on_hang: Callable[[ScenarioResult], None],
                 stall_after: float | None = None) -> None:
        self.scenario, self.bound, self.on_hang = scenario, bound, on_hang
        self.stall_after = stall_bound(bound) if stall_after is None else stall_after
        self.scheduler: Any = None
        self._steps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deferdump-watchdog", daemon=True)

    def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._thread.start()

    def stepped(self) -> None:
        """One engine step completed (called from the engine's thread; an int increment is atomic enough)."""
        self._steps += 1

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _snapshot(self) -> tuple[Any, ...]:
        for _ in range(5):  # the engine thread may change the dict while it is read
            try:
                return tuple(sorted(
                    (rid, r.num_computed_tokens, r.num_output_tokens, str(r.status))
                    for rid, r in list(self.scheduler.requests.items())))
            except RuntimeError:
                time.sleep(0.01)
        return ("unreadable", time.monotonic())

    def holders(self) -> str:
        """The scheduler's requests with their status and block count, for the verdict's detail."""
        manager = self.scheduler.kv_cache_manager
        held = []
        for rid, request in sorted(list(self.scheduler.requests.items())):
            try:
                count = sum(len([b for b in g if b]) for g in manager.get_block_ids(rid))
            except Exception:  # noqa: BLE001 - a report, best effort
                count = -1
            held.append(f"{rid} ({request.status.name.lower()}, {count} blocks)")
        return ", ".join(held) or "none"

    def _run(self) -> None:
        last, since, steps_then = self._snapshot(), time.monotonic(), self._steps
        step_seen, step_since = self._steps, time.monotonic()
        while not self._stop.wait(POLL_S):
            now, clock, steps = self._snapshot(), time.monotonic(), self._steps
            if steps != step_seen:
                step_seen, step_since = steps, clock
            if now != last:
                last, since, steps_then = now, clock, steps
                continue
            if not now:  # no request yet (or none left): nothing can hang
                continue
            if clock - since >= self.bound and steps - steps_then >= MIN_IDLE_STEPS:
                detail = (f"no progress for {self.bound:g} s over {steps - steps_then} engine steps; "
                          f"requests still holding blocks: {self.holders()}")
            elif clock - step_since >= self.stall_after:
                detail = (f"one engine step has run for {self.stall_after:g} s; "
                          f"requests: {self.holders()}")
            else:
                continue
            logger.warning("watchdog: %s", detail)
            self.on_hang(ScenarioResult(self.scenario, HANG, detail))
            return
