"""Replaying ITF traces against an implementation, comparing state after every step.

Input validation comes first and is all-or-nothing: every file is decoded and checked (ITF structure,
value tags, the ``action`` variable and its names known to the driver) before any step runs, so a bad
file never leaves a half-replayed report. A divergence names the file, the step index, the action and
a readable diff; the failing trace is shrunk (:mod:`.shrink`) and the shortest failing trace written
beside it as ``<name>.min.itf.json``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deferdump.tools.tlc.manifest import Manifest, ManifestError, load_manifest
from deferdump.tools.tlc.values import ItfError, ItfTrace, Record, Value, format_value, value_key

from deferdump.conformance.diff import diff_states
from deferdump.conformance.driver import Driver, DriverFactory, StepMismatch
from deferdump.conformance.errors import TraceInputError
from deferdump.conformance.itfload import TraceLoader
from deferdump.conformance.trace_checks import ACTION, validate_actions
from deferdump.conformance.stategraph import StateGraph, StateKey, state_key

__all__ = ["Divergence", "ReplayReport", "TraceOutcome", "load_traces", "replay_loaded", "replay_paths",
           "replay_states", "replay_trace"]

log = logging.getLogger(__name__)



@dataclass
class Divergence:
    """Where a trace and the implementation part ways."""

    file: str
    step: int  # index of the state whose comparison (or action) failed
    action: str  # the action record of that state, as TLA+ text
    diff: list[str]
    minimized: str | None = None  # the shrunk trace written beside the file
    minimized_steps: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "step": self.step, "action": self.action, "diff": self.diff}
        if self.minimized is not None:
            out["minimized"] = self.minimized
            out["minimized_steps"] = self.minimized_steps
        return out

    def describe(self) -> str:
        head = f"{self.file}: step {self.step}: {self.action}"
        tail = f"\n  shrunk to {self.minimized_steps} step(s): {self.minimized}" if self.minimized else ""
        return head + "".join(f"\n  {line}" for line in self.diff) + tail


@dataclass
class TraceOutcome:
    file: str
    steps: int  # steps replayed (transitions, stuttering included)
    divergence: Divergence | None
    reached: Sequence[Mapping[str, Value]] = ()  # the states replayed, for coverage

    @property
    def passed(self) -> bool:
        return self.divergence is None


@dataclass
class ModelCoverage:
    model: str
    edges: int
    covered_edges: int
    actions: int
    covered_actions: int
    uncovered_actions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "edges": self.edges, "covered_edges": self.covered_edges,
                "edge_coverage": _ratio(self.covered_edges, self.edges), "actions": self.actions,
                "covered_actions": self.covered_actions,
                "action_coverage": _ratio(self.covered_actions, self.actions),
                "uncovered_actions": self.uncovered_actions}


def _ratio(part: int, whole: int) -> float | None:
    return None if whole == 0 else round(part / whole, 6)


@dataclass
class ReplayReport:
    """The ``deferdump replay --json`` object."""

    traces: int
    passed: int
    failed: list[Divergence]
    steps: int
    seconds: float
    coverage: list[ModelCoverage] = field(default_factory=list)
    skipped: int = 0  # traces not replayed after --stop-first
    cpu_seconds: float = 0.0  # process CPU time of the replay (the machine may be shared)

    @property
    def edge_coverage(self) -> float | None:
        return _ratio(sum(c.covered_edges for c in self.coverage), sum(c.edges for c in self.coverage))

    @property
    def action_coverage(self) -> float | None:
        return _ratio(sum(c.covered_actions for c in self.coverage), sum(c.actions for c in self.coverage))

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        return {"traces": self.traces, "passed": self.passed, "failed": [d.to_json() for d in self.failed],
                "steps": self.steps, "seconds": round(self.seconds, 4),
                "steps_per_second": round(self.steps_per_second, 1), "cpu_seconds": round(self.cpu_seconds, 4),
                "edge_coverage": self.edge_coverage, "action_coverage": self.action_coverage,
                "models": [c.to_json() for c in self.coverage], "skipped": self.skipped}


# ----------------------------------------------------------------------------- validation


def _action_text(state: Mapping[str, Value]) -> str:
    try:
        return format_value(state[ACTION])
    except (KeyError, TypeError):
        return "<no action>"


def load_traces(paths: Sequence[Path], driver_factory: DriverFactory,
                loader: TraceLoader | None = None) -> list[tuple[ItfTrace, Driver]]:
    """Decode and validate every file (raising TraceInputError on the first bad one) and build drivers.

    A ``loader`` shared between calls shares decoded values between their files too."""
    loaded: list[tuple[ItfTrace, Driver]] = []
    loader = loader if loader is not None else TraceLoader()
    try:
        for path in paths:
            trace = loader.load(path)
            driver = driver_factory(trace)
            validate_actions(trace, driver.actions, driver.observed)
            loaded.append((trace, driver))
    except ItfError as error:
        for _, driver in loaded:
            driver.close()
        raise TraceInputError(str(error)) from None
    return loaded


# ----------------------------------------------------------------------------- replay


def replay_states(states: Sequence[Mapping[str, Value]], driver: Driver, file: str = "<trace>") -> TraceOutcome:
    """Run ``states`` on a driver; stop at the first divergence. The driver is reset, not closed."""
    try:
        driver.reset(states[0])
        problem = _compare(states[0], driver)
    except StepMismatch as mismatch:
        problem = mismatch.lines
    except Exception as error:  # the implementation raised: a divergence, not a crash of the replay
        problem = [f"implementation raised {type(error).__name__}: {error}"]
    if problem:
        return TraceOutcome(file, 0, Divergence(file, 0, _action_text(states[0]), problem), states[:1])
    for index in range(1, len(states)):
        before, after = states[index - 1], states[index]
        try:
            if not _stutters(before, after):  # a stuttering step changes nothing: nothing to call
                driver.step(before, after)
            problem = _compare(after, driver)
        except StepMismatch as mismatch:
            problem = mismatch.lines
        except Exception as error:
            log.debug("step %d of %s raised", index, file, exc_info=True)
            problem = [f"implementation raised {type(error).__name__}: {error}"]
        if problem:
            return TraceOutcome(file, index, Divergence(file, index, _action_text(after), problem),
                                states[: index + 1])
    return TraceOutcome(file, len(states) - 1, None, states)


def _stutters(before: Mapping[str, Value], after: Mapping[str, Value]) -> bool:
    """Is the step a stutter (no variable changes)? Cheap first: a real step nearly always changes ``action``."""
    action_before, action_after = before.get(ACTION), after.get(ACTION)
    if isinstance(action_before, Record) and isinstance(action_after, Record) and \
            action_before.get("name") != action_after.get("name"):
        return False
    if value_key(action_before) != value_key(action_after):
        return False
    return state_key(before) == state_key(after)


def _compare(state: Mapping[str, Value], driver: Driver) -> list[str]:
    return diff_states(driver.model_view(state), driver.abstract_state())


def replay_trace(trace: ItfTrace, driver: Driver) -> TraceOutcome:
    """Replay one validated trace and close its driver."""
    try:
        return replay_states(trace.states, driver, str(trace.path) if trace.path else "<trace>")
    finally:
        driver.close()


# ----------------------------------------------------------------------------- coverage


def _graphs_for(traces: Sequence[ItfTrace], manifest: Manifest | None) -> dict[str, StateGraph]:
    from deferdump.conformance.tracegen import model_graph  # runs TLC: only when coverage is wanted

    names = sorted({str(t.meta["model"]) for t in traces if isinstance(t.meta.get("model"), str)})
    if not names:
        return {}
    if manifest is None:
        try:
            manifest = load_manifest()
        except ManifestError as error:
            log.warning("no coverage: %s", error)
            return {}
    graphs = {}
    for name in names:
        try:
            graphs[name] = model_graph(manifest.get(name))
        except ManifestError:
            log.warning("no coverage for model %s: not in the manifest %s", name, manifest.path)
    return graphs


def measure_coverage(model: str, graph: StateGraph, outcomes: Sequence[TraceOutcome]) -> ModelCoverage:
    """Edges and TLA+ actions of ``graph`` taken by the replayed part of the traces."""
    taken: set[tuple[StateKey, StateKey]] = set()
    for outcome in outcomes:
        keys = [state_key(state) for state in outcome.reached]
        taken.update(zip(keys, keys[1:]))
    covered = {edge for edge in taken if graph.graph.has_edge(*edge)}
    all_actions = graph.action_labels()
    covered_actions = {graph.label(*edge) for edge in covered}
    return ModelCoverage(model, graph.num_edges, len(covered), len(all_actions), len(covered_actions),
                         sorted(all_actions - covered_actions))


# ----------------------------------------------------------------------------- entry point


def replay_paths(paths: Sequence[Path | str], *, stop_first: bool = False, shrink: bool = True,
                 coverage: bool = True, driver_factory: DriverFactory | None = None,
                 manifest: Manifest | None = None, loader: TraceLoader | None = None) -> ReplayReport:
    """Validate, then replay every ITF file; shrink failures; measure coverage against the model graphs.

    ``loader`` decodes the files (e.g. a :class:`~deferdump.conformance.itfload.DecodedLoader` that has them
    decoded already). Raises :class:`TraceInputError` (nothing replayed) when any file fails validation.
    """
    if driver_factory is None:
        from deferdump.conformance.drivers import default_driver_factory

        driver_factory = default_driver_factory
    loaded = load_traces([Path(p) for p in paths], driver_factory, loader)
    for _, driver in loaded:
        driver.close()
    return replay_loaded([trace for trace, _ in loaded], driver_factory=driver_factory, stop_first=stop_first,
                         shrink=shrink, coverage=coverage, manifest=manifest)


def replay_loaded(traces: Sequence[ItfTrace], *, driver_factory: DriverFactory | None = None,
                  stop_first: bool = False, shrink: bool = True, coverage: bool = True,
                  manifest: Manifest | None = None) -> ReplayReport:
    """Replay traces already validated by :func:`load_traces` (each gets a fresh driver)."""
    if driver_factory is None:
        from deferdump.conformance.drivers import default_driver_factory

        driver_factory = default_driver_factory
    graphs = _graphs_for(traces, manifest) if (coverage or shrink) else {}
    outcomes: list[tuple[ItfTrace, TraceOutcome]] = []
    failed: list[Divergence] = []
    seconds = cpu_seconds = 0.0
    skipped = 0
    for position, trace in enumerate(traces):
        if stop_first and failed:
            skipped = len(traces) - position
            break
        started, cpu_started = time.perf_counter(), time.process_time()
        outcome = replay_trace(trace, driver_factory(trace))
        seconds += time.perf_counter() - started
        cpu_seconds += time.process_time() - cpu_started
        outcomes.append((trace, outcome))
        if outcome.divergence is not None:
            if shrink:
                from deferdump.conformance.shrink import shrink_failure

                graph = graphs.get(str(trace.meta.get("model")))
                shrink_failure(trace, outcome.divergence, driver_factory, graph)
            failed.append(outcome.divergence)
    report = ReplayReport(traces=len(traces), passed=sum(o.passed for _, o in outcomes), failed=failed,
                          steps=sum(o.steps for _, o in outcomes), seconds=seconds, skipped=skipped,
                          cpu_seconds=cpu_seconds)
    if coverage:
        for model, graph in sorted(graphs.items()):
            mine = [o for t, o in outcomes if t.meta.get("model") == model]
            report.coverage.append(measure_coverage(model, graph, mine))
    return report
