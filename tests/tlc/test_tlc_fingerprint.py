"""A fixed fingerprint polynomial: TLC 2.15 picks one at random per run, and which lasso a liveness
counterexample shows depends on it. Real TLC on a manifest mutant whose lasso varied run to run
(``ContractNeverReports``: loop index 2, 4 or 10 over four runs before the bridge fixed ``-fp``)."""
from __future__ import annotations

from pathlib import Path

from deferdump.tools.tlc.bridge import FINGERPRINT_INDEX, Kind, Status, run_tlc
from deferdump.tools.tlc.manifest import load_manifest

SPEC = Path(__file__).resolve().parents[2] / "spec"


def test_a_liveness_counterexample_is_the_same_in_every_run() -> None:
    entry = next(e for e in load_manifest().models if e.name == "ContractNeverReports")
    runs = [run_tlc(SPEC / f"{entry.module}.tla", config=SPEC / entry.config) for _ in range(4)]
    assert {(r.status, r.kind) for r in runs} == {(Status.VIOLATION, Kind.LIVENESS)}
    assert len({(r.loop_index, tuple(str(s.values) for s in r.trace)) for r in runs}) == 1
    assert all(r.command[r.command.index("-fp") + 1] == str(FINGERPRINT_INDEX) for r in runs)


def test_a_callers_own_fingerprint_index_is_the_one_tlc_gets() -> None:
    result = run_tlc(SPEC / "MCReal.tla", config=SPEC / "DirectSafety.cfg", extra_args=["-fp", "7"], timeout=120)
    assert result.command.count("-fp") == 1 and result.command[result.command.index("-fp") + 1] == "7"
    assert result.status is Status.PASS
