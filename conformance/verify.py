"""The job behind ``deferdump verify`` / ``make verify``: check, generate, replay, measure.

1. model-check every CI model of the manifest against its expectation (``jobs`` JVMs at a time);
2. for every CI conformance model (passing, not a mutant): generate its edge-cover traces (``jobs`` at a
   time), replay them on the reference connector (under coverage.py, for the protocol core's branch coverage);
3. judge: any unexpected check result, any divergence, edge coverage below 100 %, or the protocol core's
   branch coverage below :data:`~deferdump.conformance.corecov.CORE_BRANCH_TARGET` is a failure.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deferdump.reference.class_names import INNER
from deferdump.tools.tlc.manifest import CheckOutcome, Manifest, ModelEntry, load_manifest, outcomes_json
from deferdump.tools.tlc.parallel import default_jobs, model_job, run_checks
from deferdump.tools.tlc.values import ItfTrace

from deferdump.conformance.corecov import CORE_BRANCH_TARGET, CoreCoverage, core_for_variants, measure_core_coverage
from deferdump.conformance.itfload import DecodedLoader
from deferdump.conformance.replay import ReplayReport, replay_paths
from deferdump.conformance.tracecache import cached_cover, cached_decoded
from deferdump.conformance.tracegen import GeneratedTraces, TraceGenerationError, generate_traces

__all__ = ["CoverReplay", "ModelConformance", "VerifyResult", "conformance_entries", "cover_and_replay", "run_verify"]

log = logging.getLogger(__name__)

VARIANT_NAMES = {names.model: names.variant for names in INNER}  # the manifest's variant -> the config's


@dataclass
class ModelConformance:
    traces: GeneratedTraces
    report: ReplayReport

    @property
    def ok(self) -> bool:
        return self.report.ok and self.report.edge_coverage == 1.0

    def to_json(self) -> dict[str, Any]:
        return {**self.traces.to_json(), "replay": self.report.to_json(), "ok": self.ok}


@dataclass
class VerifyResult:
    checks: list[CheckOutcome] = field(default_factory=list)
    models: list[ModelConformance] = field(default_factory=list)
    core: CoreCoverage | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": outcomes_json(self.checks),
                "conformance": [m.to_json() for m in self.models],
                "core_coverage": None if self.core is None else self.core.to_json(), "problems": self.problems}


def conformance_entries(manifest: Manifest) -> list[ModelEntry]:
    """The manifest's CI conformance models: passing ones, not mutants."""
    return [e for e in manifest.select(tier="ci") if e.conformance and not e.mutant and e.expect.passes]


@dataclass
class CoverReplay:
    """Edge covers generated for some conformance models, their replays, and the core coverage reached."""

    generated: list[GeneratedTraces]
    reports: list[ReplayReport]
    core: CoreCoverage


def _placed(traces: GeneratedTraces, target: Path) -> GeneratedTraces:
    """Cached traces put under ``target`` (hard links where the file system allows, else copies), so that a
    replay's shrunk failing trace lands beside them and never inside the cache; nothing is overwritten."""
    paths = [target / path.name for path in traces.files]
    clashing = [path.name for path in paths if path.exists()]
    if clashing:
        raise TraceGenerationError(f"{target} already holds {clashing[0]} (and {len(clashing) - 1} more): "
                                   "not overwriting; choose an empty --out directory")
    target.mkdir(parents=True, exist_ok=True)
    for source, path in zip(traces.files, paths):
        try:
            os.link(source, path)
        except OSError:  # another file system, or links refused
            shutil.copyfile(source, path)
    return dataclasses.replace(traces, files=paths)


