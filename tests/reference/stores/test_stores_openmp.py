"""[openmp] The connector's background threads open no OpenMP teams, and leave the forward's as it was.

Real torch, real OpenMP runtime, in a process with two OpenMP threads (tests/support/openmp_probe.py): a
thread's first parallel region creates a team (new OS threads), which is what throttles the forward's team
on a small machine (reference/stores/openmp.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
PROBE = Path(__file__).resolve().parents[2] / "support" / "openmp_probe.py"


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    completed = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout)


def test_a_plain_thread_opens_a_team_and_a_serial_one_does_not(probe: dict[str, Any]) -> None:
    assert probe["plain"]["created"] >= 1 and probe["plain"]["max_threads"] == 2  # the control: the hazard
    assert probe["serial"] == {"created": 0, "max_threads": 1, "took": 1}


def test_the_forwards_thread_and_torchs_setting_stay(probe: dict[str, Any]) -> None:
    assert probe["main_before"] == probe["main_after"] == 2
    assert probe["torch_before"] == probe["torch_after"] == 2


def test_work_queue_jobs_and_watcher_callbacks_run_serial(probe: dict[str, Any]) -> None:
    assert probe["work_queue"] == [{"created": 0, "max_threads": 1}] * 4
    assert probe["watcher"] == {"created": 0, "max_threads": 1}


def test_without_torch_nothing_is_touched() -> None:
    code = ("import sys; from deferdump.reference.stores.openmp import serial_openmp_in_this_thread as s; "
            "r = s(); assert 'torch' not in sys.modules; print(r)")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "False"
