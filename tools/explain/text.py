"""A :class:`Timeline` for a terminal: the same header, finding and steps, as rich text.

A 20-column swimlane does not fit a terminal, so each step is a short section listing the action and
only the lanes that changed in it (all non-empty lanes at step 0); the violating step and the lasso
loop are marked as on the page.
"""
from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from deferdump.tools.explain.timeline import Lane, Timeline, TimelineCell

TONE_STYLE = {
    "waiting": "white", "running": "blue", "preempted": "dark_orange", "delayed": "magenta", "done": "green",
    "reused": "dark_orange", "rewritten": "red", "clobbered": "bold red", "busy": "yellow", "alert": "bold red",
}


def _quiet(cell: TimelineCell) -> bool:
    return cell.lines in ((), ("—",)) or all(not line.strip() for line in cell.lines)


def _header(timeline: Timeline) -> Panel:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("model", timeline.model)
    table.add_row("variant", timeline.variant or "—")
    table.add_row("verdict", Text(timeline.verdict, style="bold red" if timeline.violated else "bold green"))
    table.add_row("trace", f"{timeline.source} · {len(timeline.columns)} steps")
    return Panel(table, title="deferdump explain", expand=False)


def _finding(timeline: Timeline) -> Panel | None:
    finding = timeline.finding
    if finding is None:
        return None
    body = Text(finding.summary)
    for offence in finding.offences:
        body.append("\n• " + offence.text)
    return Panel(body, title=f"✗ {finding.property}: step {finding.step}", border_style="red")


def _lane_line(lane: Lane, cell: TimelineCell) -> Text:
    text = Text("  ")
    text.append(f"{lane.group} / {lane.label}: ", style="bold")
    text.append(" · ".join(line.strip() for line in cell.lines), style=TONE_STYLE.get(cell.tone, ""))
    if cell.alert:
        text.append("   ◀ offending", style="bold red")
        text.stylize("on grey15", 0, len(text))
    return text


def _steps(timeline: Timeline) -> list[RenderableType]:
    parts: list[RenderableType] = []
    for column in timeline.columns:
        if timeline.loop_index == column.index:
            parts.append(Text(f"↻ loop starts here (step {column.index})", style="bold yellow"))
        title = f"step {column.index} · {column.label.name}"
        if column.marked:
            what = "loop starts: " if timeline.loop_index == column.index and timeline.finding \
                and timeline.finding.step == column.index else "breaks "
            title += f"   ✗ {what}{timeline.violated}"
        parts.append(Rule(title, align="left", style="red" if column.marked else "grey50"))
        for param in column.label.params:
            parts.append(Text("  " + param, style="dim"))
        for lane in timeline.lanes:
            cell = lane.cells[column.index]
            if (cell.changed or column.index == 0 or cell.alert) and (cell.alert or not _quiet(cell)):
                parts.append(_lane_line(lane, cell))
    if timeline.loop_index is not None:
        last = len(timeline.columns) - 1
        parts.append(Text(f"↻ after step {last} the behaviour returns to step {timeline.loop_index}, forever",
                          style="bold yellow"))
    return parts


def render_text(timeline: Timeline, console: Console) -> None:
    """Print the explanation: header, each step's changes, then the finding in words (last, so it stays in view)."""
    console.print(_header(timeline))
    console.print(Group(*_steps(timeline)))
    finding = _finding(timeline)
    if finding is not None:
        console.print(finding)
