"""``deferdump mro FILE… [--json] [--run]``: read connector source, linearize its classes and judge every
connector class with the protocol model; with ``--run``, also replay each counterexample against the class
itself on stub vLLM (importing it in a child process).

Exit status: 0 when every judged connector is safe, 1 when some connector is unsafe or unknown, 2 for bad
input (a file that cannot be read or parsed, an impossible hierarchy, no connector classes), one line on
stderr and no traceback.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from deferdump.tools.cli.explain import steps_detail, write_page
from deferdump.tools.explain.binding import step_lines
from deferdump.tools.explain.html import render_html
from deferdump.tools.explain.source import timeline_for
from deferdump.tools.explain.trace import from_tlc_result
from deferdump.tools.mro.errors import MroError
from deferdump.tools.mro.judge import ConnectorJudgement, MroReport, judge_files
from deferdump.tools.mro.run.runner import run_report
from deferdump.tools.mro.source import DEFAULT_TRACKING_ATTR, source_files

EXIT_NOT_SAFE = 1

_VERDICT_STYLE = {"safe": "bold green", "unsafe": "bold red", "unknown": "bold yellow"}


def _render(report: MroReport, console: Console) -> None:
    """Per class: its bases and MRO; for a connector, a table of which definition of each connector method
    runs (with the model label it was judged by), the verdict per context, and why it is not safe."""
    hierarchy = report.hierarchy
    for base in report.imported_bases:
        where = f"read from {base.path}" if base.path is not None else f"not read: {base.why}"
        console.print(Text(f"base {base.name} (imported from {base.module} in {base.importer}): {where}",
                           style="dim" if base.path is not None else "yellow"))
    for name in report.shown:
        facts = hierarchy.classes[name]
        judgement = report.connectors.get(name)
        head = Text(name, style="bold")
        if judgement is not None:
            head.append("  ")
            head.append(judgement.verdict, style=_VERDICT_STYLE[judgement.verdict])
        elif name not in hierarchy.connectors:
            head.append("  (not a connector)", style="dim")
        console.print(head)
        console.print(f"  bases: {', '.join(facts.base_exprs) or '-'}")
        console.print(f"  MRO:   {' -> '.join(hierarchy.mro[name])}")
        if judgement is None:
            if facts.methods:
                console.print(f"  defines: {', '.join(facts.methods)}")
            console.print()
            continue
        labels: dict[str, str] = {}
        for context_judgement in reversed(judgement.judgements):
            labels.update(context_judgement.labels)
        table = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
        table.add_column("method")
        table.add_column("runs the definition in")
        table.add_column("model label")
        for method, owner in judgement.resolves.items():
            table.add_row(method, Text(owner, style="cyan" if owner == name else ""), labels.get(f"{owner}.{method}", ""))
        console.print(table)
        cases = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
        for column in ("case", "vLLM calls it", "wrapping", "verdict", "property", "from"):
            cases.add_column(column)
        for context_judgement in judgement.judgements:
            context = context_judgement.context
            verb = "could be violated" if context_judgement.verdict == "unknown" else "violated"
            cases.add_row(
                context.key.split("[")[0],
                context.describe().split(", wrapping")[0],
                context.inner or "-",
                Text(context_judgement.verdict, style=_VERDICT_STYLE[context_judgement.verdict]),
                f"{context_judgement.violated} {verb}" if context_judgement.violated else "",
                context_judgement.source,
            )
        console.print(cases)
        for context_judgement in judgement.judgements:
            if context_judgement.run is not None:
                run = context_judgement.run
                console.print(Text(f"    run {context_judgement.context.key}: {run.status}: {run.detail}",
                                   style="red" if run.status == "reproduced" else "dim"))
        shown: set[str] = set()
        for context_judgement in judgement.judgements:
            for reason in context_judgement.reasons:
                if reason not in shown:
                    shown.add(reason)
                    console.print(Text(f"    because {reason}", style="yellow"))
        _render_counterexample(judgement, console)
        console.print()
    console.print(
        f"{len(report.connectors)} connector(s) judged with {report.tlc_runs} TLC run(s) "
        f"({report.cached_runs} cached) in {report.seconds:.1f}s"
    )


def _render_counterexample(judgement: ConnectorJudgement, console: Console) -> None:
    """Why a connector is not safe: the violated property, the context and TLC's shortest counterexample,
    one numbered step at a time in connector-method words."""
    deciding = judgement.deciding
    if deciding is None or deciding.counterexample is None:
        return
    result = deciding.counterexample
    under = " (with the unrecognised definitions at their worst)" if deciding.verdict == "unknown" else ""
    if deciding.source == "running" and deciding.run is not None and (
            "sampled schedule" in deciding.run.detail or "explored schedule" in deciding.run.detail):
        under = (" (the model's, with the unrecognised definitions at their worst; the class itself reached the "
                 "hazard on another schedule: its calls are in --json's \"run\")")
    elif deciding.source == "running":
        under = " (with the unrecognised definitions at their worst; the class itself, run on stub vLLM, reached it)"
    console.print(Text(
        f"  counterexample{under}: {deciding.violated} violated, {deciding.context.describe()}", style="bold"
    ))
    for index, state in enumerate(result.trace):
        action = state.values.get("action")
        lines = step_lines(action) if isinstance(action, Mapping) else [state.action or "step"]
        console.print(Text(f"    {index + 1}. {lines[0]}"))
        for line in lines[1:]:
            console.print(Text(f"       {line}"))
    if result.loop_index is not None:
        console.print(Text(f"    ... then loops back to step {result.loop_index + 1}"))


def _write_pages(report: MroReport, directory: Path) -> list[Path]:
    """One ``deferdump explain`` page per connector that is not safe, named after the class."""
    written: list[Path] = []
    for name, judgement in report.connectors.items():
        deciding = judgement.deciding
        if deciding is None or deciding.counterexample is None:
            continue
        trace = from_tlc_result(deciding.counterexample, model=f"{name} ({deciding.context.describe()})",
                                variant=deciding.context.inner)
        page = directory / f"{name}.html"
        write_page(page, render_html(timeline_for(trace), steps_detail(trace)), str(page))
        written.append(page)
    return written


def mro(
    files: List[Path] = typer.Argument(..., help="Python source files, or folders (every *.py below them), analysed "
                                        "together; never imported (but with --run)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    tracking_attr: Optional[str] = typer.Option(
        None, "--tracking-attr",
        help=f"Attribute holding the async-dump tracking set (default: {DEFAULT_TRACKING_ATTR} and every "
        "attribute that behaves as one, found by data flow).",
    ),
    only: Optional[List[str]] = typer.Option(
        None, "--class", help="Judge only this connector class (repeatable); all classes are still listed."
    ),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds allowed per TLC run."),
    liveness: bool = typer.Option(
        False, "--liveness", help="Also check that every delayed request is eventually freed (slower)."
    ),
    html: Optional[Path] = typer.Option(
        None, "--html", help="Write one `deferdump explain` page per unsafe or unknown connector into DIR."
    ),
    run: bool = typer.Option(
        False, "--run", help="Also run the class on stub vLLM (imports and runs the files in a child process): "
        "each counterexample replayed, sampled schedules of each case's model, and schedules explored from the "
        "class's own answers; confirms a hazard or withdraws it; never makes a class safe.",
    ),
    store_modules: Optional[List[str]] = typer.Option(
        None, "--store-module", help="With --run: a module the connector imports its store client from, "
        "replaced by a recording store (repeatable). Its client must submit a dump as dump/dump_data(block_ids, "
        "...) with vLLM's block ids: the recording store reads them as the blocks the task reads.",
    ),
    run_timeout: float = typer.Option(60.0, "--run-timeout", help="With --run: seconds allowed per replay."),
    import_roots: Optional[List[Path]] = typer.Option(
        None, "--import-root", help="A folder to find the modules connectors import their bases from (vLLM's "
        "site-packages, a package's source tree; repeatable). Searched after each file's own folder and before "
        "where this Python finds the package; a base found nowhere is not read and its subclasses are unknown.",
    ),
) -> None:
    """Judge connector classes in FILE… with the model: MRO, method ownership, safe/unsafe/unknown."""
    if html is not None and not html.is_dir():
        raise MroError(f"--html {html}: not a directory")
    console = Console(stderr=json_out)
    if not console.is_terminal:
        console = Console(stderr=json_out, width=120)  # files and pipes: do not squeeze method names into 80
    if store_modules and not run:
        raise MroError("--store-module needs --run")
    if run_timeout <= 0:
        raise MroError(f"--run-timeout {run_timeout:g}: must be positive")
    for root in import_roots or ():
        if not root.is_dir():
            raise MroError(f"--import-root {root}: not a directory")
    files = source_files(files)
    with console.status("judging connectors with TLC") as status:
        report = judge_files(
            files,
            tracking_attr=tracking_attr,
            only=only,
            timeout=timeout,
            liveness=liveness,
            on_connector=lambda name: status.update(f"judging {name} with TLC"),
            import_roots=import_roots or (),
        )
        if run:
            report = run_report(report, files, store_modules or (), run_timeout,
                                on_replay=lambda name, case: status.update(f"running {name} ({case}) on stub vLLM"))
    if json_out:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        _render(report, console)
    if html is not None:
        for page in _write_pages(report, html):
            typer.echo(f"wrote {page}", err=True)
    if any(j.verdict != "safe" for j in report.connectors.values()):
        raise typer.Exit(EXIT_NOT_SAFE)
