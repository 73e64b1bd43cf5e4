"""The capacity models: the simulation tier finds the manifest's mutants at 3 requests, the all-features
models simulate clean, and the crossing the all-features model found is a real counterexample.

Simulations run with a fixed seed and behaviour count, so every verdict here is deterministic; how long
they take is measured in docs/capacity.md, never asserted.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deferdump.tools.tlc.bridge import Status
from deferdump.tools.tlc.manifest import load_manifest, simulate_model
from deferdump.tools.tlc.scale import ScaleError, scaled_config
from deferdump.tools.tlc.simulate import SimulationPlan, simulate

pytestmark = pytest.mark.slow

DEFERDUMP = str(Path(sys.executable).parent / "deferdump")
MANIFEST = load_manifest()


@pytest.mark.parametrize("name", ["CPOverrideNoTrack", "OuterNoForward"])
def test_the_simulation_finds_a_mutant_at_three_requests(name: str) -> None:
    entry = MANIFEST.get(name)
    cfg = scaled_config(entry.config_path.read_text(encoding="utf-8"), 3)
    assert "Req = {r1, r2, r3}" in cfg
    outcome = simulate_model(entry, SimulationPlan(depth=60, seed=1, num=500), config="Scaled3.cfg",
                             extra_modules={"Scaled3.cfg": cfg})
    assert outcome.result.status is Status.VIOLATION and outcome.expected_ok, outcome.summary
    assert outcome.result.property == entry.expect.violation
    reqs = set().union(*(set(state.values["reqState"].keys()) for state in outcome.result.trace))  # type: ignore
    assert len(reqs) == 3  # the 3-request model, not the CI one


def test_scaling_keeps_the_pool_as_tight_and_refuses_what_it_cannot_read() -> None:
    text = "CONSTANTS\n    Req = {r1, r2}\n    Block = {b1, b2, b3}\n    PromptBlocks = 2\n"
    assert scaled_config(text, 3) == "CONSTANTS\n    Req = {r1, r2, r3}\n    Block = {b1, b2, b3, b4, b5}\n" \
                                     "    PromptBlocks = 2\n"
    with pytest.raises(ScaleError, match="no set to Req"):
        scaled_config("CONSTANTS\n    Block = {b1}\n", 3)
    with pytest.raises(ScaleError, match="more than 1"):
        scaled_config(text, 1)


@pytest.mark.parametrize(("name", "behaviours"), [("AllFeatures", 200), ("AllFeaturesHybrid", 200),
                                                   ("AllFeaturesAsyncLoads", 40)])
def test_the_all_features_models_simulate_clean(name: str, behaviours: int) -> None:
    entry = MANIFEST.get(name)
    assert entry.tier == "sim" and entry.distinct_states is None
    batch = entry.sim_batch or behaviours
    outcome = simulate_model(entry, SimulationPlan(depth=60, seed=1, num=behaviours, batch=batch))
    assert outcome.result.status is Status.PASS and outcome.expected_ok, outcome.summary
    assert outcome.simulation is not None and outcome.simulation.behaviours == behaviours


def test_the_async_load_model_reaches_a_load_beside_a_dump_with_two_steps_in_flight(tmp_path: Path) -> None:
    """AllFeaturesAsyncLoads is not vacuous: a request waits for remote KV while a rank holds both a load
    task and a dump task and two scheduled steps are in flight (the crossing no other model has)."""
    entry = MANIFEST.get("AllFeaturesAsyncLoads")
    for source in entry.spec_dir.glob("*.tla"):
        shutil.copyfile(source, tmp_path / source.name)
    (tmp_path / "MCCrossing.tla").write_text(
        "---- MODULE MCCrossing ----\nEXTENDS MCSlidingWindowFenced\n"
        "NotCrossedInv == ~(Len(inflight) = 2 /\\ \\E r \\in Req : reqState[r] = \"remote\"\n"
        "    /\\ \\E w \\in Rank : loadTasks[w] # {} /\\ pending[w] # {})\n====\n", encoding="utf-8")
    cfg = entry.config_path.read_text(encoding="utf-8").replace("    TypeInv\n", "    TypeInv\n    NotCrossedInv\n", 1)
    (tmp_path / "MCCrossing.cfg").write_text(cfg, encoding="utf-8")
    result, _ = simulate(tmp_path / "MCCrossing.tla", tmp_path / "MCCrossing.cfg",
                         SimulationPlan(depth=60, seed=1, num=200, batch=20))
    assert result.status is Status.VIOLATION and result.property == "NotCrossedInv", result.message


def test_a_lookup_answered_before_an_earlier_steps_dump_loads_under_it() -> None:
    out = subprocess.run([DEFERDUMP, "check", "LookupBeforeAsyncDump", "--json"], capture_output=True, text=True,
                         timeout=900)
    [result] = json.loads(out.stdout)
    assert out.returncode == 0 and result["expected_ok"], out.stderr
    assert [step["action"] for step in result["trace"]] == [None, "schedule", "schedule", "execute_model",
                                                            "execute_model"]
    second = result["trace"][2]["state"]["inflight"]["#tup"][1]
    assert second["load"]["#set"], "step 2 admits a hit"
    assert result["trace"][-1]["state"]["dirtyLoads"] is True
