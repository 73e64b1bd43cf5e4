"""``deferdump mro FILE… [--json]``: read connector source (never importing it), linearize its classes and
judge every connector class with the protocol model.

Exit status: 0 when every judged connector is safe, 1 when some connector is unsafe or unknown, 2 for bad
input (a file that cannot be read or parsed, an impossible hierarchy, no connector classes), one line on
stderr and no traceback.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .mro_judge import MroReport, judge_files
from .mro_source import DEFAULT_TRACKING_ATTR

EXIT_NOT_SAFE = 1

_VERDICT_STYLE = {"safe": "bold green", "unsafe": "bold red", "unknown": "bold yellow"}


def _render(report: MroReport, console: Console) -> None:
    """One table per class: its bases and MRO, what it defines, and for a connector which definition of each
    connector method runs and the model's verdict."""
    hierarchy = report.hierarchy
    for name in hierarchy.defined:
        facts = hierarchy.classes[name]
        judgement = report.connectors.get(name)
        title = Text(name, style="bold")
        if judgement is not None:
            title.append("  ")
            title.append(judgement.verdict, style=_VERDICT_STYLE[judgement.verdict])
        table = Table(title=title, title_justify="left", show_header=True, header_style="bold")
        table.add_column("method")
        table.add_column("runs the definition in")
        caption = f"bases: {', '.join(facts.base_exprs) or '-'}   MRO: {' -> '.join(hierarchy.mro[name])}"
        table.caption = caption
        table.caption_justify = "left"
        rows = judgement.resolves if judgement is not None else {m: name for m in facts.methods}
        for method, owner in rows.items():
            style = "cyan" if owner == name else ""
            table.add_row(method, Text(owner, style=style))
        console.print(table)
        if judgement is not None and judgement.verdict != "safe" and judgement.context is not None:
            line = Text("  ")
            line.append(judgement.verdict, style=_VERDICT_STYLE[judgement.verdict])
            line.append(f": {judgement.violated} violated in context: {judgement.context.describe()}")
            console.print(line)
            for reason in judgement.reasons:
                console.print(Text(f"    because {reason}", style="yellow"))
        console.print()
    console.print(
        f"{len(report.connectors)} connector(s) judged with {report.tlc_runs} TLC run(s) "
        f"({report.cached_runs} cached) in {report.seconds:.1f}s"
    )


def mro(
    files: List[Path] = typer.Argument(..., help="Python source files, analysed together; never imported."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    tracking_attr: str = typer.Option(
        DEFAULT_TRACKING_ATTR, "--tracking-attr", help="Attribute holding the async-dump tracking set."
    ),
    only: Optional[List[str]] = typer.Option(
        None, "--class", help="Judge only this connector class (repeatable); all classes are still listed."
    ),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds allowed per TLC run."),
) -> None:
    """Judge connector classes in FILE… with the model: MRO, method ownership, safe/unsafe/unknown."""
    console = Console(stderr=json_out)
    if json_out:
        report = judge_files(files, tracking_attr=tracking_attr, only=only, timeout=timeout)
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        with console.status("judging connectors with TLC") as status:
            report = judge_files(
                files,
                tracking_attr=tracking_attr,
                only=only,
                timeout=timeout,
                on_connector=lambda name: status.update(f"judging {name} with TLC"),
            )
        _render(report, console)
    if any(j.verdict != "safe" for j in report.connectors.values()):
        raise typer.Exit(EXIT_NOT_SAFE)
