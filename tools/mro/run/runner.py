"""Run the judged classes: replay each case's counterexample in a child process and fold the outcome into
the verdict; a case with no counterexample (safe, or unknown although its model passed) is run through
sampled schedules of its model instead; and where neither reaches a hazard, the class is run through
schedules the explorer chooses from its own answers (:mod:`.explore`). Running only ever confirms a hazard,
withdraws a reading's claim of one, or overrules a reading's `safe` with a hazard the class itself reaches;
it never makes a class safe (a run covers some schedules, not every way vLLM can drive the class)."""
from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from deferdump.tools.mro.judge import (
    ConnectorJudgement,
    ContextJudgement,
    MroReport,
    block_references,
    counterexample_json,
)
from deferdump.tools.mro.run.explore import EXPLORED_SCHEDULES
from deferdump.tools.mro.run.replay import ReplayOutcome
from deferdump.tools.mro.run.search import SEARCH_BEHAVIOURS

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_REPLAY_TIMEOUT", "RunBudget", "explore_in_child", "fold", "replay_in_child", "run_report",
           "search_in_child"]

DEFAULT_REPLAY_TIMEOUT = 60.0
SEARCH_TLC_TIMEOUT = 300.0  # TLC's sampling of a case's model (the hybrid one takes about 35 s here)


@dataclasses.dataclass(frozen=True)
class RunBudget:
    """How many schedules a case without a deciding counterexample runs through: ``sampled`` behaviours of its
    model (TLC's simulation), then ``explored`` schedules of the explorer. A case that finds no hazard spends
    both, so they bound ``--run``'s time; the CLI runs the defaults, and a smaller budget only finds less (a
    hazard found is a run of the class either way; running never makes a case safe)."""

    sampled: int = SEARCH_BEHAVIOURS
    explored: int = EXPLORED_SCHEDULES

    def __post_init__(self) -> None:
        if self.sampled < 1 or self.explored < 1:
            raise ValueError(f"a run budget needs at least one schedule of each kind, not {self}")


def replay_in_child(paths: Sequence[Path | str], cls: str, judgement: ContextJudgement,
                    store_modules: Sequence[str], timeout: float = DEFAULT_REPLAY_TIMEOUT,
                    traces: Sequence[Sequence[Mapping[str, Any]]] | None = None) -> tuple[ReplayOutcome, int]:
    """Replay ``traces`` (default: ``judgement``'s counterexample) against ``cls`` in a fresh interpreter,
    until the first hazard. Returns the deciding outcome and how many traces were replayed."""
    if traces is None:
        assert judgement.counterexample is not None
        traces = [counterexample_json(judgement.counterexample, judgement.model)["trace"]]  # type: ignore[list-item]
    request = {"paths": [str(Path(p).resolve()) for p in paths], "class": cls, "path": judgement.context.path,
               "case": judgement.context.case, "traces": list(traces), "store_modules": list(store_modules)}
    outcomes = _in_child(request, timeout, "the replay")
    if isinstance(outcomes, ReplayOutcome):
        return outcomes, 0
    return outcomes[-1], len(outcomes)


