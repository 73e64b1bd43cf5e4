"""``deferdump check``: model-check one spec, or the manifest's models against their expectations.

Exit status: 0 when every result is as expected, 1 when some result is not (a violation of a spec that
should pass, a TLC error, a changed state count…), 2 for bad input found before TLC ran (a missing
file, a malformed manifest, no Java, a corrupted jar). Bad input always gives one line on stderr.
"""
from __future__ import annotations

import enum
import json
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
from deferdump.tools.tlc.manifest import CheckOutcome, check_spec, load_manifest, outcomes_json
from deferdump.tools.tlc.parallel import Job, default_jobs, model_job, run_checks
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


class CheckUsageError(UserError):
    """Arguments that contradict each other."""


def _is_spec(target: str) -> bool:
    return target.endswith(".tla") or Path(target).is_file()


def _plan(targets: list[str], config: Path | None, workers: int | None, timeout: float | None,
          tier: Tier | None, manifest: Path | None) -> list[tuple[str, Job]]:
    """The checks to run, each a label and a function of (progress callback, cancel event)."""
    specs = [target for target in targets if _is_spec(target)]
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

        def run_spec(progress: Callable[[TlcProgress], None], cancel: threading.Event) -> CheckOutcome:
            return check_spec(spec, config, workers=workers or 1, timeout=timeout, progress=progress, cancel=cancel)

        return [(spec.stem, run_spec)]
    if config is not None:
        raise CheckUsageError("--config applies to a SPEC; manifest models name their own configs")
    entries = load_manifest(manifest).select(targets, None if tier is None else tier.value)
    if not targets and tier is None:
        entries = [entry for entry in entries if entry.tier == Tier.ci.value]
    return [(entry.name, model_job(entry, workers=workers, timeout=timeout)) for entry in entries]


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
    table = Table(title="deferdump check")
    for header, justify in (("Model", "left"), ("Expected", "left"), ("Result", "left"), ("Property", "left"),
                            ("Distinct", "right"), ("Generated", "right"), ("Depth", "right"),
                            ("Seconds", "right"), ("OK", "center")):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for outcome in outcomes:
        result = outcome.result
        verdict = result.status.value + (f" ({result.kind.value})" if result.kind else "")
        table.add_row(
            outcome.model, outcome.expectation.describe(), verdict, _cell(result.property),
            _cell(result.distinct_states), _cell(result.generated_states), _cell(result.depth),
            f"{result.seconds:.1f}", Text("yes", style="green") if outcome.expected_ok else Text("NO", style="bold red"),
        )
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


def check(
    targets: Optional[list[str]] = typer.Argument(  # noqa: UP045 - typer reads the annotation
        None, metavar="[SPEC.tla | NAME...]",
        help="A TLA+ module to check, or manifest model names (default: the ci tier)."),
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
) -> None:
    """Model-check a SPEC, or the manifest's models against their expected results."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    _show_info_logs()
    try:
        plan = _plan(list(targets or []), config, workers, timeout, tier, manifest)
        if plan:
            locate_tlc()  # fail on Java or the jar before any progress output
        outcomes = _run(plan, show_progress=not json_output, parallel=jobs or default_jobs())
    except UserError as error:
        err.print(Text(f"deferdump check: {error}"))
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except KeyboardInterrupt:
        err.print(Text("deferdump check: interrupted"))
        raise typer.Exit(130) from None

    if json_output:
        typer.echo(json.dumps(outcomes_json(outcomes), indent=2))
    else:
        out = Console(highlight=False, soft_wrap=True)
        if not out.is_terminal:
            out = Console(highlight=False, soft_wrap=True, width=160)  # logs: keep table rows whole
        if outcomes:
            _print_table(outcomes, out)
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
