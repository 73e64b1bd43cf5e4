"""`deferdump bench --vllm` without vLLM: the per-sample ratio arithmetic, the goals, the connector catalogue, and the
one-line refusal where vLLM is missing. The real run is tests/vllm/test_vllm_bench.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deferdump.tools.bench import vllm_bench
from deferdump.tools.bench.vllm_bench import (
    MIN_ROUNDS_TO_DECIDE,
    VllmBenchConfig,
    VllmBenchError,
    goals,
    median_interval,
    round_prompts,
    runnable_connectors,
    warmup_prompts,
    summarize,
)


CONFIG = VllmBenchConfig(prompt_tokens=512, decode_batch=4, decode_tokens=11)  # 40 decode tokens a sample


def _row(miss: list[float], hit: list[float], decode_s: list[float], hit_tokens: int = 480) -> dict[str, object]:
    return {"ttft_miss_s": miss, "ttft_hit_s": hit, "hit_tokens": [hit_tokens] * len(hit), "decode_s": decode_s,
            "stored_bytes": 1000, "save_s": sum(miss)}


def test_no_measured_prompt_shares_a_block_with_the_warm_up_or_another_measured_prompt() -> None:
    """A shared first block is a prefix-cache hit: a TTFT "miss" or a decode pair served from vLLM's own cache.
    Engines are fresh each round and warmed up first, so the warm-up's prompts and a round's prompts must be
    apart; and so must two rounds' (a later fix may keep engines across rounds). With the old int seeds,
    `Random(-1)` was `Random(1)`: round 1's first TTFT prompt was the warm-up's."""
    config = VllmBenchConfig(prompt_tokens=512, ttft_prompts=3, decode_batch=4, decode_prompt_tokens=128,
                             decode_pairs=4, seed=0)

    def first_blocks(batch: list[dict[str, list[int]]]) -> list[tuple[int, ...]]:
        return [tuple(p["prompt_token_ids"][: vllm_bench.BLOCK_SIZE]) for p in batch]

    long_prompt, warm_batch = warmup_prompts(config)
    seen = first_blocks(long_prompt) + first_blocks(warm_batch)
    for round_index in range(12):
        ttft_batch, pairs = round_prompts(config, round_index)
        seen += first_blocks(ttft_batch)
        for one_token, decoding in pairs:
            seen += first_blocks(one_token) + first_blocks(decoding)
    assert len(seen) == 1 + 4 + 12 * (3 + 4 * 8)
    assert len(set(seen)) == len(seen)
    again, _ = round_prompts(config, 5)
    assert again == round_prompts(config, 5)[0]  # every connector of a round gets the same prompts
    assert round_prompts(VllmBenchConfig(seed=1), 0)[0] != round_prompts(VllmBenchConfig(seed=0), 0)[0]


def test_ratios_are_taken_sample_by_sample_then_the_median_over_every_round() -> None:
    # The machine halves its speed between the two samples of each round (and round 2 runs slower still):
    # each ratio pairs the i-th samples of both connectors, so the drift cancels.
    rounds = [
        {"none": _row([1.0, 2.0], [1.0, 2.0], [0.4, 0.8]),
         "reference-memory": _row([1.1, 2.2], [0.2, 0.4], [0.5, 1.0]),
         "example": _row([1.5, 3.0], [0.5, 1.0], [0.8, 1.6])},
        {"none": _row([3.0, 6.0], [3.0, 6.0], [1.2, 2.4]),
         "reference-memory": _row([3.3, 6.6], [0.6, 1.2], [1.5, 3.0]),
         "example": _row([4.5, 9.0], [1.5, 3.0], [2.4, 4.8])},
    ]
    summary = summarize(rounds, ["none", "reference-memory", "example"], CONFIG)
    ref = summary["reference-memory"]
    assert ref["vllm_ttft_hit_over_recompute"]["median"] == pytest.approx(0.2)
    assert ref["vllm_ttft_hit_over_recompute"]["min"] == pytest.approx(0.2)
    assert ref["vllm_ttft_hit_over_recompute"]["max"] == pytest.approx(0.2)
    assert ref["vllm_ttft_hit_over_recompute"]["samples"] == 4
    assert ref["vllm_decode_throughput_over_none"]["median"] == pytest.approx(0.8)
    assert ref["vllm_prefill_throughput_over_none"]["median"] == pytest.approx(1 / 1.1)
    assert ref["ttft_hit_s"]["min"] == 0.2 and ref["ttft_hit_s"]["max"] == 1.2  # raw figures keep the drift
    assert ref["decode_tokens_per_s"]["max"] == pytest.approx(40 / 0.5)
    assert ref["hit_tokens"] == 480 and ref["stored_bytes"] == 1000
    verdicts = goals(summary, rounds * 3)  # 6 rounds: MIN_ROUNDS_TO_DECIDE
    assert verdicts["vllm_ttft_hit_over_recompute"]["met"] is True
    assert verdicts["vllm_decode_throughput_over_none"]["met"] is False  # 0.8 < 0.95
    assert verdicts["vllm_ttft_hit_over_recompute_reference_over_example"]["value"] == pytest.approx(0.4)
    assert verdicts["vllm_decode_throughput_over_none_reference_over_example"]["value"] == pytest.approx(0.8 / 0.5)
    assert verdicts["vllm_decode_throughput_over_none_reference_over_example"]["met"] is True


def test_one_outlying_sample_moves_the_median_not_the_verdict() -> None:
    # Ratios of the medians would be fooled by a sample that ran in a slow spell of one connector only.
    none = _row([1.0] * 12, [1.0] * 12, [0.5] * 12)
    ref = _row([1.0] * 12, [0.2] * 11 + [5.0], [0.5] * 11 + [9.0])
    rounds = [{"none": none, "reference-memory": ref}] * MIN_ROUNDS_TO_DECIDE
    summary = summarize(rounds, ["none", "reference-memory"], CONFIG)
    row = summary["reference-memory"]
    assert row["vllm_ttft_hit_over_recompute"]["median"] == pytest.approx(0.2)
    assert row["vllm_ttft_hit_over_recompute"]["max"] == pytest.approx(5.0)
    assert row["vllm_decode_throughput_over_none"]["median"] == pytest.approx(1.0)
    assert row["vllm_decode_throughput_over_none"]["q1"] == pytest.approx(1.0)
    verdicts = goals(summary, rounds)
    assert verdicts["vllm_decode_throughput_over_none"]["met"] is True
    assert verdicts["vllm_decode_throughput_over_none"]["interval"] == [pytest.approx(1.0), pytest.approx(1.0)]


def test_a_median_whose_interval_straddles_the_goal_is_undecided_not_met() -> None:
    # Decode ratios spread 0.85-1.05 around a median of 0.95: the bound lies inside the interval.
    spread = [0.85, 0.9, 0.93, 0.95, 0.95, 0.97, 1.0, 1.05]
    none = _row([1.0] * 8, [1.0] * 8, [1.0] * 8)
    ref = _row([1.0] * 8, [0.3] * 8, [1 / r for r in spread])
    example = _row([1.0] * 8, [0.3] * 8, [1 / r for r in reversed(spread)])
    rounds = [{"none": none, "reference-memory": ref, "example": example}] * MIN_ROUNDS_TO_DECIDE
    verdicts = goals(summarize(rounds, ["none", "reference-memory", "example"], CONFIG), rounds)
    decode = verdicts["vllm_decode_throughput_over_none"]
    assert decode["value"] == pytest.approx(0.95) and decode["met"] is None
    low, high = decode["interval"]
    assert low < 0.95 < high
    # Paired samples: the same spread in another order is no evidence either way.
    assert verdicts["vllm_decode_throughput_over_none_reference_over_example"]["met"] is None
    assert verdicts["vllm_ttft_hit_over_recompute_reference_over_example"]["met"] is True  # equal is as good
    assert verdicts["vllm_ttft_hit_over_recompute"]["met"] is True


def test_median_interval_is_seeded_and_pairs_samples_by_index() -> None:
    rounds = [[0.8, 0.9, 1.0], [1.1, 1.2], [0.95, 1.05]]
    assert median_interval(rounds) == median_interval(rounds)  # the same report, the same interval
    low, high = median_interval(rounds)
    assert 0.8 <= low <= 1.0 <= high <= 1.2
    # Each sample of one connector is exactly 2x the other's, whatever the machine did: the paired ratio is 2.
    doubled = [[2 * x for x in samples] for samples in rounds]
    assert median_interval(doubled, rounds) == (pytest.approx(2.0), pytest.approx(2.0))


def test_rounds_that_disagree_widen_the_interval_beyond_their_samples() -> None:
    # Every sample of a round agrees, but the rounds do not (their engines and machine state differ): 48
    # samples pooled look like a tight 0.955; the rounds say 0.90-1.00, and 0.95 is not decided.
    rounds = [[value] * 8 for value in (0.90, 0.92, 0.945, 0.965, 0.98, 1.00)]
    low, high = median_interval(rounds)
    assert low < 0.95 < high


def test_fewer_rounds_than_the_minimum_decide_nothing() -> None:
    one_round = {"none": _row([1.0] * 8, [1.0] * 8, [1.0] * 8),
                 "reference-memory": _row([1.0] * 8, [0.1] * 8, [1.0] * 8)}
    few = [one_round] * (MIN_ROUNDS_TO_DECIDE - 1)
    verdicts = goals(summarize(few, ["none", "reference-memory"], CONFIG), few)
    assert verdicts["vllm_ttft_hit_over_recompute"]["value"] == pytest.approx(0.1)
    assert verdicts["vllm_ttft_hit_over_recompute"]["met"] is None  # far from 0.5, yet too few rounds
    enough = [one_round] * MIN_ROUNDS_TO_DECIDE
    assert goals(summarize(enough, ["none", "reference-memory"], CONFIG), enough)[
        "vllm_ttft_hit_over_recompute"]["met"] is True
    assert VllmBenchConfig().rounds >= MIN_ROUNDS_TO_DECIDE  # the default run can decide


def test_a_missed_goal_and_a_worse_than_example_figure_are_reported_as_such() -> None:
    rounds = [{"none": _row([1.0], [1.0], [1.0]), "reference-memory": _row([1.0], [0.9], [1.25]),
               "example": _row([1.0], [0.5], [1.1])}] * MIN_ROUNDS_TO_DECIDE
    verdicts = goals(summarize(rounds, ["none", "reference-memory", "example"], CONFIG), rounds)
    assert verdicts["vllm_ttft_hit_over_recompute"]["met"] is False
    assert verdicts["vllm_decode_throughput_over_none"]["met"] is False
    assert verdicts["vllm_ttft_hit_over_recompute_reference_over_example"]["met"] is False
    assert verdicts["vllm_decode_throughput_over_none_reference_over_example"]["met"] is False


def test_goals_without_the_reference_connector_are_unknown_not_met() -> None:
    rounds = [{"none": _row([1.0], [1.0], [1.0])}]
    verdicts = goals(summarize(rounds, ["none"], CONFIG), rounds)
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
