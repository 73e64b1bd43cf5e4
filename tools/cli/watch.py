"""``deferdump watch --connector NAME [--module-path M] [--extra JSON] [--scenario S]... [--json]``: any KV
connector in real vLLM, wrapped and watched, one verdict per scenario.

Verdicts: ok, contract_violation (the first bad boundary event), output_mismatch (prompt, first differing
token), crash (the exception, one line), hang (no progress within the watchdog bound; which requests still
hold blocks), skipped (with why), unknown (the check itself could not run). Exit status 0 when every
scenario is ok or skipped, 1 otherwise, 2 for bad input (a connector that cannot be imported or is not a
KV connector, bad JSON, an unknown scenario).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from deferdump.reference.errors import UserError
from deferdump.tools.tlc.cds import cache_dir
from deferdump.tools.watch.resolve import inner_config, resolve_inner
from deferdump.tools.watch.scenarios import SCENARIOS
from deferdump.tools.watch.session import run_scenarios
from deferdump.tools.watch.verdict import OK, SKIPPED, ScenarioResult

_STYLE = {"ok": "green", "skipped": "dim", "unknown": "yellow"}


class WatchInputError(UserError):
    """Bad `deferdump watch` input: unknown scenario, extra config that is not a JSON object."""


def _extra(text: Optional[str]) -> dict:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WatchInputError(f"--extra is not JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(value, dict):
        raise WatchInputError(f"--extra must be a JSON object, got {type(value).__name__}")
    return value


def watch(
    connector: str = typer.Option(..., "--connector", help="The connector class: a name vLLM knows, or a class in --module-path."),
    module_path: Optional[str] = typer.Option(None, "--module-path", help="The module holding the class (kv_connector_module_path)."),
    extra: Optional[str] = typer.Option(None, "--extra", help="The connector's kv_connector_extra_config, as a JSON object."),
    scenario: Optional[list[str]] = typer.Option(None, "--scenario", help=f"Run only these (repeatable): {', '.join(SCENARIOS)}."),
    scribble: bool = typer.Option(True, "--scribble/--no-scribble", help="Overwrite blocks vLLM hands out from its free pool."),
    as_json: bool = typer.Option(False, "--json", help='Print a JSON list of {"scenario","verdict","detail"}.'),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds one scenario may take before it is a hang."),
    hang_after: float = typer.Option(
        20.0, "--hang-after",
        help="The watchdog's bound: seconds without progress while the engine steps (one step may run 6x as long)."),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="Keep each scenario's logs and engine output here."),
) -> int:
    """Run vLLM scenarios with the connector inside deferdump's watching wrapper; one verdict per scenario."""
    names = list(scenario or SCENARIOS)
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise WatchInputError(f"unknown scenario {unknown[0]!r} (known: {', '.join(SCENARIOS)})")
    inner = inner_config(connector, module_path, _extra(extra))
    qualname, hma = resolve_inner(inner)
    console = Console(stderr=True)
    live = console.is_terminal and not as_json

    def progress(name: str, result: ScenarioResult | None) -> None:
        if live and result is None:
            console.print(f"[bold]{name}[/] … running", highlight=False)
        elif live and result is not None:
            console.print(f"[bold]{name}[/] → [{_STYLE.get(result.verdict, 'red')}]{result.verdict}[/]", highlight=False)

    if live:
        console.print(f"watching {qualname} ({'HMA' if hma else 'non-HMA'}), scribble {'on' if scribble else 'off'}")
    results = run_scenarios(names, inner, hma=hma, scribble=scribble, timeout=timeout, hang_after=hang_after,
                            work_root=work_dir, keep=work_dir is not None,
                            baseline_cache=cache_dir() / "watch", progress=progress)
    if as_json:
        typer.echo(json.dumps([result.as_json() for result in results]))
    else:
        table = Table(title=f"deferdump watch: {qualname}", show_header=True, header_style="bold")
        table.add_column("scenario")
        table.add_column("verdict")
        table.add_column("detail", overflow="fold")
        for result in results:
            table.add_row(result.scenario, Text(result.verdict, style=_STYLE.get(result.verdict, "red")),
                          Text(result.detail))
        Console().print(table)
    return 0 if all(result.verdict in (OK, SKIPPED) for result in results) else 1
