"""[watch multiprocess] The wrapper in vLLM's default multiprocess mode: the engine and the worker each write
their own boundary log, which together pass the connector contract, and the outputs are served from the
connector unchanged (scribble on)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deferdump.conformance.contractlog import check_contract_log
from deferdump.conformance.tracelog import load_events
from deferdump.reference.testing.tinymodel import write_tiny_model

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


def test_wrapper_logs_both_processes(store_dir: Path) -> None:
    model, logs, result = write_tiny_model(store_dir / "model"), store_dir / "log", store_dir / "result.json"
    env = {key: value for key, value in os.environ.items() if key != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    completed = subprocess.run([sys.executable, str(HERE / "watch_multiprocess_driver.py"), str(model),
                                str(store_dir / "store"), str(logs), str(result)],
                               env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-4000:]
    outcome = json.loads(result.read_text())
    assert outcome["engine_client"] != "InprocClient"
    assert outcome["second"] == outcome["first"] and len(outcome["first"]) == 3
    files = sorted(path.name for path in logs.glob("*.ndjson"))
    assert [name.split("-")[0] for name in files] == ["scheduler", "worker"], files
    assert all(str(outcome["pid"]) not in name for name in files)  # neither connector ran in the driver
    events = load_events([logs])
    assert {e.record["event"] for e in events} >= {"connector", "build_connector_meta", "scribble", "get_finished"}
    assert any(e.event == "get_num_new_matched_tokens" and e.record["matched"] for e in events)  # served from it
    verdict = check_contract_log([logs], drained=True)
    assert verdict.ok, verdict
