"""``deferdump bench``: no-save vs blocking vs deferred dumps, and the cost of everything else.

Exit status 0 when the benchmark ran (goals met or not: a missed goal is a finding, not an error), 2 for
bad input (e.g. ``--device cuda`` without CUDA). ``--json`` prints one object on stdout; progress goes
to stderr.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import logging
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from deferdump.reference.errors import UserError



class DeviceChoice(str, enum.Enum):
    cpu = "cpu"
    cuda = "cuda"


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def bench(
    quick: bool = typer.Option(False, "--quick", help="Scaled-down sizes; finishes within 2 minutes."),
    vllm: bool = typer.Option(False, "--vllm", help="Measure connectors inside real vLLM (run from .venv-vllm): "
                              "TTFT of a store hit over a recompute, prefill and decode throughput with saving on."),
    connector: Optional[list[str]] = typer.Option(None, "--connector", help="With --vllm: a connector to run "
                                                  "(repeatable; default every one this environment can run)."),
    rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="With --vllm: rounds (default 6, the fewest that decide a goal; 1 with --quick)."),
    device: DeviceChoice = typer.Option(DeviceChoice.cpu, "--device", help="Where the KV caches live."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with every figure."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write step-time distributions per mode (PNG).",
                                        dir_okay=False, writable=True),
    no_tlc: bool = typer.Option(False, "--no-tlc", help="Skip the TLC states/s figure."),
    no_malloc_tuning: bool = typer.Option(False, "--no-malloc-tuning",
                                          help="Keep glibc's default mmap/trim thresholds (see docs/benchmarks.md)."),
    load_async: bool = typer.Option(False, "--load-async", help="Also run one request stream with store hits twice, "
                                    "synchronous and asynchronous loads (figure load_modes, docs/async-loads.md)."),
) -> None:
    """Measure what deferring the dump wait buys (wait_for_save, step time) and what it costs."""
    if vllm:
        if device is not DeviceChoice.cpu or no_tlc or no_malloc_tuning or load_async:
            raise UserError("--device, --no-tlc, --no-malloc-tuning and --load-async are the simulated engine's "
                            "options, not --vllm's (its connectors: --connector)")
        _bench_vllm(quick, connector or [], rounds, as_json, plot)
        return
    if connector or rounds is not None:
        raise UserError("--connector and --rounds go with --vllm")
    from deferdump.tools.bench.suite import BenchConfig, run_bench  # torch loads only when a benchmark runs
    from deferdump.tools.bench.plot import plot_modes

    logging.getLogger("deferdump.reference").setLevel(logging.ERROR)
    config = BenchConfig.quick(device.value) if quick else BenchConfig.full(device.value)
    if no_malloc_tuning:
        config = dataclasses.replace(config, malloc_tuning=False)
    err = Console(stderr=True)
    with err.status("bench: starting") as status:
        report, runs = run_bench(config, on_progress=lambda message: status.update(f"bench: {message}"),
                                 include_tlc=not no_tlc)
        if load_async:
            from deferdump.tools.bench.load_modes import measure_load_modes

            status.update("bench: synchronous and asynchronous loads")
            report.update(measure_load_modes(60 if quick else 400))
    if plot is not None:
        title = (f"deferdump bench ({'quick' if quick else 'full'}, {report['device']}, {report['cpu_model']}, "
                 f"torch_threads={report['torch_threads']}, copy_threads={report['copy_threads']})")
        report["plot"] = str(plot_modes(runs, plot, title=title))
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=False))
        return
    table = Table(title=f"deferdump bench ({'quick' if quick else 'full'}, {report['device']})")
    for column in ("figure", "value", "goal", "met"):
        table.add_column(column)
    for key, verdict in report["goals"].items():
        reason = report.get(f"{key}_reason")
        table.add_row(key, _fmt(verdict["value"]) if reason is None else f"— ({reason})", verdict["goal"],
                      _fmt(verdict["met"]))
    table.add_row("wait_for_save_deferred_over_blocking", _fmt(report.get("wait_for_save_deferred_over_blocking")),
                  "report", "")
    table.add_row("tlc_distinct_states_per_s", _fmt(report.get("tlc_distinct_states_per_s")), "report", "")
    for model, row in report.get("tlc_models", {}).items():
        table.add_row(f"TLC {model}", f"{_fmt(row['generated_states'])} generated, {_fmt(row['distinct_states'])} "
                      f"distinct, {_fmt(row['search_seconds'])} s search, {_fmt(row['seconds'])} s", "", "")
    for mode, summary in report["step_ms"].items():
        table.add_row(f"step ms median ({mode})", _fmt(summary["median"]), "", "")
    for mode, row in report.get("load_modes", {}).items():
        table.add_row(f"loads ({mode})", f"{row['loads_completed']} loads, {row['parked']} parked, {row['steps']} steps, "
                      f"start_load_kv {_fmt(row['start_load_kv_ms_per_step_mean'])} ms/step", "report", "")
    Console().print(table)
    Console().print(f"{report['cpu_model']}, {report['cpu_cores']} cores, torch {report['torch_version']}, "
                    f"torch_threads={report['torch_threads']}, copy_threads={report['copy_threads']}, "
                    f"{report['seconds']} s")


def _bench_vllm(quick: bool, connectors: list[str], rounds: Optional[int], as_json: bool, plot: Optional[Path]) -> None:
    """`deferdump bench --vllm`: the connectors in real vLLM, their engines side by side, samples interleaved."""
    from deferdump.tools.bench.vllm_bench import VllmBenchConfig, plot_vllm, run_vllm_bench

    logging.getLogger("deferdump.reference").setLevel(logging.ERROR)
    config = VllmBenchConfig.quick() if quick else VllmBenchConfig()
    config = dataclasses.replace(config, connectors=tuple(connectors),
                                 rounds=rounds if rounds is not None else config.rounds)
    err = Console(stderr=True)
    with err.status("bench --vllm: starting") as status:
        report = run_vllm_bench(config, on_progress=lambda message: status.update(f"bench --vllm: {message}"))
    if plot is not None:
        title = (f"deferdump bench --vllm ({'quick' if quick else 'full'}, {report['prompt_tokens_label']}, "
                 f"{report['cpu_model']}, {report['rounds_label']})")
        report["plot"] = str(plot_vllm(report, plot, title=title))
    if as_json:
        typer.echo(json.dumps(report, indent=2, sort_keys=False))
        return
    table = Table(title=f"deferdump bench --vllm ({'quick' if quick else 'full'}, vLLM {report['vllm_version']})")
    for column in ("connector", "TTFT hit / recompute", "prefill / none", "decode / none", "hit tokens",
                   "stored MB/s"):  # ratios: median (quartiles) of the per-sample ratios
        table.add_column(column)
    for name, row in report["connectors"].items():
        table.add_row(name, _spread(row["vllm_ttft_hit_over_recompute"]),
                      _spread(row["vllm_prefill_throughput_over_none"]), _spread(row["vllm_decode_throughput_over_none"]),
                      str(row["hit_tokens"]), f"{row['stored_bytes_per_s']['median'] / 1e6:.1f}")
    Console().print(table)
    goals = Table(title="goals (reference-memory; met only when the 95 % interval of the median decides it)")
    for column in ("figure", "value", "interval", "goal", "met"):
        goals.add_column(column)
    for key, verdict in report["goals"].items():
        interval = verdict.get("interval")
        met = verdict["met"]
        goals.add_row(key, _fmt(verdict["value"]), "—" if interval is None else f"{interval[0]:.3g}-{interval[1]:.3g}",
                      verdict["goal"], "undecided" if met is None and interval is not None else _fmt(met))
    Console().print(goals)
    for name, why in report["skipped"].items():
        Console().print(f"skipped {name}: {why}")
    Console().print(f"{report['cpu_model']}, {report['cpu_cores']} cores, load {report['load_average_before'][0]:.2f} -> "
                    f"{report['load_average_after'][0]:.2f}, {report['seconds']} s")


def _spread(spread: dict[str, float]) -> str:
    """Median (quartiles), or (min-max) for a report without quartiles."""
    low, high = (spread["q1"], spread["q3"]) if "q1" in spread else (spread["min"], spread["max"])
    return f"{spread['median']:.3g} ({low:.3g}-{high:.3g})"