def _in_child(request: Mapping[str, Any], timeout: float, what: str) -> list[ReplayOutcome] | ReplayOutcome:
    """Run ``request`` in ``python -m deferdump.tools.mro.run.child``: its outcomes, or why there are none."""
    try:
        done = subprocess.run([sys.executable, "-m", "deferdump.tools.mro.run.child"], input=json.dumps(request),
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return ReplayOutcome("not_runnable", f"{what} did not end within {timeout:g} s (the class may block)")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return ReplayOutcome("not_runnable", f"{what}'s process failed: {last}")
    return [ReplayOutcome(d["status"], d["detail"], d.get("hazard"), d.get("step"), d.get("calls", []))
            for d in json.loads(done.stdout)]


def search_in_child(paths: Sequence[Path | str], cls: str, judgement: ContextJudgement,
                    store_modules: Sequence[str], timeout: float = DEFAULT_REPLAY_TIMEOUT,
                    behaviours: int = SEARCH_BEHAVIOURS) -> ReplayOutcome:
    """Run the class through every schedule of its case's model (:mod:`.search`): the first hazard, or why
    none was found."""
    from deferdump.tools.mro.run.search import SearchUnavailable, schedule_traces

    try:
        traces = schedule_traces(judgement.model or "", judgement.model_files, num=behaviours,
                                 timeout=max(timeout, SEARCH_TLC_TIMEOUT))
    except SearchUnavailable as error:
        return ReplayOutcome("not_runnable", str(error))
    outcome, replayed = replay_in_child(paths, cls, judgement, store_modules, timeout, traces)
    if outcome.status == "reproduced":
        outcome.detail = f"{outcome.detail} (sampled schedule {replayed} of {len(traces)})"
    elif outcome.status == "diverged":
        outcome.detail = (f"no hazard in {len(traces)} sampled schedules of the model (each ran to its end or "
                          f"until the class answered otherwise); last: {outcome.detail}")
    return outcome


def explore_in_child(paths: Sequence[Path | str], cls: str, path: str, case: str, store_modules: Sequence[str],
                     timeout: float = DEFAULT_REPLAY_TIMEOUT, schedules: int | None = None) -> ReplayOutcome:
    """Run the class through the explorer's schedules of the case (``path``, ``case``; :mod:`.explore`), in a
    fresh interpreter."""
    request = {"paths": [str(Path(p).resolve()) for p in paths], "class": cls, "path": path, "case": case,
               "store_modules": list(store_modules),
               "explore": {"schedules": schedules or EXPLORED_SCHEDULES, "seed": 1}}
    outcomes = _in_child(request, timeout, "the explorer")
    return outcomes if isinstance(outcomes, ReplayOutcome) else outcomes[-1]


def fold(judgement: ContextJudgement, outcome: ReplayOutcome, replayed: bool = True) -> ContextJudgement:
    """The case's verdict after running: an unknown or safe case whose class reaches a hazard when run is
    unsafe (a safe one: the reading was wrong); an unsafe the class does not reproduce although it ran is
    unknown; everything else keeps the reading's verdict. ``replayed``: ``outcome`` is the replay of the
    case's counterexample (not a run through other schedules)."""
    verdict, reasons, source = judgement.verdict, judgement.reasons, "reading"
    if outcome.status == "reproduced" and (judgement.verdict in ("unknown", "safe") or not replayed):
        verdict, source = "unsafe", "running"
        reasons = ()
    elif outcome.status == "reproduced":
        source = "reading, replayed"
    elif outcome.status == "diverged" and judgement.verdict == "unsafe":
        verdict = "unknown"
        reasons = (f"reading finds {judgement.violated}, but the class run through that counterexample does not "
                   f"reach it: {outcome.detail}",)
    violated = outcome.hazard if source == "running" else judgement.violated
    return dataclasses.replace(judgement, verdict=verdict, violated=violated, reasons=reasons, run=outcome,
                               source=source)


def _pins_blocks(report: MroReport, own: str | None, judgement: ContextJudgement) -> str | None:
    """Why the class is not run in this case: it (``own``, the class's ``judge.block_references``) or the case's
    inner class takes references on vLLM's blocks, and the replay's engine binds it no block pool and frees
    blocks when its requests let go of them, so a hazard a run reaches may be one the class's pin prevents (a
    wrong unsafe from running)."""
    inner = judgement.context.inner
    why = own or (block_references(report.hierarchy, inner) if inner else None)
    return f"{why}; not run: the replay's engine has no block pool for the class to pin blocks in" if why else None


def _cannot_build(outcome: ReplayOutcome) -> bool:
    """The class could not be imported or built: no other case of it can run either."""
    return outcome.status == "not_runnable" and (outcome.detail.startswith("importing ")
                                                 or ".__init__" in outcome.detail)


def run_report(report: MroReport, paths: Sequence[Path | str], store_modules: Sequence[str] = (),
               timeout: float = DEFAULT_REPLAY_TIMEOUT,
               on_replay: Callable[[str, str], None] | None = None, budget: RunBudget = RunBudget()) -> MroReport:
    """``report`` with each case run: its counterexample replayed against its class, or (none, or the class
    answered otherwise) the class run through sampled schedules of the case's model, and (no hazard yet)
    through the explorer's schedules, as many as ``budget`` allows."""
    connectors: dict[str, ConnectorJudgement] = {}
    for name, connector in report.connectors.items():
        cases = []
        unbuildable: ReplayOutcome | None = None  # the class cannot be imported or built: no case can run
        own_pins = block_references(report.hierarchy, name)
        for judgement in connector.judgements:
            if unbuildable is not None:
                cases.append(fold(judgement, dataclasses.replace(unbuildable)))
                continue
            pinned = _pins_blocks(report, own_pins, judgement)
            if pinned:  # the run's vLLM frees blocks as the model does: a hazard it reaches may be pinned away
                cases.append(dataclasses.replace(judgement, reasons=tuple(dict.fromkeys((*judgement.reasons, pinned)))))
                continue
            searched = False
            if judgement.counterexample is None and not judgement.model_files:  # no model to run (a timeout)
                outcome = ReplayOutcome("diverged", "no model to replay or sample")
            elif judgement.counterexample is not None:
                if on_replay is not None:
                    on_replay(name, judgement.context.key)
                outcome, _ = replay_in_child(paths, name, judgement, store_modules, timeout)
                searched = (judgement.verdict == "unknown" and outcome.status == "diverged"
                            and bool(judgement.model_files))
            else:  # the model passed (safe, or unknown for what it leaves out): the class runs its schedules
                searched = True
            if searched:
                if on_replay is not None:
                    on_replay(name, f"{judgement.context.key}, every schedule")
                outcome = search_in_child(paths, name, judgement, store_modules, timeout, budget.sampled)
            replayed = not searched
            if outcome.status == "diverged" or (outcome.status == "not_runnable" and not _cannot_build(outcome)):
                if on_replay is not None:
                    on_replay(name, f"{judgement.context.key}, explored")
                explored = explore_in_child(paths, name, judgement.context.path, judgement.context.case,
                                            store_modules, timeout, budget.explored)
                if explored.status == "reproduced" or _cannot_build(explored):
                    outcome, replayed = explored, False
                else:
                    outcome = dataclasses.replace(outcome, detail=f"{outcome.detail}; explored: {explored.detail}")
            if _cannot_build(outcome):
                unbuildable = outcome
            logger.info("%s %s: %s %s: %s", name, judgement.context.key, "schedules" if searched else "replay",
                        outcome.status, outcome.detail)
            cases.append(fold(judgement, outcome, replayed))
            if judgement.verdict == "safe" and cases[-1].verdict == "unsafe":  # a reader bug worth reporting
                logger.warning("%s %s: read as safe, but the class run reaches %s: %s", name, judgement.context.key,
                               outcome.hazard, outcome.detail)
        connectors[name] = connector.rejudged(tuple(cases))
    return dataclasses.replace(report, connectors=connectors)
