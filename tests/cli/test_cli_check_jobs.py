"""`deferdump check --jobs`: models checked in parallel, real TLC on the small fixture specs.

Order and JSON do not depend on the number of jobs; a failing model among passing ones still fails the
run; the runs overlap; Ctrl-C (a KeyboardInterrupt in the main thread) kills the running JVMs at once.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from deferdump.tools.cli.check import _run
from deferdump.tools.tlc.parallel import default_jobs
from deferdump.tools.tlc.bridge import Progress as TlcProgress
from deferdump.tools.tlc.manifest import CheckOutcome, check_spec
from support import FIXTURES as ALL_FIXTURES
from support.manifests import fixture_manifest
from support.manifests import fixture_model as _model

FIXTURES = ALL_FIXTURES / "tla"
DEFERDUMP = str(Path(sys.executable).parent / "deferdump")


def deferdump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DEFERDUMP, *args], capture_output=True, text=True, timeout=180)


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return fixture_manifest(tmp_path, [
        _model("CounterOk", "Counter", "pass", 9),
        _model("QueueMutant", "Queue", {"violation": "LogBoundInv"}, None),
        _model("CounterDrifted", "Counter", "pass", 10),  # fails: the manifest's count is wrong
        _model("DeadlockMutant", "Deadlock", {"violation": "Deadlock"}, 3),
        _model("CounterAgain", "Counter", "pass", 9),
    ])


def _without_seconds(results: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{key: value for key, value in result.items() if key != "seconds"} for result in results]


def test_parallel_json_equals_serial_and_a_failing_model_fails_the_run(manifest: Path) -> None:
    serial = deferdump("check", "--manifest", str(manifest), "--json", "--jobs", "1")
    parallel = deferdump("check", "--manifest", str(manifest), "--json", "--jobs", "3")
    assert serial.returncode == parallel.returncode == 1, parallel.stdout + parallel.stderr
    assert "Traceback" not in parallel.stderr
    results = json.loads(parallel.stdout)
    assert [r["model"] for r in results] == ["CounterOk", "QueueMutant", "CounterDrifted", "DeadlockMutant",
                                             "CounterAgain"]
    assert [r["expected_ok"] for r in results] == [True, True, False, True, True]
    assert results[2]["message"].startswith("distinct states 9, manifest says 10")
    assert _without_seconds(results) == _without_seconds(json.loads(serial.stdout))


def test_parallel_table_lists_models_in_manifest_order(manifest: Path) -> None:
    out = deferdump("check", "CounterOk", "QueueMutant", "DeadlockMutant", "--manifest", str(manifest),
                    "--jobs", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    positions = [out.stdout.index(name) for name in ("CounterOk", "QueueMutant", "DeadlockMutant")]
    assert positions == sorted(positions)


def test_jobs_must_be_positive(manifest: Path) -> None:
    out = deferdump("check", "--manifest", str(manifest), "--jobs", "0")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert default_jobs() >= 1


Job = Callable[[Callable[[TlcProgress], None], threading.Event], CheckOutcome]


def _timed(spec: str, log: list[tuple[str, str, float]]) -> Job:
    def job(progress: Callable[[TlcProgress], None], cancel: threading.Event) -> CheckOutcome:
        log.append((spec, "start", time.monotonic()))
        try:
            return check_spec(FIXTURES / f"{spec}.tla", progress=progress, cancel=cancel, timeout=120)
        finally:
            log.append((spec, "end", time.monotonic()))
    return job


def test_two_jobs_run_at_the_same_time() -> None:
    log: list[tuple[str, str, float]] = []
    outcomes = _run([("Counter", _timed("Counter", log)), ("Lasso", _timed("Lasso", log))],
                    show_progress=False, parallel=2)
    assert [o.model for o in outcomes] == ["Counter", "Lasso"]
    assert outcomes[0].expected_ok and outcomes[1].result.kind is not None  # Lasso: its liveness violation
    starts = [at for _, event, at in log if event == "start"]
    ends = [at for _, event, at in log if event == "end"]
    assert max(starts) < min(ends), log  # the second JVM started before the first finished


def test_a_raising_job_cancels_every_running_model() -> None:
    """Big runs for minutes; a job raising (here KeyboardInterrupt) must end the whole run at once."""
    log: list[tuple[str, str, float]] = []

    def interrupted(progress: Callable[[TlcProgress], None], cancel: threading.Event) -> CheckOutcome:
        time.sleep(3)  # Big's JVM is running by now
        raise KeyboardInterrupt

    def never_started(progress: Callable[[TlcProgress], None], cancel: threading.Event) -> CheckOutcome:
        log.append(("never", "start", time.monotonic()))
        raise AssertionError("a job queued behind an interrupt must not start")

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _run([("Big", _timed("Big", log)), ("interrupt", interrupted), ("never", never_started)],
             show_progress=False, parallel=2)
    assert time.monotonic() - started < 30
    assert [(spec, event) for spec, event, _ in log] == [("Big", "start"), ("Big", "end")]


def _jvms_under(root: Path) -> list[str]:
    """Command lines of live processes that mention ``root`` (TLC's run directories live under it)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(root) in text and "tlc2.TLC" in text:
            found.append(text)
    return found


def test_ctrl_c_kills_every_jvm(tmp_path: Path) -> None:
    """SIGINT to the CLI while two models run: exit 130 at once, one line, no TLC left behind."""
    for source in FIXTURES.iterdir():
        shutil.copyfile(source, tmp_path / source.name)
    big = tmp_path / "manifest.json"
    big.write_text(json.dumps({"models": [_model("BigA", "Big", {"violation": "Deadlock"}, None),
                                          _model("BigB", "Big", {"violation": "Deadlock"}, None),
                                          _model("BigC", "Big", {"violation": "Deadlock"}, None)]}))
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {**os.environ, "TMPDIR": str(runs)}
    # Ctrl-C's default action, as a terminal gives it: a suite started in the background (`make test &`, a CI
    # runner's job) has SIGINT ignored, children inherit that, and Python then installs no KeyboardInterrupt
    process = subprocess.Popen([DEFERDUMP, "check", "--manifest", str(big), "--jobs", "2"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while len(_jvms_under(runs)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_jvms_under(runs)) == 2, "two TLC runs at once"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    deadline = time.monotonic() + 30  # the JVMs get the signal with the CLI; a loaded machine reaps them late
    while _jvms_under(runs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _jvms_under(runs) == []
