"""``deferdump explain TARGET [--html OUT] [--svg OUT]``: a counterexample or trace as a timeline.

TARGET is an ITF trace file or a manifest model name (TLC's counterexample, or a representative run when
the model passes). Without ``--html``/``--svg`` the explanation is printed for the terminal. Exit status 0
when the explanation was produced (whatever the verdict), 2 for bad input (one line on stderr).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from deferdump.tools.explain.html import render_html, render_svg
from deferdump.tools.explain.source import SIMULATION_DEPTH, SIMULATION_SEED, load_target, timeline_for
from deferdump.tools.explain.text import render_text
from deferdump.tools.explain.trace import ExplainError, ExplainTrace
from deferdump.tools.tlc.values import format_value


def write_page(path: Path, text: str, target: str) -> None:
    """Write atomically (a crash never leaves half a page) and never over the trace being explained."""
    source = Path(target)
    if source.exists() and path.exists() and path.resolve() == source.resolve():
        raise ExplainError(f"refusing to write over the trace being explained: {path}")
    if not path.parent.resolve().is_dir():
        raise ExplainError(f"cannot write {path}: directory {path.parent} does not exist")
    if path.is_dir():
        raise ExplainError(f"cannot write {path}: it is a directory")
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent.resolve())
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes 0600; the page is an ordinary file
        os.replace(temporary, path)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        raise ExplainError(f"cannot write {path}: {error.strerror or error}") from None


def steps_detail(trace: ExplainTrace) -> list[tuple[int, str, str]]:
    """(step, action name, the full action record as TLA+ text) for the page's detail table."""
    return [(step.index, step.name, format_value(step.action)) for step in trace.steps]


def explain(
    target: str = typer.Argument(..., help="An ITF trace file (.itf.json) or a model name from the manifest."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML page here."),
    svg: Optional[Path] = typer.Option(None, "--svg", help="Write the timeline as a standalone SVG here."),
    manifest: Optional[Path] = typer.Option(None, "--manifest", help="Manifest to look models up in."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="TLC time limit in seconds."),
    depth: int = typer.Option(SIMULATION_DEPTH, "--depth", min=1,
                              help="Steps of the representative run simulated for a passing model."),
    seed: int = typer.Option(SIMULATION_SEED, "--seed", help="TLC simulation seed for a passing model."),
) -> None:
    """Draw a counterexample or trace as a swimlane timeline (requests, blocks, ranks, scheduler)."""
    for out in (html, svg):
        if out is not None and not out.parent.resolve().is_dir():
            raise ExplainError(f"cannot write {out}: directory {out.parent} does not exist")
    trace = load_target(target, manifest=manifest, timeout=timeout, depth=depth, seed=seed)
    timeline = timeline_for(trace)
    if html is None and svg is None:
        render_text(timeline, Console(highlight=False))
        return
    if html is not None:
        write_page(html, render_html(timeline, steps_detail(trace)), target)
        typer.echo(f"wrote {html}: {timeline.model}, {timeline.verdict}, {len(timeline.columns)} steps", err=True)
    if svg is not None:
        write_page(svg, render_svg(timeline), target)
        typer.echo(f"wrote {svg}", err=True)
