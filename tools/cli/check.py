"""``deferdump check``: model-check one spec, or the manifest's models against their expectations.

``--simulate`` runs TLC's random simulation instead (:mod:`deferdump.tools.tlc.simulate`); ``--shard K/N``
checks a deterministic part of the selection (or, simulating, part of every simulation's batches);
``--simulate --requests N`` grows each manifest model to N requests first (:mod:`...tlc.scale`), and
``--mutants`` selects the manifest's mutants (the simulation tier's sweep: does it find each bug at bounds
the exhaustive tiers cannot reach?); and
``--merge FILE...`` merges the ``--json`` results of the shards into one run's (:mod:`...tlc.merge`).

Exit status: 0 when every result is as expected, 1 when some result is not (a violation of a spec that
should pass, a TLC error, a changed state count…), 2 for bad input found before TLC ran (a missing
file, a malformed manifest, no Java, a corrupted jar). Bad input always gives one line on stderr.
"""
from __future__ import annotations

import dataclasses

import enum
import json
import secrets
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from deferdump.reference.errors import UserError
from deferdump.tools.tlc.java import locate_tlc
from deferdump.tools.tlc.cfg import strip_comments
from deferdump.tools.tlc.manifest import (
    CheckOutcome,
    Manifest,
    ModelEntry,
    check_spec,
    load_manifest,
    outcomes_json,
    simulate_model,
    simulate_spec,
)
from deferdump.tools.tlc.merge import load_results, merge_results
from deferdump.tools.tlc.parallel import Job, default_jobs, model_job, run_checks
from deferdump.tools.tlc.shard import Shard, shard_models
from deferdump.tools.tlc.scale import scaled_config
from deferdump.tools.tlc.simulate import BATCH_BEHAVIOURS, DEFAULT_DEPTH, SimulationPlan
from deferdump.tools.tlc.values import format_value
from deferdump.tools.tlc.bridge import Progress as TlcProgress
from deferdump.tools.tlc.bridge import Status


