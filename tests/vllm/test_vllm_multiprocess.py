"""[multiprocess] The prefix scenario in vLLM's default multiprocess mode.

The engine (scheduler-side connector) and the worker (worker-side connector) run in separate processes
that share only the FileStore directory; the metrics each instance writes at shutdown show the
scheduler's external hits and the worker's loads, with identical greedy outputs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
PROMPTS, FULL_BLOCKS_PER_PROMPT, BLOCK_SIZE = 3, 3, 32
DRIVER_TIMEOUT_S = 420
pytestmark = pytest.mark.slow  # long file: tests/conftest.py hands it to a worker first


def _samples(path: Path) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(path.read_text())
        for sample in family.samples
    }


def test_multiprocess_prefix_hits_across_processes(tiny_model: Path, store_dir: Path) -> None:
    metrics_dir, result = store_dir / "metrics", store_dir / "result.json"
    env = {key: value for key, value in os.environ.items() if key != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, str(HERE / "multiprocess_driver.py"), str(tiny_model), str(store_dir / "blocks"),
         str(metrics_dir), str(result)],
        env=env, capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    outcome = json.loads(result.read_text())
    assert outcome["engine_client"] != "InprocClient" and not outcome["worker_connector_in_driver"]
    assert outcome["second"] == outcome["first"]
    assert outcome["cached"] == [FULL_BLOCKS_PER_PROMPT * BLOCK_SIZE] * PROMPTS

    [scheduler_file] = metrics_dir.glob("deferdump-scheduler-rank0-*.prom")
    [worker_file] = metrics_dir.glob("deferdump-worker-rank0-*.prom")
    scheduler, worker = _samples(scheduler_file), _samples(worker_file)
    assert scheduler["deferdump_external_hit_tokens_total"] == PROMPTS * FULL_BLOCKS_PER_PROMPT * BLOCK_SIZE
    assert worker["deferdump_loads_completed_total"] == PROMPTS
    assert worker["deferdump_load_error_blocks_total"] == 0
    assert worker["deferdump_finished_sending_total"] == PROMPTS
    assert worker["deferdump_dumps_completed_total"] == worker["deferdump_dumps_submitted_total"] > 0
    assert worker["deferdump_verify_mismatches_total"] == 0
    assert worker["deferdump_pending_dump_tasks"] == 0 and worker["deferdump_live_event_handles"] == 0
