"""The conformance commands through the real CLI: traces, replay (pass, divergence, bad input), verify."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.conformance import DEFERDUMP_FIXTURES, counting_json_decodes, deferdump_traces
from deferdump.conformance.shrink import MIN_SUFFIX
from deferdump.conformance.tracecache import CACHE_ENV, LOCKS
from deferdump.conformance.verify import conformance_entries, cover_and_replay
from deferdump.reference.connectors import DirectConnector
from deferdump.tools.tlc.manifest import load_manifest
from deferdump.tools.tlc.specfiles import spec_dir

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

CLI = str(Path(sys.executable).with_name("deferdump"))


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)


def _fixture_manifest(tmp_path: Path) -> Path:
    """A manifest beside copies of the spec modules, listing the ConfMLA fixture as a CI conformance model."""
    root = tmp_path / "spec"
    root.mkdir()
    for module in spec_dir().glob("*.tla"):
        shutil.copyfile(module, root / module.name)
    shutil.copyfile(DEFERDUMP_FIXTURES / "ConfMLA.cfg", root / "ConfMLA.cfg")
    entry = {"name": "ConfMLA", "module": "MCReal", "config": "ConfMLA.cfg", "tier": "ci", "variant": "Direct",
             "expect": "pass", "distinct_states": 73, "mutant": False, "conformance": True}
    (root / "manifest.json").write_text(json.dumps({"models": [entry]}))
    return root / "manifest.json"


def test_traces_and_replay_json(tmp_path):
    manifest = _fixture_manifest(tmp_path)
    made = _run("traces", "ConfMLA", "--mode", "cover", "--out", str(tmp_path / "t"), "--manifest", str(manifest),
                "--json")
    assert made.returncode == 0, made.stderr
    summary = json.loads(made.stdout)
    assert set(summary) >= {"model", "mode", "traces", "states", "edges", "covered_edges", "files"}
    assert summary["model"] == "ConfMLA" and summary["states"] == 73
    assert summary["covered_edges"] == summary["edges"] and len(summary["files"]) == summary["traces"]
    replayed = _run("replay", *summary["files"][:5], "--json")
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout)
    assert report["traces"] == report["passed"] == 5 and report["failed"] == []
    assert set(report) >= {"traces", "passed", "failed", "steps", "seconds", "edge_coverage", "action_coverage"}


def test_replay_of_a_tampered_trace_names_step_and_diff_and_exits_1(tmp_path):
    source = next(p for p in deferdump_traces("ConfMLA") if len(json.loads(p.read_text())["states"]) > 3)
    trace = json.loads(source.read_text())
    # claim that rank 1 still tracks nothing after the first step that tracked something there
    step = next(i for i, s in enumerate(trace["states"]) if s["workerAsync"]["#map"][1][1]["#set"])
    trace["states"][step]["workerAsync"]["#map"][1][1]["#set"] = []
    tampered = tmp_path / "tampered.itf.json"
    tampered.write_text(json.dumps(trace))
    run = _run("replay", str(tampered), "--json", "--no-shrink")
    assert run.returncode == 1
    (failure,) = json.loads(run.stdout)["failed"]
    assert failure["file"] == str(tampered) and failure["step"] == step
    assert any(line.startswith("workerAsync[1]: only in implementation") for line in failure["diff"])


def test_bad_trace_gives_one_line_and_exit_2(tmp_path):
    trace = json.loads(deferdump_traces("ConfMLA")[0].read_text())
    trace["states"][1]["action"]["name"] = "explode"
    bad = tmp_path / "bad.itf.json"
    bad.write_text(json.dumps(trace))
    run = _run("replay", str(bad))
    assert run.returncode == 2 and run.stdout == ""
    (line,) = run.stderr.strip().splitlines()
    assert str(bad) in line and "state 1" in line and "$.states[1].action.name" in line
    assert "unknown action name 'explode'" in line


def test_verify_checks_generates_replays_and_summarises(tmp_path, monkeypatch):
    monkeypatch.setenv("DEFERDUMP_TRACE_CACHE", str(tmp_path / "cache"))
    report = tmp_path / "reports" / "verify.json"
    manifest = _fixture_manifest(tmp_path)
    run = _run("verify", "--manifest", str(manifest), "--json", "--out", str(tmp_path / "v"),
               "--min-core-coverage", "0", "--report", str(report), "--jobs", "2")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr
    result = json.loads(run.stdout)
    assert result["ok"] and result["problems"] == []
    (check,) = result["checks"]
    assert check["model"] == "ConfMLA"
    (model,) = result["conformance"]
    assert model["model"] == "ConfMLA" and model["replay"]["failed"] == []
    assert model["replay"]["edge_coverage"] == 1.0
    assert result["core_coverage"]["branches"] > 0
    placed = sorted((tmp_path / "v" / "ConfMLA").glob("*.itf.json"))
    assert placed and len(placed) == model["traces"]
    assert json.loads(report.read_text()) == result  # --report keeps what --json printed
    # the edge cover went into the trace cache: a second run reuses it (the same files, byte for byte)
    (entry,) = [d for d in (tmp_path / "cache").iterdir() if d.name.startswith("ConfMLA-")]
    cached = sorted((entry / "traces").glob("*.itf.json"))
    assert [p.read_bytes() for p in cached] == [p.read_bytes() for p in placed]
    # the same --out again: the replay's side (beside the checks) refuses to overwrite, in one line
    again = _run("verify", "--manifest", str(manifest), "--out", str(tmp_path / "v"), "--min-core-coverage", "0")
    assert again.returncode == 2 and again.stdout == "", again.stdout
    (line,) = again.stderr.strip().splitlines()
    assert "already holds ConfMLA_cover_0000.itf.json" in line and "not overwriting" in line


def test_verify_fails_below_the_core_coverage_target(tmp_path, monkeypatch):
    """One MLA model reaches well under the shipped models' 95 % of the protocol core: exit 1, named."""
    monkeypatch.setenv("DEFERDUMP_TRACE_CACHE", str(tmp_path / "cache"))
    run = _run("verify", "--manifest", str(_fixture_manifest(tmp_path)), "--json")
    assert run.returncode == 1, run.stderr
    result = json.loads(run.stdout)
    (problem,) = result["problems"]
    assert problem.startswith("protocol core branch coverage") and "below 95%" in problem
    assert result["core_coverage"]["branch_coverage"] < 0.95 and result["core_coverage"]["missed"]
    # the model's entry (and the lock it was generated under); verify's scratch beside it is gone
    (entry,) = (p for p in (tmp_path / "cache").iterdir() if p.name != LOCKS)
    assert entry.name.startswith("ConfMLA-")


