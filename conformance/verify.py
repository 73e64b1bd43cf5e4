"""The job behind ``deferdump verify`` / ``make verify``: check, generate, replay, measure.

1. model-check every CI model of the manifest against its expectation;
2. for every CI conformance model (passing, not a mutant): generate its edge-cover traces, replay them
   on the reference connector (under coverage.py, for the protocol core's branch coverage);
3. judge: any unexpected check result, any divergence, or edge coverage below 100 % is a failure.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deferdump.reference.class_names import INNER
from deferdump.tools.tlc.manifest import CheckOutcome, Manifest, ModelEntry, check_model, load_manifest, outcomes_json

from deferdump.conformance.corecov import CoreCoverage, core_for_variants, measure_core_coverage
from deferdump.conformance.replay import ReplayReport, replay_paths
from deferdump.conformance.tracegen import GeneratedTraces, generate_traces

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


def cover_and_replay(entries: list[ModelEntry], out_dir: Path, manifest: Manifest, *, shrink: bool = True,
                     timeout: float | None = None) -> CoverReplay:
    """Generate each model's edge cover under ``out_dir/<name>`` and replay them all under coverage.py
    (the protocol core of the variants the models run); `deferdump verify` and `deferdump bench` share it."""
    generated = [generate_traces(entry, "cover", out_dir / entry.name, timeout=timeout) for entry in entries]

    def replay_all() -> list[ReplayReport]:
        return [replay_paths(g.files, shrink=shrink, manifest=manifest) for g in generated]

    core = core_for_variants({VARIANT_NAMES[e.variant] for e in entries})
    reports, measured = measure_core_coverage(replay_all, core)
    return CoverReplay(generated, reports, measured)


def run_verify(manifest_path: Path | None, out_dir: Path) -> VerifyResult:
    """Run the whole verification; ``out_dir`` receives one sub-directory of traces per model."""
    manifest: Manifest = load_manifest(manifest_path)
    result = VerifyResult()
    ci = manifest.select(tier="ci")
    for entry in ci:
        outcome = check_model(entry)
        result.checks.append(outcome)
        if not outcome.expected_ok:
            result.problems.append(f"check {entry.name}: {outcome.summary}")
    conformance = conformance_entries(manifest)
    if not conformance:
        result.problems.append("the manifest marks no CI model for conformance")
        return result
    covers = cover_and_replay(conformance, out_dir, manifest)
    result.core = covers.core
    for traces, report in zip(covers.generated, covers.reports):
        row = ModelConformance(traces, report)
        result.models.append(row)
        if not report.ok:
            result.problems.append(f"replay {traces.model}: {len(report.failed)} trace(s) diverged")
        if report.edge_coverage != 1.0:
            result.problems.append(f"replay {traces.model}: edge coverage {report.edge_coverage} below 100%")
    return result
