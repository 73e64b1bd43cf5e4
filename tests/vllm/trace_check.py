"""Trace validation of the end-to-end runs: every run's connector event logs checked against the model.

A test's trace directory may hold several runs (engines built one after another, MultiConnector
children in subdirectories): the logs are grouped by directory and engine id, and each group is
validated on its own by `deferdump.conformance.tracevalidate` (real TLC).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from deferdump.conformance.tracevalidate import BeyondModel, ValidationResult, render_state, validate


def runs(trace_dir: Path) -> dict[str, list[Path]]:
    """`<dir>:<engine>` -> that run's log files (scheduler and every worker)."""
    grouped: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(trace_dir.rglob("*.ndjson")):
        with path.open(encoding="utf-8") as handle:
            first = handle.readline()
        engine = json.loads(first)["engine"] if first.strip() else "?"
        grouped[f"{path.parent.relative_to(trace_dir)}:{engine}"].append(path)
    return dict(grouped)


def describe(result: ValidationResult) -> str:
    """The verdict as text for an assertion message (the first unmatched event and the state before it)."""
    if result.matched:
        return f"matched {result.events} events"
    unmatched = result.first_unmatched
    assert unmatched is not None
    return "\n".join([
        f"NOT matched ({result.matched_events}/{result.events}): {unmatched.event} at "
        f"{unmatched.file}:{unmatched.line}: {unmatched.reason}",
        "logged: " + json.dumps(unmatched.record),
        *("  " + line for line in render_state(unmatched.state_before)),
    ])


def validate_runs(trace_dir: Path) -> dict[str, ValidationResult]:
    """Every run's verdict; a test that built an engine must have left logs."""
    found = runs(trace_dir)
    return {name: validate(files, timeout=900) for name, files in found.items()}


def assert_runs_match(trace_dir: Path) -> int:
    """Every run matches the model; returns how many runs were validated."""
    results = validate_runs(trace_dir)
    failed = {name: describe(result) for name, result in results.items() if not result.matched}
    assert not failed, "\n\n".join(f"{name}: {text}" for name, text in failed.items())
    return len(results)


def assert_rejected_at(trace_dir: Path, event: str, reason: str) -> ValidationResult:
    """The (single) run does NOT match, first at `event`, for a reason containing `reason`."""
    results = validate_runs(trace_dir)
    assert len(results) == 1, sorted(results)
    [result] = results.values()
    assert not result.matched, "the broken scenario's log matched the model"
    assert result.first_unmatched is not None
    assert result.first_unmatched.event == event, describe(result)
    assert reason in result.first_unmatched.reason, describe(result)
    return result


def assert_beyond_model(trace_dir: Path, reason: str) -> int:
    """Every run is refused as beyond the model, for a reason containing `reason`; returns how many runs."""
    found = runs(trace_dir)
    for name, files in found.items():
        try:
            result = validate(files, timeout=900)
        except BeyondModel as exc:
            assert reason in str(exc), f"{name}: {exc}"
            continue
        raise AssertionError(f"{name}: validated instead of refused as beyond the model: {describe(result)}")
    return len(found)
