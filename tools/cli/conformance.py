"""``deferdump traces``, ``deferdump replay`` and ``deferdump verify``: the conformance loop on the CLI.

Exit status: 0 when everything is as expected, 1 when something is not (a divergence, a model check
with an unexpected result, edge coverage below 100 %), 2 for bad input (an unknown model, a malformed
trace file, no Java...), always as one line on stderr.
"""
from __future__ import annotations

import contextlib
import enum
import json
import logging
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from deferdump.reference.errors import UserError
from deferdump.tools.tlc.manifest import load_manifest

EXIT_UNEXPECTED = 1
EXIT_BAD_INPUT = 2


class Mode(str, enum.Enum):
    cover = "cover"
    simulate = "simulate"


def _quiet_reference_logs() -> None:
    """Replay injects store faults on purpose: the connector's warnings about them are expected noise."""
    logging.getLogger("deferdump.reference").setLevel(logging.ERROR)


def _out_console() -> Console:
    out = Console(highlight=False, soft_wrap=True)
    return out if out.is_terminal else Console(highlight=False, soft_wrap=True, width=160)


def _fail(command: str, error: Exception) -> typer.Exit:
    Console(stderr=True, highlight=False, soft_wrap=True).print(Text(f"deferdump {command}: {error}"))
    return typer.Exit(EXIT_BAD_INPUT)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


# --------------------------------------------------------------------------------------------- traces


def _check_out_dir(out: Path) -> None:
    """``--out`` must be a directory, or creatable as one (its nearest existing ancestor is a directory)."""
    existing = next(path for path in (out, *out.absolute().parents) if path.exists())
    if not existing.is_dir():
        raise UserError(f"--out {out}: {existing} exists and is not a directory")


def traces(
    name: str = typer.Argument(..., metavar="NAME", help="A model of the manifest."),
    mode: Mode = typer.Option(Mode.cover, "--mode", help="cover: an edge cover of the state graph; "
                                                         "simulate: TLC random simulation."),
    num: int = typer.Option(20, "--num", min=1, help="simulate: number of traces."),
    seed: int = typer.Option(0, "--seed", help="simulate: TLC's random seed (same seed, same traces)."),
    max_len: Optional[int] = typer.Option(None, "--max-len", min=2,  # noqa: UP045 - typer reads it
                                          help="Most states per trace (simulate: TLC -depth, default 30)."),
    out: Path = typer.Option(..., "--out", help="Directory for the .itf.json files (never overwritten)."),
    manifest: Optional[Path] = typer.Option(None, "--manifest", help="Manifest (default: the shipped one)."),  # noqa: UP045
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Generate ITF traces of a manifest model with TLC."""
    from deferdump.conformance.tracegen import generate_traces

    try:
        _check_out_dir(out)  # before TLC runs: a bad --out found after minutes of TLC is a waste
        entry = load_manifest(manifest).get(name)
        result = generate_traces(entry, mode.value, out, num=num, seed=seed, max_len=max_len)
    except UserError as error:
        raise _fail("traces", error) from None
    if json_output:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    data = result.to_json()
    _out_console().print(
        f"{result.model} ({result.mode}): {result.traces} traces, {data['total_states']} states in all "
        f"(longest {data['max_trace_states']}); {result.covered_edges}/{result.edges} edges of "
        f"{result.states} states covered -> {out}")


# --------------------------------------------------------------------------------------------- replay


def _print_replay(report: Any, console: Console) -> None:
    status = Text("all passed", style="green") if report.ok else Text(f"{len(report.failed)} FAILED", style="bold red")
    console.print(Text.assemble(f"replayed {report.traces} trace(s), {report.steps} steps in {report.seconds:.2f} s "
                                f"({report.steps_per_second:,.0f} steps/s): ", status))
    for cov in report.coverage:
        console.print(f"  {cov.model}: edges {cov.covered_edges}/{cov.edges} ({_pct(cov.to_json()['edge_coverage'])}), "
                      f"actions {cov.covered_actions}/{cov.actions}")
    for divergence in report.failed:
        console.print(Text(divergence.describe(), style="red"))
    if report.skipped:
        console.print(f"  {report.skipped} trace(s) not replayed (--stop-first)")


def replay(
    paths: list[Path] = typer.Argument(..., metavar="PATH...", help="ITF trace files (.itf.json)."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    stop_first: bool = typer.Option(False, "--stop-first", help="Stop after the first failing trace."),
    shrink: bool = typer.Option(True, "--shrink/--no-shrink", help="Write a shortest failing trace beside each failure."),
) -> None:
    """Replay traces against the reference connector, comparing state after every step."""
    from deferdump.conformance.replay import replay_paths

    _quiet_reference_logs()
    try:
        report = replay_paths(paths, stop_first=stop_first, shrink=shrink)
    except UserError as error:
        raise _fail("replay", error) from None
    if json_output:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_replay(report, _out_console())
    if not report.ok:
        raise typer.Exit(EXIT_UNEXPECTED)


# --------------------------------------------------------------------------------------------- verify


def verify(
    manifest: Optional[Path] = typer.Option(None, "--manifest", help="Manifest (default: the shipped one)."),  # noqa: UP045
    out: Optional[Path] = typer.Option(None, "--out",  # noqa: UP045
                                       help="Directory for the generated traces (default: a removed temp dir)."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    report: Optional[Path] = typer.Option(None, "--report",  # noqa: UP045
                                          help="Also write the JSON object to this file (e.g. for `make verify`'s tests)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1,  # noqa: UP045
                                       help="TLC runs at once, for the checks and the trace generation (default: one per CPU)."),
    cache: bool = typer.Option(True, "--cache/--no-cache",
                               help="Take edge covers from the trace cache ($DEFERDUMP_TRACE_CACHE, else ~/.cache/deferdump/traces), "
                                    "generating the missing ones into it; --no-cache generates every one afresh."),
    min_core_coverage: Optional[float] = typer.Option(  # noqa: UP045
        None, "--min-core-coverage", min=0.0, max=1.0,
        help="Fail below this share of the protocol core's branches reached by replay (default: 0.95, the shipped models' target)."),
) -> None:
    """Check the CI models, generate edge-cover traces of each conformance model, replay them, summarise."""
    from deferdump.conformance.verify import run_verify

    _quiet_reference_logs()
    if report is not None and report.is_dir():
        raise _fail("verify", UserError(f"--report {report} is a directory, not a file"))
    try:
        with _verify_progress(show=not json_output) as on_change:
            if out is None:
                with tempfile.TemporaryDirectory(prefix=".verify-", dir=_scratch_parent(cache)) as scratch:
                    result = run_verify(manifest, Path(scratch), jobs=jobs, min_core_coverage=min_core_coverage,
                                        cached=cache, on_change=on_change)
            else:
                result = run_verify(manifest, out, jobs=jobs, min_core_coverage=min_core_coverage, cached=cache,
                                    on_change=on_change)
    except UserError as error:
        raise _fail("verify", error) from None
    document = json.dumps(result.to_json(), indent=2)
    if report is not None:
        try:
            report.parent.mkdir(parents=True, exist_ok=True)
            report.write_text(document + "\n", encoding="utf-8")
        except OSError as error:
            raise _fail("verify", UserError(f"cannot write --report {report}: {error.strerror or error}")) from None
    if json_output:
        typer.echo(document)
    else:
        _print_verify(result, _out_console())
    if not result.ok:
        raise typer.Exit(EXIT_UNEXPECTED)


def _scratch_parent(cache: bool) -> str | None:
    """Where verify's throw-away trace directory goes: beside the trace cache when it reads from it (so its
    traces are hard links, not copies), else the system's temp directory."""
    if not cache:
        return None
    from deferdump.conformance.tracecache import cache_root

    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"cannot create the trace cache {root}: {error.strerror or error} "
                        "(set DEFERDUMP_TRACE_CACHE, or pass --no-cache)") from None
    return str(root)


