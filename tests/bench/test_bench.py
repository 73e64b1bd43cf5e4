"""The bench library on a tiny config: every figure is produced, through the real step loop,
real tensors, real stores and real TLC. No timing assertions: speed is what `deferdump bench` reports."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from deferdump.reference import ConnectorConfig, MemoryStore
from deferdump.conformance.tracesynth import synthetic_run
from deferdump.tools.bench.suite import (
    measure_conformance_cover,
    measure_replay,
    measure_tlc,
    measure_trace_validation,
    run_bench,
)
from deferdump.tools.bench.plot import plot_modes
from deferdump.tools.engine.phase_timer import PhaseTimer, summarize
from deferdump.tools.engine.steploop import LoopConfig, Mode, StepLoop
from support import FIXTURES as ALL_FIXTURES
from support.bench import tiny_config

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

FIXTURES = ALL_FIXTURES / "tla"
DEFERDUMP = str(Path(sys.executable).parent / "deferdump")
ISSUE_KEYS = (
    "wait_for_save_deferred_over_blocking", "step_overhead_over_nosave", "dump_bandwidth_over_memcpy",
    "python_ms_per_step_256", "wait_for_save_ms_per_step_256", "replay_steps_per_s", "tlc_distinct_states_per_s",
    "tlc_generated_states_per_s", "ci_tier_seconds", "device", "torch_threads",
    "copy_threads", "cpu_model",
)


@pytest.fixture(scope="module")
def tiny_bench() -> tuple[dict, dict]:
    return run_bench(tiny_config(), include_tlc=False)


def test_every_issue_key_is_present_with_sane_values(tiny_bench: tuple[dict, dict]) -> None:
    report, _runs = tiny_bench
    for key in ISSUE_KEYS:
        assert key in report, key
    for key in ("wait_for_save_deferred_over_blocking", "dump_bandwidth_over_memcpy", "python_ms_per_step_256",
                "wait_for_save_ms_per_step_256"):
        assert isinstance(report[key], float) and math.isfinite(report[key]) and report[key] > 0, key
    assert math.isfinite(report["step_overhead_over_nosave"]) and report["step_overhead_over_nosave"] > -1
    assert report["device"] == "cpu" and report["torch_threads"] >= 1 and report["copy_threads"] == 1
    assert report["cpu_model"] and report["torch_version"] == torch.__version__
    for key in ("replay_steps_per_s", "tlc_distinct_states_per_s", "tlc_generated_states_per_s", "ci_tier_seconds"):
        assert report[key] is None and report[f"{key}_reason"] or report[key] > 0
    if report["replay_steps_per_s"] is not None:  # the manifest lists a conformance model: it replayed cleanly
        assert report["replay_steps"] > 0 and report["replay_divergences"] == 0 and len(report["replay_models"]) == 1
    json.dumps(report)


def test_cover_figures_of_a_quick_run_replay_one_model_and_leave_coverage_to_the_full_run(
    tiny_bench: tuple[dict, dict],
) -> None:
    report, _runs = tiny_bench
    (model,) = report["cover_models"].values()
    assert model["divergences"] == 0 and model["edge_coverage"] == 1.0 and model["steps"] > 0
    assert report["cover_replay_max_s"] == pytest.approx(model["replay_s"], abs=1e-3)
    assert report["core_branch_coverage"] is None and "covers 1 of" in report["core_branch_coverage_reason"]
    assert report["core_coverage"]["branches"] > 0
    assert report["goals"]["core_branch_coverage"]["met"] is None
    assert report["goals"]["cover_replay_max_s"]["goal"] == "<= 30.0"


def test_cover_figures_are_null_with_a_reason_without_a_conformance_model(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"models": []}))
    figures = measure_conformance_cover(60.0, manifest_path=tmp_path / "manifest.json")
    assert figures["cover_replay_max_s"] is None and figures["core_branch_coverage"] is None
    assert "no conformance CI model" in figures["core_branch_coverage_reason"]


def test_raw_figures_have_medians_and_extremes(tiny_bench: tuple[dict, dict]) -> None:
    report, _runs = tiny_bench
    expected_steps = 2 * 4
    for mode in ("no_save", "blocking", "deferred"):
        summary = report["step_ms"][mode]
        assert summary["n"] == expected_steps and 0 < summary["min"] <= summary["median"] <= summary["max"]
    for mode in ("blocking", "deferred"):
        assert report["wait_for_save_ms"][mode]["n"] == expected_steps
    for mode in ("no_save", "blocking", "deferred"):
        cpu = report["cpu_ms_per_step"][mode]
        assert cpu["main_thread"] > 0 and cpu["cores_used"] > 0
    for key in ("dump_bandwidth_gbps", "memcpy_gbps"):
        assert report[key]["n"] == 2 and 0 < report[key]["min"] <= report[key]["median"] <= report[key]["max"]
    assert report["python_running_requests"]["min"] >= 256
    assert report["python_ms_raw"]["n"] == 3
    assert set(report["goals"]) >= {"wait_for_save_ms_per_step_256", "step_overhead_over_nosave",
                                    "dump_bandwidth_over_memcpy", "python_ms_per_step_256", "replay_steps_per_s"}
    assert "wait_for_save_deferred_over_blocking" not in report["goals"]  # reported, no longer a goal
    assert report["wait_for_save_ms_per_step_256"] == report["python_ms_by_phase"]["wait_for_save"]["median"]
    assert report["goals"]["replay_steps_per_s"]["met"] in (None, True, False)


def test_modes_run_identical_schedules_and_only_saving_modes_dump(tiny_bench: tuple[dict, dict]) -> None:
    _report, runs = tiny_bench
    assert runs[Mode.NO_SAVE].store is None
    deferred, blocking = runs[Mode.DEFERRED].loop, runs[Mode.BLOCKING].loop
    assert deferred.scheduler.admitted_total == blocking.scheduler.admitted_total
    assert deferred.scheduler.freed_total == blocking.scheduler.freed_total


def test_blocking_mode_leaves_no_dump_pending_after_wait_for_save() -> None:
    """The pre-PR behaviour is made by the loop: every task is waited inside the wait_for_save phase."""
    config = tiny_config()
    connector = ConnectorConfig(block_size=4)
    for mode, expect_pending in ((Mode.BLOCKING, False), (Mode.DEFERRED, None)):
        store = MemoryStore(64)
        loop = StepLoop(LoopConfig(config.workload, config.shape, connector, mode), store)
        seen_pending = []
        for _ in range(12):
            loop.step()
            seen_pending.append(len(loop.ranks[0].connector._pending_dump_tasks))
        if expect_pending is False:
            assert seen_pending == [0] * 12
        loop.shutdown()
        store.close()
        assert store.stats().dumps_submitted > 0


def test_plot_writes_a_png(tiny_bench: tuple[dict, dict], tmp_path: Path) -> None:
    _report, runs = tiny_bench
    path = plot_modes(runs, tmp_path / "sub" / "modes.png", title="tiny")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _tiny_manifest(tmp_path: Path, models: list[tuple[str, str, object, int | None]]) -> Path:
    for name in ("Counter", "Queue", "Deadlock"):
        for suffix in (".tla", ".cfg"):
            shutil.copy(FIXTURES / f"{name}{suffix}", tmp_path / f"{name}{suffix}")
    entries = [{"name": name, "module": module, "config": f"{module}.cfg", "tier": "ci", "variant": "Direct",
                "expect": expect, "distinct_states": distinct, "mutant": expect != "pass", "conformance": False}
               for name, module, expect, distinct in models]
    (tmp_path / "manifest.json").write_text(json.dumps({"models": entries}))
    return tmp_path / "manifest.json"


def test_tlc_figures_of_a_tiny_ci_tier(tmp_path: Path) -> None:
    manifest = _tiny_manifest(tmp_path, [("counter", "Counter", "pass", 9),
                                         ("queue", "Queue", {"violation": "LogBoundInv"}, None),
                                         ("deadlock", "Deadlock", {"violation": "Deadlock"}, 3)])
    started = time.perf_counter()
    figures = measure_tlc(60.0, manifest_path=manifest, jobs=2)
    wall = time.perf_counter() - started
    models = figures["tlc_models"]
    assert list(models) == ["counter", "queue", "deadlock"]
    assert models["counter"]["distinct_states"] == 9 and models["counter"]["generated_states"] == 14
    assert all(row["expected_ok"] for row in models.values()) and figures["ci_tier_all_expected"]
    for row in models.values():  # the search excludes the JVM start and parsing
        assert 0 <= row["search_seconds"] < row["seconds"]
    assert figures["tlc_jobs"] == 2 and figures["tlc_workers_per_model"] == 1
    assert 0 < figures["ci_tier_seconds"] <= round(wall, 2)  # the figure is rounded to 10 ms, so is the bound
    counted = [row for row in models.values() if "generated_per_s" in row]  # the rows the figure sums
    generated = sum(row["generated_states"] for row in counted)
    search = sum(row["search_seconds"] for row in counted)
    assert figures["tlc_generated_states"] == generated and search > 0
    slack = 0.0005 * len(models)  # each row's search_seconds is rounded to 1 ms; the figure uses the raw times
    assert generated / (search + slack) <= figures["tlc_generated_states_per_s"] <= generated / max(search - slack, 1e-9)
    assert figures["tlc_distinct_states_per_s"] > 0


def test_quick_tlc_figures_leave_the_tier_time_to_the_full_run(tmp_path: Path) -> None:
    manifest = _tiny_manifest(tmp_path, [("counter", "Counter", "pass", 9),
                                         ("queue", "Queue", {"violation": "LogBoundInv"}, None)])
    figures = measure_tlc(60.0, manifest_path=manifest, model_limit=1)
    assert list(figures["tlc_models"]) == ["counter"]
    assert figures["ci_tier_seconds"] is None and "--quick" in figures["ci_tier_seconds_reason"]
    assert figures["tlc_generated_states_per_s"] > 0


def test_tlc_figure_is_null_with_a_reason_for_an_empty_manifest(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"models": []}))
    figures = measure_tlc(60.0, manifest_path=tmp_path / "manifest.json")
    for key in ("tlc_distinct_states_per_s", "tlc_generated_states_per_s", "ci_tier_seconds"):
        assert figures[key] is None
        assert "no CI models" in figures[f"{key}_reason"]


def test_replay_figure_is_null_with_a_reason_without_a_conformance_model(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"models": []}))
    figures = measure_replay(manifest_path=tmp_path / "manifest.json")
    assert figures["replay_steps_per_s"] is None
    assert "no conformance CI model" in figures["replay_steps_per_s_reason"]


def test_phase_timer_accumulates_per_step() -> None:
    timer = PhaseTimer()
    timer.add("a", 0.5)
    timer.add("a", 0.25)
    timer.end_step()
    timer.add("b", 1.0)
    timer.end_step()
    assert timer.series("a") == [0.75, 0.0] and timer.total(("a", "b")) == [0.75, 1.0]
    assert summarize([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert timer.totals == {"a": 0.75, "b": 1.0} and timer.closed == 2
    lean = PhaseTimer(keep_steps=False)
    lean.add("a", 1.0)
    lean.end_step()
    assert lean.steps == [] and lean.totals == {"a": 1.0} and lean.closed == 1
    assert summarize([])["median"] is None


def test_cli_bench_cuda_without_cuda_is_one_line() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no CUDA device, even on a GPU machine
    done = subprocess.run([DEFERDUMP, "bench", "--quick", "--device", "cuda"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert "cuda" in done.stderr


def test_malloc_tuning_applies_in_a_fresh_process() -> None:
    code = "from deferdump.tools.bench.suite import tune_malloc; print(tune_malloc())"
    # The timeout only guards against a hang: on a loaded machine the import alone took over 60 s.
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: torch.cuda.is_available() is False")
def test_tiny_bench_on_cuda_produces_every_key() -> None:
    report, _runs = run_bench(dataclasses.replace(tiny_config(), device="cuda"), include_tlc=False)
    for key in ISSUE_KEYS:
        assert key in report, key
    assert report["device"] == "cuda" and report["gpu"]
    assert report["bandwidth_path"].startswith("CudaDevice")
    for key in ("wait_for_save_deferred_over_blocking", "dump_bandwidth_over_memcpy"):
        assert math.isfinite(report[key]) and report[key] > 0


def test_trace_validation_figure_from_a_synthetic_log() -> None:
    figures = measure_trace_validation(900.0, events=60)
    assert figures["trace_validation_events"] >= 60
    assert figures["trace_validation_events_per_s"] > 0
    assert figures["trace_validation_1000_events_s"] == pytest.approx(
        1000 / figures["trace_validation_events_per_s"])


def test_the_synthetic_log_is_protocol_correct_and_long_enough() -> None:
    scheduler, worker = synthetic_run(200)
    assert len(scheduler) + len(worker) >= 200
    delayed = [e for e in scheduler if e["event"] == "request_finished"]
    assert delayed and all(e["delayed"] for e in delayed)
