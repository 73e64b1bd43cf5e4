"""``deferdump soak``: N requests through the step loop under store faults, invariants checked every step.

Exit status 0 when every cell is clean (no violation, nothing pending or leaked, the store consistent,
resident memory within ±5 %), 1 when some cell is not, 2 for bad input. ``--json`` prints one object.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table



def soak(
    requests: int = typer.Option(100_000, "--requests", help="Requests in total, split over stores x variants."),
    faults: float = typer.Option(0.01, "--faults", help="Probability of an injected failure per submit, check, wait."),
    seed: int = typer.Option(0, "--seed", help="Seed of the workload and of the fault injection."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    store_dir: Optional[Path] = typer.Option(None, "--store-dir", exists=True, file_okay=False,
                                             help="Parent of the FileStore temp dirs (default: /dev/shm if usable)."),
    stores: Optional[list[str]] = typer.Option(None, "--store", help="A store to soak (repeatable): memory, file, "
                                                "redis. Default: memory and file."),
    redis_url: Optional[str] = typer.Option(None, "--redis-url", help="Server of the redis cells, e.g. "
                                            "redis://127.0.0.1:6379/0 or redis+cluster://host:port."),
    sliding_window: Optional[int] = typer.Option(None, "--sliding-window", help="Also soak a hybrid model per store "
                                                 "(full attention + a sliding window of this many tokens)."),
    hybrid_fence: str = typer.Option("freed", "--hybrid-fence", help="The hybrid cells' fence: freed, all_on_free, "
                                     "none (UCM #989 as merged: unsafe, the soak should fail)."),
    load_async: bool = typer.Option(False, "--load-async", help="Asynchronous loads in the direct and hybrid cells "
                                    "(WAITING_FOR_REMOTE_KVS, finished_recving)."),
) -> None:
    """Soak the reference connector: faults, preemptions, aborts; report leaks and invariant violations."""
    from deferdump.tools.bench.soak import STORES, SoakConfig, run_soak  # torch loads only when a soak runs

    logging.getLogger("deferdump.reference").setLevel(logging.CRITICAL)  # injected faults log by design
    config = SoakConfig(requests=requests, fault_rate=faults, seed=seed, store_root=store_dir,
                        stores=tuple(stores) if stores else STORES, redis_url=redis_url,
                        sliding_window=sliding_window, hybrid_fence=hybrid_fence, load_async=load_async)
    err = Console(stderr=True)
    columns = (TextColumn("soak"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("requests", total=requests)
        report = run_soak(config, on_progress=lambda freed: progress.advance(task, freed))
    data = report.to_json()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        table = Table(title=f"deferdump soak: {data['requests']} requests, faults {faults}, seed {seed}")
        for column in ("store", "variant", "requests", "steps", "violations", "pending", "handles", "leaked blocks",
                       "rss growth", "store", "ok"):
            table.add_column(column)
        for cell in data["cells"]:
            table.add_row(cell["store"], cell["variant"], str(cell["requests"]), str(cell["steps"]),
                          str(cell["violations"]), str(cell["pending_tasks"]), str(cell["live_event_handles"]),
                          str(cell["leaked_blocks"]), f"{cell['rss_growth']:+.2%}",
                          "consistent" if cell["store_consistent"] else "INCONSISTENT", "yes" if cell["ok"] else "NO")
        Console().print(table)
        Console().print(f"{data['seconds']} s; faults injected {data['faults_injected']}; "
                        f"store errors {data['store_errors']}")
        for cell in data["cells"]:
            for message in cell["violation_messages"][:5]:
                err.print(f"{cell['store']}/{cell['variant']}: {message}", markup=False)
    if not report.ok:
        raise typer.Exit(1)
