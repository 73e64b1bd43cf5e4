"""The "fresh blocks" reduction (spec/README.md "Reductions") is exact: with it and without it, every model
reaches the same states up to renaming blocks.

A schedule hands out blocks no variable refers to in one fixed way (DeferDump's and ConnectorContract's
``Fresh``). Turning it off is a definition override (``Fresh <- NoFresh``, every block treated as referenced)
in a wrapper module. Each model's whole reachable graph is compared: its invariants and properties are
replaced by the type invariant (a mutant's violation would stop TLC early), SYMMETRY is added where the cfg
has none, and real TLC must count the same distinct states (symmetry classes) with and without the
reduction, while the reduction generates fewer states (it does something). The reduced successors are a
subset of the unreduced ones, so equal class counts mean no class of states is lost, the states where a
dump's block is rewritten included (the mutants' bounds leave a freed block beside fresh ones).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import deferdump.spec
from deferdump.tools.tlc.cfg import without_sections
from deferdump.tools.tlc.manifest import load_manifest

pytestmark = pytest.mark.slow

SPEC = Path(deferdump.spec.__file__).parent
CONTRACT = "ConnectorContract"
ENTRIES = {entry.name: entry for entry in load_manifest().models}

# Small models where blocks stay fresh: fused and unfused hybrid steps, asynchronous loads (Promote frees),
# several victims, MultiConnector loads, the mutants that rewrite a block under a dump, and the connector
# contract's schedule.
MODELS = ["SlidingWindowFenced", "SlidingWindow", "SlidingWindowDrainOverWaits", "HybridRecomputeInPlace",
          "SeveralVictimsConformance", "AsyncSendAndRecv", "MultiBothLoad", "ReportBeforeWait",
          "ContractDelay", "ContractReportBeforeCopy"]


def _cfg(entry_config: Path, contract: bool, reduced: bool) -> str:
    text = without_sections(entry_config.read_text(encoding="utf-8"),
                            {"INVARIANT", "INVARIANTS", "PROPERTY", "PROPERTIES"})
    text += "\nINVARIANT " + ("ContractTypeInv" if contract else "TypeInv") + "\n"
    if not re.search(r"^\s*SYMMETRY\b", text, re.MULTILINE):
        text += "SYMMETRY Symmetry\n"
    if not reduced:
        text, count = re.subn(r"^(\s*CONSTANTS?\b.*)$", r"\1\n    Fresh <- NoFresh", text, count=1,
                              flags=re.MULTILINE)
        assert count == 1, f"{entry_config.name} has no CONSTANTS section"
    return text


def _check(spec_dir: Path, module: str, cfg_text: str, reduced: bool) -> dict:
    name = "Reduced" if reduced else "Unreduced"
    contract = module == CONTRACT
    (spec_dir / f"{name}.tla").write_text(
        f"---- MODULE {name} ----\nEXTENDS {module}\n"
        + ("NoFresh == {}\n" if contract else "NoFresh(S) == {}\n") + "====\n", encoding="utf-8")
    (spec_dir / f"{name}.cfg").write_text(cfg_text, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "deferdump.tools.cli.app", "check", str(spec_dir / f"{name}.tla"),
                           "-c", str(spec_dir / f"{name}.cfg"), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.stdout, proc.stderr[-2000:]
    (row,) = json.loads(proc.stdout)
    assert row["status"] == "pass", row.get("message")
    return row


@pytest.mark.parametrize("model", MODELS)
def test_fresh_blocks_reduction_reaches_every_class_of_states(model: str, tmp_path: Path) -> None:
    entry = ENTRIES[model]
    spec_dir = tmp_path / "spec"
    shutil.copytree(SPEC, spec_dir, ignore=shutil.ignore_patterns("__pycache__", "states", "*.out"))
    contract = entry.module == CONTRACT
    reduced = _check(spec_dir, entry.module, _cfg(entry.config_path, contract, True), True)
    full = _check(spec_dir, entry.module, _cfg(entry.config_path, contract, False), False)
    assert reduced["distinct_states"] == full["distinct_states"]
    assert reduced["generated_states"] < full["generated_states"], "the override left the reduction on"
