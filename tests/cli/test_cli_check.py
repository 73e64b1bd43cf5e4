"""`deferdump check` end to end: the real console script, real TLC, JSON schema, exit codes, bad input."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deferdump.tools.cli import app as cli
from deferdump.tools.tlc import java
from support import FIXTURES as ALL_FIXTURES

FIXTURES = ALL_FIXTURES / "tla"
DEFERDUMP = str(Path(sys.executable).parent / "deferdump")
SCHEMA_KEYS = ["model", "status", "kind", "property", "distinct_states", "generated_states", "depth", "seconds",
               "trace", "loop_index", "message", "expected_ok"]


def deferdump(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DEFERDUMP, *args], capture_output=True, text=True, env=env, timeout=120)


def assert_one_clean_line(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_spec_violation_json() -> None:
    out = deferdump("check", str(FIXTURES / "Queue.tla"), "--json")
    assert out.returncode == 1, out.stderr
    [obj] = json.loads(out.stdout)
    assert list(obj) == SCHEMA_KEYS
    assert {k: obj[k] for k in SCHEMA_KEYS if k not in ("seconds", "trace")} == {
        "model": "Queue", "status": "violation", "kind": "invariant", "property": "LogBoundInv",
        "distinct_states": 4, "generated_states": 4, "depth": 4, "loop_index": None,
        "message": "Invariant LogBoundInv is violated.", "expected_ok": False,
    }
    assert [step["action"] for step in obj["trace"]] == [None, "Produce", "Produce", "Produce"]
    assert obj["trace"][1]["state"] == {
        "seen": {"#set": ["w1_OF_MODEL"]},
        "n": {"#bigint": "1"},
        "log": {"#tup": [{"n": {"#bigint": "0"}, "who": "w1_OF_MODEL"}]},
    }
    assert out.stderr == ""


def test_lasso_table_shows_trace_and_loop() -> None:
    out = deferdump("check", str(FIXTURES / "Lasso.tla"))
    assert out.returncode == 1
    assert "violation (liveness)" in out.stdout and "ReachThreeProp" in out.stdout
    assert "  2: <Step>" in out.stdout and "/\\ x = 2" in out.stdout
    assert "… then loops back to state 1" in out.stdout


def test_config_error_is_one_line() -> None:
    out = deferdump("check", str(FIXTURES / "Counter.tla"), "--config", str(FIXTURES / "CounterUndefinedInv.cfg"),
                    "--json")
    assert out.returncode == 1
    [obj] = json.loads(out.stdout)
    assert (obj["status"], obj["kind"]) == ("error", "config")
    assert_one_clean_line(out.stderr, "deferdump check: Counter: The invariant NoSuchInv")


def test_timeout_is_one_line() -> None:
    out = deferdump("check", str(FIXTURES / "Big.tla"), "--timeout", "1", "--json")
    assert out.returncode == 1
    assert json.loads(out.stdout)[0]["kind"] == "timeout"
    assert_one_clean_line(out.stderr, "deferdump check: Big: TLC timed out after")


@pytest.mark.parametrize(("args", "fragment"), [
    (["check", "missing/Nope.tla"], "deferdump check: spec not found: missing/Nope.tla"),
    (["check", str(FIXTURES / "Counter.tla"), "--config", "nope.cfg"], "config not found: nope.cfg"),
    (["check", "--workers", "abc"], "Invalid value for '--workers'"),
    (["check", "--timeout", "0", str(FIXTURES / "Counter.tla")], "must be a positive number of seconds"),
    (["check", str(FIXTURES / "Counter.tla"), "--tier", "ci"], "--tier selects manifest models"),
    (["check", "NoSuchModel"], "unknown model 'NoSuchModel'"),
    (["check", "--tier", "nightly"], "Invalid value for '--tier'"),
])
def test_bad_input_is_one_line(args: list[str], fragment: str) -> None:
    out = deferdump(*args)
    assert out.returncode == 2
    assert out.stdout == ""
    assert_one_clean_line(out.stderr, fragment)


def test_missing_java_is_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(DEFERDUMP).parent)
    out = deferdump("check", str(FIXTURES / "Counter.tla"), env=env)
    assert out.returncode == 2
    assert_one_clean_line(out.stderr, "java not found on PATH")


def test_jar_override_reports_the_tlc_version(tmp_path: Path) -> None:
    copy = tmp_path / "tla2tools.jar"
    shutil.copyfile(java.find_jar({})[0], copy)
    out = deferdump("check", str(FIXTURES / "Counter.tla"), "--json", env={**os.environ, "TLA2TOOLS_JAR": str(copy)})
    assert out.returncode == 0 and json.loads(out.stdout)[0]["distinct_states"] == 9
    assert out.stderr.splitlines() == [f"deferdump: using TLA2TOOLS_JAR={copy} (checksum not verified)",
                                       "deferdump: TLC version: TLC2 Version 2.15 of Day Month 20?? (rev: d5b5a7f)"]


def test_wrong_jar_checksum_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    corrupted = tmp_path / "tla2tools.jar"
    corrupted.write_bytes(b"not a jar")
    monkeypatch.setattr(java, "_packaged_jar", lambda: corrupted)
    monkeypatch.delenv("TLA2TOOLS_JAR", raising=False)
    monkeypatch.setattr(sys, "argv", ["deferdump", "check", str(FIXTURES / "Counter.tla")])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    assert_one_clean_line(capsys.readouterr().err, "has SHA-256", "expected 58c6df9a")


def _manifest(tmp_path: Path, models: list[dict[str, object]]) -> Path:
    for source in FIXTURES.iterdir():
        shutil.copyfile(source, tmp_path / source.name)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"models": models}))
    return path


def _model(name: str, module: str, expect: object, distinct: int | None, tier: str = "ci",
           config: str | None = None) -> dict[str, object]:
    return {"name": name, "module": module, "config": config or f"{module}.cfg", "tier": tier, "variant": "Direct",
            "expect": expect, "distinct_states": distinct, "mutant": expect != "pass", "conformance": False}


def test_manifest_models_meet_expectations(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, [
        _model("CounterOk", "Counter", "pass", 9),
        _model("QueueMutant", "Queue", {"violation": "LogBoundInv"}, None),
        _model("DeadlockMutant", "Deadlock", {"violation": "Deadlock"}, 3),
        _model("CounterDrifted", "Counter", "pass", 10, tier="deep"),
    ])
    out = deferdump("check", "--manifest", str(manifest), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads(out.stdout)
    assert [r["model"] for r in results] == ["CounterOk", "QueueMutant", "DeadlockMutant"]
    assert all(r["expected_ok"] for r in results)
    assert [r["status"] for r in results] == ["pass", "violation", "violation"]

    drifted = deferdump("check", "CounterDrifted", "--manifest", str(manifest), "--json")
    assert drifted.returncode == 1
    [obj] = json.loads(drifted.stdout)
    assert obj["status"] == "pass" and obj["expected_ok"] is False
    assert obj["message"].startswith("distinct states 9, manifest says 10")


def test_empty_manifest_passes_and_says_so(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, [])
    out = deferdump("check", "--tier", "ci", "--manifest", str(manifest), "--json")
    assert out.returncode == 0
    assert json.loads(out.stdout) == []
    assert_one_clean_line(out.stderr, "0 models checked")


def _child_jvms(parent: int) -> list[int]:
    """PIDs of TLC JVMs whose parent is ``parent`` (read from /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"tlc2.TLC" in argv:
            found.append(int(proc.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigterm_ends_the_check_and_its_jvm() -> None:
    """`timeout`, a CI runner or `kill` sends SIGTERM: TLC's JVM (in a session of its own) must die with
    deferdump, not run on for the rest of its search."""
    import signal
    import time

    proc = subprocess.Popen([DEFERDUMP, "check", str(FIXTURES / "Big.tla"), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        jvms: list[int] = []
        while not jvms and time.monotonic() < deadline:
            time.sleep(0.1)
            jvms = _child_jvms(proc.pid)
        assert jvms, "TLC never started"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert_one_clean_line(stderr, "deferdump check: interrupted")
    time.sleep(0.5)
    assert not any(_alive(pid) for pid in jvms)