def _show_info_logs() -> None:
    """Let the library's INFO lines through to stderr (e.g. the TLC version of a TLA2TOOLS_JAR override)."""
    logger = logging.getLogger("deferdump")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("deferdump: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


EXIT_UNEXPECTED = 1
EXIT_BAD_INPUT = 2


class Tier(str, enum.Enum):
    """Manifest tiers selectable on the command line."""

    ci = "ci"
    deep = "deep"
    sim = "sim"


class CheckUsageError(UserError):
    """Arguments that contradict each other."""


def _is_spec(target: str) -> bool:
    return target.endswith(".tla") or Path(target).is_file()


def _is_safety_model(entry: ModelEntry) -> bool:
    """No PROPERTY in the cfg: a simulation's finite traces judge invariants only."""
    text = strip_comments(entry.config_path.read_text(encoding="utf-8", errors="replace"))
    return not any(word in ("PROPERTY", "PROPERTIES") for word in text.split())


def simulation_tier(manifest: Manifest) -> list[ModelEntry]:
    """What ``deferdump check --simulate`` covers by default: the deep tier's safety models and the sim tier."""
    return [entry for entry in manifest.models
            if entry.tier == Tier.sim.value or (entry.tier == Tier.deep.value and _is_safety_model(entry))]


def _plan(targets: list[str], config: Path | None, workers: int | None, timeout: float | None,
          tier: Tier | None, manifest: Path | None, simulation: SimulationPlan | None = None,
          shard: Shard | None = None, requests: int | None = None,
          mutants: bool = False, model_batches: bool = False) -> list[tuple[str, Job]]:
    """The checks to run, each a label and a function of (progress callback, cancel event).
    ``model_batches``: a simulated manifest model with a ``sim_batch`` runs batches of that size (no --batch)."""
    specs = [target for target in targets if _is_spec(target)]
    if specs and (requests is not None or mutants):
        raise CheckUsageError("--requests and --mutants select and grow manifest models, not a SPEC")
    if specs:
        if len(targets) > 1:
            raise CheckUsageError("give one SPEC.tla, or manifest model names, not both")
        if tier is not None:
            raise CheckUsageError("--tier selects manifest models; it does not apply to a SPEC")
        spec = Path(specs[0])
        if not spec.is_file():
            raise CheckUsageError(f"spec not found: {spec}")
        if config is not None and not config.is_file():
            raise CheckUsageError(f"config not found: {config}")
        if config is None and not spec.with_suffix(".cfg").is_file():
            raise CheckUsageError(f"config not found: {spec.with_suffix('.cfg')} (pass --config)")

        if shard is not None and simulation is None:
            raise CheckUsageError("--shard splits manifest models or a simulation, not the check of one SPEC")

        def run_spec(progress: Callable[[TlcProgress], None], cancel: threading.Event) -> CheckOutcome:
            if simulation is not None:
                return simulate_spec(spec, config, simulation, progress=progress, cancel=cancel)
            return check_spec(spec, config, workers=workers or 1, timeout=timeout, progress=progress, cancel=cancel)

        return [(spec.stem, run_spec)]
    if config is not None:
        raise CheckUsageError("--config applies to a SPEC; manifest models name their own configs")
    loaded = load_manifest(manifest)
    if mutants and targets:
        raise CheckUsageError("give model names or --mutants, not both")
    entries = loaded.select(targets, None if tier is None else tier.value)
    if mutants:
        # a simulation's finite traces judge invariants only: the mutants whose cfg lists no PROPERTY
        entries = [entry for entry in entries
                   if entry.mutant and (simulation is None or _is_safety_model(entry))]
    elif not targets and tier is None:
        entries = simulation_tier(loaded) if simulation is not None else [
            entry for entry in entries if entry.tier == Tier.ci.value]
    if simulation is not None:
        if requests is not None:
            for entry in entries:  # every cfg must grow before any TLC runs
                try:
                    scaled_config(entry.config_path.read_text(encoding="utf-8"), requests)
                except UserError as error:
                    raise CheckUsageError(f"{entry.name}: cannot grow to {requests} requests: {error}") from None
        return [(entry.name, _simulation_job(entry, _model_plan(entry, simulation, model_batches), requests))
                for entry in entries]
    too_big = [entry.name for entry in entries if entry.tier == Tier.sim.value]
    if too_big:
        raise CheckUsageError(f"tier sim is simulated only (add --simulate): {', '.join(too_big)}")
    if shard is not None:
        entries = shard_models(entries, shard)
    return [(entry.name, model_job(entry, workers=workers, timeout=timeout)) for entry in entries]


def _model_plan(entry: ModelEntry, plan: SimulationPlan, model_batches: bool) -> SimulationPlan:
    """The plan for one model: its manifest batch size where --batch was not given (a model whose 500
    behaviours outlast a minute gets fewer per TLC run, so a budget still ends batches, not the first one)."""
    if model_batches and entry.sim_batch is not None:
        return dataclasses.replace(plan, batch=entry.sim_batch)
    return plan


def _simulation_job(entry: ModelEntry, plan: SimulationPlan, requests: int | None = None) -> Job:
    def run_simulation(progress: Callable[[TlcProgress], None], cancel: threading.Event) -> CheckOutcome:
        return simulate_model(entry, plan, requests=requests, progress=progress, cancel=cancel)
    return run_simulation


def _run(jobs: list[tuple[str, Job]], show_progress: bool, parallel: int = 1) -> list[CheckOutcome]:
    """Run the checks ``parallel`` at a time (outcomes in the order of ``jobs``) under a progress bar."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    console = Console(stderr=True)
    # A progress bar only where someone watches: a non-terminal stderr would collect blank lines.
    with Progress(*columns, console=console, transient=True,
                  disable=not (show_progress and console.is_terminal)) as bar:
        task = bar.add_task("checking", total=len(jobs))

        def on_change(running: list[str], finished: int) -> None:
            bar.update(task, description=", ".join(running) or "checking", completed=finished)

        return run_checks(jobs, parallel, on_change=on_change)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _print_table(outcomes: list[CheckOutcome], console: Console) -> None:
    _print_rows([(outcome.expectation.describe(), row) for outcome, row in
                 zip(outcomes, outcomes_json(outcomes), strict=True)], console)


def _print_rows(rows: list[tuple[str, dict[str, object]]], console: Console) -> None:
    """(expected, ``--json`` object) rows as the result table; simulations add their behaviours and seed."""
    simulated = any(row.get("mode") == "simulate" for _, row in rows)
    grown = sorted({row["requests"] for _, row in rows if row.get("requests")})
    title = "deferdump check --simulate" if simulated else "deferdump check"
    if grown:
        title += f" (models grown to {', '.join(map(str, grown))} requests)"
    table = Table(title=title)
    headers = [("Model", "left"), ("Expected", "left"), ("Result", "left"), ("Property", "left"),
               ("Distinct", "right"), ("Generated", "right"), ("Depth", "right")]
    if simulated:
        headers += [("Behaviours", "right"), ("Seed", "right")]
    for header, justify in headers + [("Seconds", "right"), ("OK", "center")]:
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for expected, row in rows:
        verdict = f"{row['status']}" + (f" ({row['kind']})" if row.get("kind") else "")
        cells = [str(row["model"]), expected, verdict, _cell(row.get("property")), _cell(row.get("distinct_states")),
                 _cell(row.get("generated_states")), _cell(row.get("depth"))]
        if simulated:
            cells += [_cell(row.get("behaviours")), _cell(row.get("seed"))]
        ok = Text("yes", style="green") if row["expected_ok"] else Text("NO", style="bold red")
        table.add_row(*cells, f"{float(row['seconds']):.1f}", ok)  # type: ignore[arg-type]
    console.print(table)


def _print_details(outcome: CheckOutcome, console: Console) -> None:
    """The mismatch and the counterexample of an unexpected result."""
    console.print(Text(f"{outcome.model}: {outcome.summary}", style="bold"))
    result = outcome.result
    for state in result.trace:
        console.print(Text(f"  {state.index}: <{state.action or 'Initial predicate'}>", style="cyan"))
        for name, value in state.values.items():
            console.print(Text(f"      /\\ {name} = {format_value(value)}"))
    if result.loop_index is not None:
        what = "stutters forever" if result.stuttering else f"loops back to state {result.loop_index}"
        console.print(Text(f"  … then {what}", style="cyan"))


def _positive(value: float | None) -> float | None:
    if value is not None and value <= 0:
        raise typer.BadParameter(f"must be a positive number of seconds, not {value}")
    return value


def _merge(files: list[str], tier: Tier | None, manifest: Path | None) -> tuple[list[tuple[str, dict]], bool]:
    """``--merge``: the merged rows (expected, JSON object) and whether every one is as expected."""
    if not files:
        raise CheckUsageError("--merge needs the JSON files of the shards (deferdump check --json output)")
    loaded = load_manifest(manifest)
    known = {entry.name: entry for entry in loaded.models}

    def judge(model: str, item: dict) -> bool:
        entry = known.get(model)
        expect = entry.expect if entry is not None else None
        violated = item.get("property") or ("Deadlock" if item.get("kind") == "deadlock" else None)
        if expect is None or expect.passes:
            return item["status"] == "pass"
        return item["status"] == "violation" and violated == expect.violation

    expected_models = None if tier is None else [entry.name for entry in loaded.select(tier=tier.value)]
    merged = merge_results([(name, load_results(Path(name))) for name in files], expected_models=expected_models,
                           judge=judge)
    rows = [(known[item["model"]].expect.describe() if item["model"] in known else "pass", item) for item in merged]
    return rows, all(item["expected_ok"] for item in merged)


def check(
    targets: Optional[list[str]] = typer.Argument(  # noqa: UP045 - typer reads the annotation
        None, metavar="[SPEC.tla | NAME... | FILE.json...]",
        help="A TLA+ module to check, or manifest model names (default: the ci tier); with --merge, JSON files."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="Config for SPEC (default: SPEC.cfg)."),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", min=1,
                                          help="TLC worker threads (default 1; manifest models: their own)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", callback=_positive,
                                            help="Seconds before TLC is stopped (per model)."),
    tier: Optional[Tier] = typer.Option(None, "--tier", help="Only manifest models of this tier."),
    manifest: Optional[Path] = typer.Option(None, "--manifest",
                                            help="Manifest file (default: the shipped spec/manifest.json)."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON list of results on stdout."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1,
                                       help="Models checked at once (default: the number of CPUs)."),
    simulate: bool = typer.Option(False, "--simulate",
                                  help="TLC's random simulation instead of model checking (default models: "
                                       "the deep tier's safety models)."),
    depth: int = typer.Option(DEFAULT_DEPTH, "--depth", min=1,
                              help="Simulation: the longest behaviour (batches climb 8, 16, 8, 32, ... up to it)."),
    fixed_depth: bool = typer.Option(False, "--fixed-depth",
                                     help="Simulation: every batch at --depth (no ladder of shorter batches)."),
    seed: Optional[int] = typer.Option(None, "--seed", min=0,
                                       help="Simulation: the seed (default: a random one, printed in the result)."),
    num: Optional[int] = typer.Option(None, "--num", min=1,
                                      help="Simulation: behaviours in all (over every shard)."),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", callback=_positive,
                                                help="Simulation: seconds per model (default 60 without --num)."),
    requests: Optional[int] = typer.Option(None, "--requests", min=2,
                                           help="Simulation: grow each manifest model to this many requests "
                                                "(each with its prompt blocks, the pool as tight) first."),
    batch: Optional[int] = typer.Option(None, "--batch", min=1,
                                        help="Simulation: behaviours per TLC run (smaller: slow models finish "
                                             f"a batch within the budget; default: the model's sim_batch in "
                                             f"the manifest, else {BATCH_BEHAVIOURS})."),
    mutants: bool = typer.Option(False, "--mutants",
                                 help="Only the manifest's mutants (with --simulate: those whose cfg lists "
                                      "no PROPERTY)."),
    shard: Optional[str] = typer.Option(None, "--shard", metavar="K/N",
                                        help="Check part K of N of the selection (simulating: of its batches)."),
    merge: bool = typer.Option(False, "--merge", help="Merge the --json results of shards (FILE.json...)."),
) -> None:
    """Model-check a SPEC, or the manifest's models against their expected results."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    _show_info_logs()
    try:
        if merge:
            if simulate or shard is not None or config is not None or requests is not None or mutants:
                raise CheckUsageError("--merge takes the JSON files of finished runs; it checks nothing itself")
            rows, all_ok = _merge(list(targets or []), tier, manifest)
            _report_rows(rows, json_output)
            if not all_ok:
                raise typer.Exit(EXIT_UNEXPECTED)
            return
        part = None if shard is None else Shard.parse(shard)
        plan = None
        if simulate and (workers is not None or timeout is not None):
            raise CheckUsageError("--simulate runs one TLC worker per batch and stops at --time-budget; "
                                  "--workers and --timeout do not apply")
        if simulate:
            plan = SimulationPlan(depth=depth, seed=secrets.randbits(31) if seed is None else seed, num=num,
                                  time_budget=time_budget if time_budget is not None or num is not None else 60.0,
                                  batch=batch or BATCH_BEHAVIOURS, shard=part or Shard(), ladder=not fixed_depth)
        elif (seed is not None or num is not None or time_budget is not None or depth != DEFAULT_DEPTH
              or requests is not None or batch is not None or fixed_depth):
            raise CheckUsageError("--depth, --fixed-depth, --seed, --num, --time-budget, --batch and --requests "
                                  "apply to --simulate")
        checks = _plan(list(targets or []), config, workers, timeout, tier, manifest, plan, part, requests, mutants,
                       model_batches=batch is None)
        if checks:
            locate_tlc()  # fail on Java or the jar before any progress output
        outcomes = _run(checks, show_progress=not json_output, parallel=jobs or default_jobs())
    except UserError as error:
        err.print(Text(f"deferdump check: {error}"))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except KeyboardInterrupt:
        err.print(Text("deferdump check: interrupted"))
        raise typer.Exit(130) from None

    results = outcomes_json(outcomes)
    if part is not None and plan is None:
        for item in results:
            item["shard"] = str(part)  # for --merge: which part of the selection this run was
    if json_output:
        typer.echo(json.dumps(results, indent=2))
    else:
        out = _out_console()
        if outcomes:
            _print_rows([(o.expectation.describe(), item) for o, item in zip(outcomes, results, strict=True)], out)
            for outcome in outcomes:
                if not outcome.expected_ok:
                    _print_details(outcome, out)
    if not outcomes:
        err.print(Text("deferdump check: 0 models checked (the selection is empty)"))
    for outcome in outcomes:
        if outcome.result.status is Status.ERROR:
            err.print(Text(f"deferdump check: {outcome.model}: {outcome.result.message or outcome.summary}"))
    if not all(outcome.expected_ok for outcome in outcomes):
        raise typer.Exit(EXIT_UNEXPECTED)


def _out_console() -> Console:
    out = Console(highlight=False, soft_wrap=True)
    if not out.is_terminal:
        out = Console(highlight=False, soft_wrap=True, width=160)  # logs: keep table rows whole
    return out


def _report_rows(rows: list[tuple[str, dict]], json_output: bool) -> None:
    """Merged results: the JSON list, or the table and each unexpected result's counterexample."""
    if json_output:
        typer.echo(json.dumps([item for _, item in rows], indent=2))
        return
    out = _out_console()
    if rows:
        _print_rows(rows, out)
    for _, item in rows:
        if item["expected_ok"]:
            continue
        out.print(Text(f"{item['model']}: {item.get('message') or item['status']}", style="bold"))
        for index, step in enumerate(item.get("trace") or []):
            out.print(Text(f"  {index}: <{step.get('action') or 'Initial predicate'}>", style="cyan"))