def test_verify_no_cache_generates_outside_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEFERDUMP_TRACE_CACHE", str(tmp_path / "cache"))
    run = _run("verify", "--manifest", str(_fixture_manifest(tmp_path)), "--json", "--no-cache",
               "--min-core-coverage", "0", "--out", str(tmp_path / "v"))
    assert run.returncode == 0, run.stderr
    (model,) = json.loads(run.stdout)["conformance"]
    assert len(list((tmp_path / "v" / "ConfMLA").glob("*.itf.json"))) == model["traces"] > 0
    assert not (tmp_path / "cache").exists()


def test_verify_bad_report_path_is_one_line(tmp_path):
    run = _run("verify", "--manifest", str(_fixture_manifest(tmp_path)), "--report", str(tmp_path))
    assert run.returncode == 2 and run.stdout == ""
    (line,) = run.stderr.strip().splitlines()
    assert "is a directory" in line and str(tmp_path) in line


# ------------------------------------------- verify's replay of cached covers (in process)

def test_cached_covers_replay_decoded_traces_named_by_their_placed_files(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    manifest = load_manifest(_fixture_manifest(tmp_path))
    entries = conformance_entries(manifest)
    first = cover_and_replay(entries, tmp_path / "first", manifest, shrink=False, cached=True)
    [report] = first.reports
    assert report.ok and report.traces > 0

    decodes = counting_json_decodes(monkeypatch)
    monkeypatch.setattr(DirectConnector, "_track_async_dump_requests", lambda self, metadata: None)  # a mutant
    second = cover_and_replay(entries, tmp_path / "second", manifest, shrink=True, cached=True)
    assert decodes == []  # every trace came decoded from the cache
    [report] = second.reports
    assert report.failed, "the mutant (no tracking in build_connector_meta) survived the cover"
    placed = {str(path) for path in second.generated[0].files}
    assert all(p.parent == tmp_path / "second" / "ConfMLA" for p in map(Path, placed))
    for divergence in report.failed:
        assert divergence.file in placed  # named by the file under the out directory, not the cache's
        assert divergence.minimized is not None and Path(divergence.minimized).parent == tmp_path / "second" / "ConfMLA"
    assert not [p for p in (tmp_path / "cache").rglob(f"*{MIN_SUFFIX}")]  # nothing shrunk into the cache
    assert json.loads(Path(report.failed[0].minimized).read_text())["#meta"]["shrunk_from"]