@contextlib.contextmanager
def _verify_progress(show: bool) -> Iterator[Callable[[list[str], int], None] | None]:
    """A progress line on a terminal's stderr while the checks run (the slow part); nothing elsewhere."""
    console = Console(stderr=True)
    if not (show and console.is_terminal):
        yield None
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("checking the CI models")

        def on_change(running: list[str], finished: int) -> None:
            bar.update(task, description=f"checked {finished}: " + (", ".join(running) or "replaying the edge covers"))

        yield on_change


def _print_verify(result: Any, console: Console) -> None:
    from deferdump.tools.cli.check import _print_table

    if result.checks:
        _print_table(result.checks, console)
    table = Table(title="deferdump verify: conformance (edge-cover traces replayed on the reference connector)")
    for header in ("Model", "States", "Edges", "Traces", "Longest", "Steps", "Edge cov", "Action cov",
                   "Steps/s", "Failed", "OK"):
        table.add_column(header, justify="left" if header == "Model" else "right")
    for row in result.models:
        report = row.report
        cov = report.coverage[0] if report.coverage else None
        table.add_row(row.traces.model, f"{row.traces.states:,}", f"{row.traces.edges:,}", f"{row.traces.traces:,}",
                      str(max(row.traces.lengths, default=0)), f"{report.steps:,}",
                      _pct(None if cov is None else cov.covered_edges / cov.edges if cov.edges else None),
                      _pct(None if cov is None else cov.covered_actions / cov.actions if cov.actions else None),
                      f"{report.steps_per_second:,.0f}", str(len(report.failed)),
                      Text("yes", style="green") if row.ok else Text("NO", style="bold red"))
    console.print(table)
    core = result.core
    if core is not None:
        console.print(f"protocol core ({', '.join(core.classes)}): branch coverage "
                      f"{core.covered_branches}/{core.branches} ({_pct(core.branch_coverage)}), lines "
                      f"{core.covered_statements}/{core.statements} ({_pct(core.line_coverage)}) from conformance alone")
    for row in result.models:
        for divergence in row.report.failed:
            console.print(Text(divergence.describe(), style="red"))
    for problem in result.problems:
        console.print(Text(f"unexpected: {problem}", style="bold red"))
    console.print(Text("verify: OK", style="bold green") if result.ok else Text("verify: FAILED", style="bold red"))


__all__ = ["replay", "traces", "verify"]
