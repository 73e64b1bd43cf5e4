"""`deferdump bench --vllm` without vLLM: the round arithmetic, the goals, the connector catalogue, and the
one-line refusal where vLLM is missing. The real run is tests/vllm/test_vllm_bench.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deferdump.tools.bench import vllm_bench
from deferdump.tools.bench.vllm_bench import VllmBenchConfig, VllmBenchError, goals, runnable_connectors, summarize


def _row(miss: float, hit: float, decode: float, hit_tokens: int = 480) -> dict[str, float]:
    return {"ttft_miss_s": miss, "ttft_hit_s": hit, "hit_tokens": hit_tokens, "prefill_tokens_per_s": 512 / miss,
            "decode_tokens_per_s": decode, "stored_bytes": 1000, "stored_bytes_per_s": 1000 / miss}


def test_ratios_are_taken_within_a_round_then_the_median_over_rounds() -> None:
    # Round 2 runs on a machine twice as slow for everyone: within-round ratios stay the same.
    rounds = [
        {"none": _row(1.0, 1.0, 100.0), "reference-memory": _row(1.1, 0.2, 98.0), "example": _row(1.5, 0.5, 90.0)},
        {"none": _row(2.0, 2.0, 50.0), "reference-memory": _row(2.2, 0.4, 49.0), "example": _row(3.0, 1.0, 45.0)},
    ]
    summary = summarize(rounds, ["none", "reference-memory", "example"])
    ref = summary["reference-memory"]
    assert ref["vllm_ttft_hit_over_recompute"] == {"median": pytest.approx(0.2), "min": pytest.approx(0.2),
                                                   "max": pytest.approx(0.2)}
    assert ref["vllm_decode_throughput_over_none"]["median"] == pytest.approx(0.98)
    assert ref["vllm_prefill_throughput_over_none"]["median"] == pytest.approx(1 / 1.1)
    assert ref["ttft_hit_s"] == {"median": pytest.approx(0.3), "min": 0.2, "max": 0.4}  # raw figures keep the spread
    verdicts = goals(summary)
    assert verdicts["vllm_ttft_hit_over_recompute"]["met"] is True
    assert verdicts["vllm_decode_throughput_over_none"]["met"] is True
    assert verdicts["vllm_ttft_hit_over_recompute_reference_over_example"]["value"] == pytest.approx(0.4)
    assert verdicts["vllm_decode_throughput_over_none_reference_over_example"]["met"] is True


def test_a_missed_goal_and_a_worse_than_example_figure_are_reported_as_such() -> None:
    rounds = [{"none": _row(1.0, 1.0, 100.0), "reference-memory": _row(1.0, 0.9, 80.0),
               "example": _row(1.0, 0.5, 90.0)}]
    verdicts = goals(summarize(rounds, ["none", "reference-memory", "example"]))
    assert verdicts["vllm_ttft_hit_over_recompute"]["met"] is False
    assert verdicts["vllm_decode_throughput_over_none"]["met"] is False
    assert verdicts["vllm_ttft_hit_over_recompute_reference_over_example"]["met"] is False


def test_goals_without_the_reference_connector_are_unknown_not_met() -> None:
    verdicts = goals(summarize([{"none": _row(1.0, 1.0, 100.0)}], ["none"]))
    assert all(verdict["met"] is None and verdict["value"] is None for verdict in verdicts.values())


def test_none_always_runs_and_unknown_names_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    run, skipped = runnable_connectors(VllmBenchConfig(connectors=("example",)))
    assert run == ["none", "example"] and skipped == {}
    with pytest.raises(VllmBenchError, match="unknown connector 'lmcache'"):
        runnable_connectors(VllmBenchConfig(connectors=("lmcache",)))
    monkeypatch.setattr(vllm_bench, "redis_available", lambda: False)
    run, skipped = runnable_connectors(VllmBenchConfig(connectors=("reference-redis", "reference-file")))
    assert run == ["none", "reference-file"] and skipped == {"reference-redis": "redis-server not installed"}


def test_async_load_variants_appear_exactly_when_the_connector_has_load_async() -> None:
    names = vllm_bench.all_connectors()
    assert ("reference-memory-async-load" in names) == vllm_bench.async_loads_available()


def test_bench_vllm_without_vllm_is_one_line(tmp_path: Path) -> None:
    probe = subprocess.run([sys.executable, "-c", "import vllm; vllm.__version__"], cwd=tmp_path, capture_output=True)
    if probe.returncode == 0:  # (in this process tests/vllm imports as a namespace package named vllm)
        pytest.skip("vLLM is installed here: tests/vllm/test_vllm_bench.py runs the real bench")
    out = subprocess.run([sys.executable, "-m", "deferdump.tools.cli.app", "bench", "--vllm", "--quick",
                          "--connector", "none"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert "vLLM is not importable here" in line and ".venv-vllm" in line
