"""`deferdump check --shard / --merge / --simulate` end to end: the console script, real TLC, fixture models.

Two shards run side by side and their merged result equals one run's; a simulation's shards merge into
the simulation of the same seed; bad merges and bad flags are one line and exit 2.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.manifests import fixture_manifest
from support.manifests import fixture_model as _model

DEFERDUMP = str(Path(sys.executable).parent / "deferdump")


def deferdump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DEFERDUMP, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return fixture_manifest(tmp_path, [
        _model("CounterOk", "Counter", "pass", 9),
        _model("QueueMutant", "Queue", {"violation": "LogBoundInv"}, 4),
        _model("CounterDrifted", "Counter", "pass", 10),  # fails: the manifest's count is wrong
        _model("DeadlockMutant", "Deadlock", {"violation": "Deadlock"}, 3),
        _model("WalkMutant", "Walk", {"violation": "FarInv"}, None, tier="deep"),
        _model("CounterDeep", "Counter", "pass", 9, tier="deep"),
        _model("WalkSim", "Walk", {"violation": "FarInv"}, None, tier="sim"),
    ])


def _verdicts(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in result.items() if key not in ("seconds", "shard")} for result in results]


def test_two_shards_side_by_side_merge_into_one_run(manifest: Path, tmp_path: Path) -> None:
    common = [DEFERDUMP, "check", "--manifest", str(manifest), "--tier", "ci", "--json", "--jobs", "1"]
    shards = [subprocess.Popen([*common, "--shard", f"{k}/2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for k in (1, 2)]
    outputs = [shard.communicate(timeout=300) for shard in shards]
    assert [shard.returncode for shard in shards].count(1) == 1  # CounterDrifted fails its shard only
    parts = [json.loads(stdout) for stdout, _ in outputs]
    assert all(item["shard"] == f"{k}/2" for k, part in zip((1, 2), parts, strict=True) for item in part)
    assert {len(part) for part in parts} == {2}
    files = []
    for k, (stdout, _) in enumerate(outputs, start=1):
        files.append(tmp_path / f"shard{k}.json")
        files[-1].write_text(stdout)
    merged = deferdump("check", "--merge", *map(str, files), "--manifest", str(manifest), "--tier", "ci", "--json")
    single = deferdump("check", "--manifest", str(manifest), "--tier", "ci", "--json")
    assert merged.returncode == single.returncode == 1, merged.stderr
    assert _verdicts(json.loads(merged.stdout)) == _verdicts(json.loads(single.stdout))
    table = deferdump("check", "--merge", *map(str, files), "--manifest", str(manifest))
    assert table.returncode == 1 and "CounterDrifted" in table.stdout and "NO" in table.stdout

    missing = deferdump("check", "--merge", str(files[0]), "--manifest", str(manifest))
    assert missing.returncode == 2 and missing.stderr.strip() == (
        "deferdump check: missing shards: 2/2 (merge the results of every shard)")
    twice = deferdump("check", "--merge", str(files[0]), str(files[0]), str(files[1]), "--manifest", str(manifest))
    assert twice.returncode == 2 and "duplicate result" in twice.stderr and "Traceback" not in twice.stderr


def test_a_simulation_repeats_by_seed_and_its_shards_merge(manifest: Path, tmp_path: Path) -> None:
    args = ["check", "--manifest", str(manifest), "WalkMutant", "CounterDeep", "--simulate", "--seed", "21",
            "--depth", "30", "--num", "1200", "--json"]
    first, again = deferdump(*args), deferdump(*args)
    assert first.returncode == 0, first.stderr
    one, two = json.loads(first.stdout), json.loads(again.stdout)
    walk, counter = one
    assert walk["mode"] == "simulate" and walk["seed"] == 21 and walk["status"] == "violation"
    assert walk["property"] == "FarInv" and walk["trace"] == two[0]["trace"] and walk["distinct_states"] is None
    assert counter["status"] == "pass" and counter["behaviours"] == 1200 and counter["batches"] == 3
    files = []
    for k in (1, 2):
        out = deferdump(*args, "--shard", f"{k}/2")
        files.append(tmp_path / f"sim{k}.json")
        files[-1].write_text(out.stdout)
    merged = deferdump("check", "--merge", *map(str, files), "--manifest", str(manifest), "--json")
    assert merged.returncode == 0, merged.stderr
    walk_m, counter_m = json.loads(merged.stdout)
    assert counter_m["behaviours"] == 1200 and counter_m["status"] == "pass"
    assert walk_m["trace"] == walk["trace"] and walk_m["expected_ok"] is True
    assert walk_m["batch_depth"] == walk["batch_depth"] == [8, 16, 8][walk["batch_index"]]


def test_fixed_depth_runs_every_batch_at_the_depth_given(manifest: Path) -> None:
    out = deferdump("check", "--manifest", str(manifest), "CounterDeep", "--simulate", "--seed", "4", "--num", "30",
                    "--batch", "10", "--depth", "12", "--fixed-depth", "--json")
    assert out.returncode == 0, out.stderr
    (counter,) = json.loads(out.stdout)
    assert (counter["batches"], counter["batch_index"], counter["batch_depth"]) == (3, 2, 12)


def test_the_sim_tier_is_simulated_only_and_joins_the_default_simulation(manifest: Path) -> None:
    refused = deferdump("check", "--manifest", str(manifest), "--tier", "sim")
    assert refused.returncode == 2 and "tier sim is simulated only (add --simulate): WalkSim" in refused.stderr
    out = deferdump("check", "--manifest", str(manifest), "--simulate", "--seed", "2", "--num", "100", "--depth", "30",
                    "--json")
    assert out.returncode == 0, out.stderr
    # the deep tier's safety models and the sim tier (Counter's cfg lists no PROPERTY)
    assert [item["model"] for item in json.loads(out.stdout)] == ["WalkMutant", "CounterDeep", "WalkSim"]


def test_a_simulation_table_names_the_seed(manifest: Path) -> None:
    out = deferdump("check", "--manifest", str(manifest), "CounterDeep", "--simulate", "--seed", "4", "--num", "10",
                    "--depth", "12")
    assert out.returncode == 0, out.stderr
    assert "deferdump check --simulate" in out.stdout and "Behaviours" in out.stdout and " 4 " in out.stdout


@pytest.mark.parametrize(("args", "fragment"), [
    (["--seed", "3"], "apply to --simulate"),
    (["--simulate", "--workers", "2"], "do not apply"),
    (["--simulate", "--num", "0"], "--num"),
    (["--shard", "3/2"], "shard must be K/N"),
    (["--shard", "x"], "shard must look like K/N"),
    (["--merge"], "--merge needs the JSON files"),
    (["--merge", "--simulate", "a.json"], "checks nothing itself"),
    (["--merge", "nope.json"], "nope.json: no such file"),
    (["--requests", "3"], "apply to --simulate"),
    (["--batch", "5"], "apply to --simulate"),
    (["--fixed-depth"], "apply to --simulate"),
    (["--simulate", "--requests", "1"], "--requests"),
    (["--simulate", "--mutants", "DirectSafety"], "not both"),
    (["--simulate", "--requests", "3", "spec/MCReal.tla"], "not a SPEC"),
    (["--merge", "--mutants", "a.json"], "checks nothing itself"),
])
def test_bad_flags_are_one_line_and_exit_2(args: list[str], fragment: str) -> None:
    out = deferdump("check", *args)
    assert out.returncode == 2 and fragment in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_simulation_grows_models_to_more_requests_and_sweeps_the_mutants(tmp_path: Path) -> None:
    manifest = fixture_manifest(tmp_path, [
        _model("CrowdMutant", "Crowd", {"violation": "FewRunningInv"}, None, tier="deep"),
        _model("WalkMutant", "Walk", {"violation": "FarInv"}, None, tier="deep"),
        _model("CounterDeep", "Counter", "pass", 9, tier="deep"),
    ])
    # at its own two requests the crowd never reaches three: the mutant is not found
    own = deferdump("check", "--manifest", str(manifest), "CrowdMutant", "--simulate", "--seed", "1", "--num", "200",
                    "--depth", "20", "--json")
    assert own.returncode == 1 and json.loads(own.stdout)[0]["status"] == "pass"
    grown = deferdump("check", "--manifest", str(manifest), "CrowdMutant", "--simulate", "--requests", "3", "--seed",
                      "1", "--num", "200", "--depth", "20", "--json")
    assert grown.returncode == 0, grown.stderr
    [crowd] = json.loads(grown.stdout)
    assert crowd["status"] == "violation" and crowd["property"] == "FewRunningInv" and crowd["requests"] == 3
    held = crowd["trace"][-1]["state"]["held"]["#map"]  # ITF: [[key, value], ...]
    assert sorted(key for key, _ in held) == ["r1_OF_MODEL", "r2_OF_MODEL", "r3_OF_MODEL"]  # model values
    assert all(blocks["#set"] for _, blocks in held)  # all three run at once
    # --mutants: the mutants only (not CounterDeep); Walk's cfg has no Req set, so it cannot grow
    refused = deferdump("check", "--manifest", str(manifest), "--simulate", "--mutants", "--requests", "3", "--num", "9")
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "deferdump check: WalkMutant: cannot grow to 3 requests: the cfg assigns no set to Req")
    sweep = deferdump("check", "--manifest", str(manifest), "--simulate", "--mutants", "--seed", "3", "--num", "100",
                      "--depth", "30", "--json")
    assert [item["model"] for item in json.loads(sweep.stdout)] == ["CrowdMutant", "WalkMutant"]
    table = deferdump("check", "--manifest", str(manifest), "CrowdMutant", "--simulate", "--requests", "3", "--seed",
                      "1", "--num", "200", "--depth", "20")
    assert "models grown to 3 requests" in table.stdout


def test_a_model_whose_first_batch_outlasts_the_budget_gets_no_verdict_and_the_others_go_on(tmp_path: Path) -> None:
    manifest = fixture_manifest(tmp_path, [
        _model("BigSim", "BigCycle", "pass", None, tier="sim"),
        _model("WalkMutant", "Walk", {"violation": "FarInv"}, None, tier="deep"),
    ])
    out = deferdump("check", "--manifest", str(manifest), "BigSim", "WalkMutant", "--simulate", "--seed", "1",
                    "--time-budget", "4", "--batch", "1000000000", "--depth", "100", "--json", "--jobs", "1")
    assert out.returncode == 1, out.stderr
    big, walk = json.loads(out.stdout)
    assert big["status"] == "error" and big["kind"] == "timeout" and big["behaviours"] == 0
    assert "no verdict" in big["message"] and big["expected_ok"] is False
    assert walk["status"] == "violation" and walk["expected_ok"] is True


def test_a_models_manifest_batch_sets_its_batches_unless_batch_is_given(tmp_path: Path) -> None:
    slow = {**_model("CounterSlow", "Counter", "pass", None, tier="sim"), "sim_batch": 7}
    manifest = fixture_manifest(tmp_path, [slow, _model("CounterDeep", "Counter", "pass", 9, tier="deep")])
    args = ["check", "--manifest", str(manifest), "--simulate", "--seed", "5", "--num", "21", "--depth", "12",
            "--json"]
    out = deferdump(*args)
    assert out.returncode == 0, out.stderr
    by_model = {item["model"]: item for item in json.loads(out.stdout)}
    assert (by_model["CounterSlow"]["batch"], by_model["CounterSlow"]["batches"]) == (7, 3)
    assert (by_model["CounterDeep"]["batch"], by_model["CounterDeep"]["batches"]) == (500, 1)
    given = json.loads(deferdump(*args, "--batch", "10").stdout)
    assert [(item["batch"], item["batches"]) for item in given] == [(10, 3), (10, 3)]
    # shards simulated with different batch sizes ran different behaviours: they do not merge
    files = []
    for k, extra in ((1, ["--batch", "10"]), (2, [])):
        files.append(tmp_path / f"part{k}.json")
        files[-1].write_text(deferdump(*args, "CounterSlow", "--shard", f"{k}/2", *extra).stdout)
    merged = deferdump("check", "--merge", *map(str, files), "--manifest", str(manifest))
    assert merged.returncode == 2 and "different batch" in merged.stderr and "Traceback" not in merged.stderr
