"""`deferdump bench --vllm` through real vLLM, scaled down: every connector's round runs, a repeated prompt is
served from the store (its hit tokens counted by vLLM), and the report holds each figure the docs cite."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from deferdump.tools.bench.vllm_bench import GOALS, VllmBenchConfig, run_vllm_bench

CONFIG = VllmBenchConfig(prompt_tokens=112, ttft_prompts=1, decode_batch=2, decode_prompt_tokens=64, decode_tokens=4,
                         decode_pairs=2, rounds=1,
                         connectors=("example", "reference-memory", "reference-file", "reference-redis"),
                         kv_cache_bytes=64 << 20)


def test_bench_vllm_serves_repeated_prompts_from_each_store_and_reports_every_figure(vllm_root: Path) -> None:
    progress: list[str] = []
    report = run_vllm_bench(CONFIG, on_progress=progress.append, workdir=vllm_root / "bench")
    assert list(report["connectors"]) == ["none", "example", "reference-memory", "reference-file", "reference-redis"]
    names = list(report["connectors"])
    assert progress[0] == "round 1/1: starting 5 engines"  # every engine alive at once, each in its own process
    assert sorted(progress[1:6]) == sorted(f"round 1/1: engine {name} ready" for name in names)
    assert progress[6:] == ["round 1/1: TTFT miss 1/1", "round 1/1: TTFT hit 1/1", "round 1/1: decode pair 1/2",
                            "round 1/1: decode pair 2/2"]
    assert all(len(report["rounds"][0][name]["decode_s"]) == 2 for name in names)
    full_blocks = 3 * 32  # 3.5 blocks: the three full ones come from the store
    assert report["connectors"]["none"]["hit_tokens"] == 0  # no connector, prefix cache reset: a recompute
    for name in ("example", "reference-memory", "reference-file", "reference-redis"):  # each store's bytes counted
        row = report["connectors"][name]
        assert row["hit_tokens"] == full_blocks, (name, row["hit_tokens"])
        assert row["stored_bytes"] > 0 and row["stored_bytes_per_s"]["median"] > 0, name
        for key in ("vllm_ttft_hit_over_recompute", "vllm_prefill_throughput_over_none",
                    "vllm_decode_throughput_over_none"):
            assert row[key]["min"] <= row[key]["q1"] <= row[key]["median"] <= row[key]["q3"] <= row[key]["max"], (name, key)
            assert row[key]["median"] > 0, (name, key)
    assert set(GOALS) <= set(report["goals"])
    assert report["goals"]["vllm_ttft_hit_over_recompute"]["value"] == \
        report["connectors"]["reference-memory"]["vllm_ttft_hit_over_recompute"]["median"]
    assert report["vllm_version"].startswith("0.32")


def test_bench_vllm_json_is_the_only_thing_on_stdout(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}  # a user's shell: vLLM not yet set up
    out = subprocess.run([sys.executable, "-m", "deferdump.tools.cli.app", "bench", "--vllm", "--quick",
                          "--connector", "none", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)  # vLLM's own log lines went to stderr
    assert list(report["connectors"]) == ["none"] and report["goals"]["vllm_ttft_hit_over_recompute"]["met"] is None
