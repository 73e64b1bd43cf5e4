"""``deferdump validate PATH... [--json]``: is a real vLLM run's connector event log a behaviour of the model?

PATH: log files or a directory holding one run's logs (written by the vLLM adapter with the
`trace_log` key of `kv_connector_extra_config`). Exit status 0 matched, 1 not matched, 2 bad input.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.panel import Panel
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from deferdump.conformance.tracevalidate import ValidationResult, render_state, validate as run_validation


def _explain(result: ValidationResult, console: Console) -> None:
    """The verdict; when not matched, the first event no behaviour reaches and the state just before it."""
    constants = result.model_constants
    header = (f"{result.matched_events}/{result.events} events matched · {len(constants['requests'])} requests, "
              f"{constants['blocks']} blocks, ranks {constants['ranks']}, block size {constants['block_size']} · "
              f"{result.seconds:.1f} s")
    if result.matched:
        console.print(Panel(header, title="TraceDeferDump: matched", border_style="green"))
        return
    unmatched = result.first_unmatched
    assert unmatched is not None
    console.print(Panel(header, title="TraceDeferDump: NOT matched", border_style="red"))
    console.print(f"[bold red]{escape(unmatched.event)}[/] at {escape(unmatched.file)}:{unmatched.line} (seq {unmatched.seq})")
    console.print(Text("  " + unmatched.reason, style="red"))
    console.print(Text("  logged: " + json.dumps(unmatched.record, separators=(",", ":"))), soft_wrap=True)
    table = Table(title="the model's state just before this event", show_header=True, header_style="bold")
    table.add_column("variable")
    table.add_column("value", overflow="fold")
    for line in render_state(unmatched.state_before):
        name, _, value = line.partition(" = ")
        table.add_row(Text(name), Text(value))
    console.print(table)


def validate(
    paths: list[Path] = typer.Argument(..., help="Log files, or a directory holding one run's *.ndjson logs."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (the verdict) on stdout."),
    timeout: Optional[float] = typer.Option(600.0, "--timeout", help="TLC time limit in seconds."),
) -> int:
    """Check a real run's connector event log against the TLA+ model (TraceDeferDump) with TLC."""
    result = run_validation(paths, timeout=timeout)
    if as_json:
        typer.echo(json.dumps(result.as_json()))
    else:
        _explain(result, Console())
    return 0 if result.matched else 1