def cover_and_replay(entries: list[ModelEntry], out_dir: Path, manifest: Manifest, *, shrink: bool = True,
                     timeout: float | None = None, jobs: int = 1, cached: bool = False) -> CoverReplay:
    """Generate each model's edge cover under ``out_dir/<name>`` (``jobs`` TLC runs at a time) and replay
    them all under coverage.py (the protocol core of the variants the models run); `deferdump verify` and
    `deferdump bench` share it. ``cached``: take each edge cover from the trace cache
    (:mod:`deferdump.conformance.tracecache`, keyed by the spec's content and the generator's source),
    generating and keeping it there where missing, and replay the cache's decoded copy of its traces (each
    named by its file under ``out_dir``, where a shrunk failing trace is written)."""
    def generate(entry: ModelEntry) -> tuple[GeneratedTraces, list[ItfTrace]]:
        if not cached:
            return generate_traces(entry, "cover", out_dir / entry.name, timeout=timeout), []
        placed = _placed(cached_cover(entry)[0], out_dir / entry.name)
        # the cache's decoded copy (unpickled: a fifth of the CPU of decoding the JSON), named by the placed files
        decoded = [dataclasses.replace(trace, path=path) for trace, path in zip(cached_decoded(entry), placed.files)]
        return placed, decoded

    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="deferdump-cover") as pool:
        results = list(pool.map(generate, entries))  # in the order of `entries`; the first error re-raises
    generated = [traces for traces, _ in results]
    loader = DecodedLoader(trace for _, decoded in results for trace in decoded)

    def replay_all() -> list[ReplayReport]:
        return [replay_paths(g.files, shrink=shrink, manifest=manifest, loader=loader) for g in generated]

    core = core_for_variants({VARIANT_NAMES[e.variant] for e in entries})
    reports, measured = measure_core_coverage(replay_all, core)
    return CoverReplay(generated, reports, measured)


def run_verify(manifest_path: Path | None, out_dir: Path, *, jobs: int | None = None,
               min_core_coverage: float | None = None, cached: bool = True,
               on_change: Callable[[list[str], int], None] | None = None) -> VerifyResult:
    """Run the whole verification; ``out_dir`` receives one sub-directory of traces per model.

    ``jobs`` (default: one per usable CPU) TLC runs go at once, for the checks and for the trace
    generation; ``on_change`` hears the running checks as :func:`~deferdump.tools.tlc.parallel.run_checks`
    reports them. ``cached``: the edge covers come from the trace cache (see :func:`cover_and_replay`).
    The protocol core's branch coverage below ``min_core_coverage`` is a problem (default:
    :data:`~deferdump.conformance.corecov.CORE_BRANCH_TARGET`, the shipped models' target; a manifest of a
    few models reaches less)."""
    manifest: Manifest = load_manifest(manifest_path)
    parallel = jobs or default_jobs()
    result = VerifyResult()
    ci = manifest.select(tier="ci")
    conformance = conformance_entries(manifest)
    # The replay (Python, one core, under coverage.py) runs beside the checks (JVMs): each phase alone
    # leaves part of the machine idle. The checks stay on this thread, where Ctrl-C reaches run_checks
    # (which kills the JVMs); the replay thread is a daemon that an interrupted run does not wait for.
    replay = _Background(lambda: cover_and_replay(conformance, out_dir, manifest, jobs=parallel, cached=cached))
    if conformance:
        replay.start()
    result.checks = run_checks([(entry.name, model_job(entry)) for entry in ci], parallel, on_change=on_change)
    for entry, outcome in zip(ci, result.checks):
        if not outcome.expected_ok:
            result.problems.append(f"check {entry.name}: {outcome.summary}")
    if not conformance:
        result.problems.append("the manifest marks no CI model for conformance")
        return result
    if on_change is not None:
        on_change([], len(ci))  # the checks are done; what is left is the replay
    covers = replay.result()
    result.core = covers.core
    target = CORE_BRANCH_TARGET if min_core_coverage is None else min_core_coverage
    reached = covers.core.branch_coverage
    if reached is not None and reached < target:
        result.problems.append(f"protocol core branch coverage {reached:.1%} below {target:.0%} "
                               f"({len(covers.core.missed)} lines or arcs missed: core_coverage.missed in --json)")
    for traces, report in zip(covers.generated, covers.reports):
        row = ModelConformance(traces, report)
        result.models.append(row)
        if not report.ok:
            result.problems.append(f"replay {traces.model}: {len(report.failed)} trace(s) diverged")
        if report.edge_coverage != 1.0:
            result.problems.append(f"replay {traces.model}: edge coverage {report.edge_coverage} below 100%")
    return result


class _Background:
    """One function run on a daemon thread; :meth:`result` waits for it and re-raises what it raised."""

    def __init__(self, work: Callable[[], CoverReplay]) -> None:
        self._work = work
        self._value: CoverReplay | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="deferdump-verify-replay", daemon=True)

    def _run(self) -> None:
        try:
            self._value = self._work()
        except BaseException as error:  # handed to the caller of result()
            self._error = error

    def start(self) -> None:
        self._thread.start()

    def result(self) -> CoverReplay:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value
