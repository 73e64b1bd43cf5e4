"""``deferdump validate PATH... [--contract] [--drained] [--json]``: is a real vLLM run's log a behaviour of the model?

PATH: log files or a directory holding one run's logs: the reference connector's own event log (the vLLM
adapter's `trace_log` key), checked against the DeferDump model with TLC; or any connector's boundary log
(a watching wrapper's, first line `connector`, or with `--contract`), checked against the connector contract
(docs/contract.md). Exit status 0 matched / ok, 1 not, 2 bad input.
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

from deferdump.conformance.contractlog import ContractVerdict, check_events
from deferdump.conformance.tracelog import load_events
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


def contract_json(verdict: ContractVerdict) -> dict[str, object]:
    """Exactly the object `deferdump validate --contract --json` prints."""
    return {"ok": verdict.ok, "property": verdict.property, "detail": verdict.detail, "events": verdict.events,
            "unchecked": list(verdict.unchecked)}


def _explain_contract(verdict: ContractVerdict, console: Console) -> None:
    """The contract verdict: the broken clause and the first bad event, and the clauses left unchecked."""
    header = f"{verdict.events} events"
    if verdict.ok:
        console.print(Panel(header, title="ConnectorContract: ok", border_style="green"))
    else:
        console.print(Panel(header, title=f"ConnectorContract: {verdict.property} violated", border_style="red"))
        console.print(Text("  " + (verdict.detail or ""), style="red"), soft_wrap=True)
    for name in verdict.unchecked:
        console.print(Text(f"  not decided by this log: {name}", style="yellow"))


def validate(
    paths: list[Path] = typer.Argument(..., help="Log files, or a directory holding one run's *.ndjson logs."),
    contract: bool = typer.Option(False, "--contract",
                                  help="Check against the connector contract (any connector's boundary log)."),
    drained: bool = typer.Option(False, "--drained",
                                 help="The run ended with nothing in flight: every delayed free must be reported."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (the verdict) on stdout."),
    timeout: Optional[float] = typer.Option(600.0, "--timeout", help="TLC time limit in seconds."),
) -> int:
    """Check a real run's log against the TLA+ model (TraceDeferDump, with TLC) or the connector contract."""
    events = load_events(paths)
    if contract or events[0].event == "connector":
        verdict = check_events(events, drained=drained)
        if as_json:
            typer.echo(json.dumps(contract_json(verdict)))
        else:
            _explain_contract(verdict, Console())
        return 0 if verdict.ok else 1
    result = run_validation(paths, timeout=timeout)
    if as_json:
        typer.echo(json.dumps(result.as_json()))
    else:
        _explain(result, Console())
    return 0 if result.matched else 1
