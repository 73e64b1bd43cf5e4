"""A :class:`Timeline` as an SVG swimlane chart and as one self-contained HTML page.

Everything is inline (SVG, CSS, generic font families; no scripts, no external fonts or images), so the
page opens from disk with no network. Text in SVG does not wrap by itself: cells are wrapped here to a
fixed number of monospace characters and each lane is as tall as its tallest cell.
"""
from __future__ import annotations

import html
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from deferdump.tools.explain.timeline import Column, Timeline, TimelineCell

FONT = "'DejaVu Sans Mono', 'Liberation Mono', Menlo, Consolas, monospace"
FONT_PX = 12
CHAR_PX = 7.3  # advance of a 12 px monospace glyph, rounded up
LINE_PX = 15
LABEL_W = 150
COL_W = 236
PAD = 6
GROUP_H = 22
LOOP_H = 40
CHARS = int((COL_W - 2 * PAD) / CHAR_PX)

SVG_CSS = f"""
svg.timeline {{ font-family: {FONT}; font-size: {FONT_PX}px; }}
.bg {{ fill: #ffffff; }}
.title {{ font-size: 15px; font-weight: 700; fill: #111827; }}
.subtitle {{ fill: #374151; }}
.head {{ fill: #f3f4f6; stroke: #d1d5db; }}
.head.loop {{ fill: #fef9c3; }}
.head.marked {{ fill: #fee2e2; stroke: #b91c1c; stroke-width: 2; }}
.stepno {{ fill: #6b7280; }}
.action {{ font-weight: 700; fill: #111827; }}
.param {{ fill: #374151; }}
.group {{ fill: #1f2937; }}
.grouptext {{ fill: #ffffff; font-weight: 700; }}
.lanelabel {{ fill: #f9fafb; stroke: #d1d5db; }}
.lanetext {{ font-weight: 700; fill: #111827; }}
.cell {{ fill: #ffffff; stroke: #e5e7eb; }}
.cell.waiting {{ fill: #f3f4f6; }}
.cell.running {{ fill: #dbeafe; }}
.cell.preempted {{ fill: #fed7aa; }}
.cell.delayed {{ fill: #e9d5ff; }}
.cell.done {{ fill: #dcfce7; }}
.cell.owned {{ fill: #f0f9ff; }}
.cell.free {{ fill: #fafafa; }}
.cell.busy {{ fill: #fef3c7; }}
.cell.reused {{ fill: #fdba74; }}
.cell.rewritten {{ fill: #fecaca; }}
.cell.clobbered {{ fill: #f87171; }}
.cell.alert {{ fill: #fecaca; }}
.cell.offending {{ stroke: #b91c1c; stroke-width: 3; }}
.celltext {{ fill: #111827; }}
.celltext.changed {{ font-weight: 700; }}
.celltext.quiet {{ fill: #9ca3af; }}
.markframe {{ fill: none; stroke: #b91c1c; stroke-width: 3; }}
.marktext {{ fill: #b91c1c; font-weight: 700; }}
.loopframe {{ fill: none; stroke: #ca8a04; stroke-width: 2; stroke-dasharray: 6 4; }}
.looparc {{ fill: none; stroke: #ca8a04; stroke-width: 2.5; }}
.looptext {{ fill: #854d0e; font-weight: 700; }}
.arrowhead {{ fill: #ca8a04; }}
.finding {{ fill: #7f1d1d; }}
"""

PAGE_CSS = """
body { margin: 0; padding: 16px 20px; font-family: system-ui, -apple-system, 'Segoe UI', 'DejaVu Sans', sans-serif;
       color: #111827; background: #ffffff; }
h1 { font-size: 20px; margin: 0 0 8px 0; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; margin: 0 0 12px 0; }
dl.meta dt { font-weight: 700; color: #374151; }
dl.meta dd { margin: 0; }
.verdict.fail { color: #b91c1c; font-weight: 700; }
.verdict.pass { color: #15803d; font-weight: 700; }
section.finding { border: 2px solid #b91c1c; background: #fef2f2; padding: 8px 12px; margin: 0 0 12px 0;
                  max-width: 1400px; }
section.finding h2 { font-size: 16px; margin: 0 0 4px 0; color: #b91c1c; }
section.finding li { margin: 3px 0; }
.scroll { overflow-x: auto; border: 1px solid #d1d5db; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 16px; margin: 10px 0; font-size: 13px; }
.legend span.swatch { display: inline-block; width: 14px; height: 14px; border: 1px solid #9ca3af;
                      vertical-align: middle; margin-right: 4px; }
details { margin-top: 12px; }
table.steps { border-collapse: collapse; font-size: 12px; }
table.steps td, table.steps th { border: 1px solid #e5e7eb; padding: 3px 6px; text-align: left;
                                 vertical-align: top; }
table.steps code { white-space: pre-wrap; word-break: break-word; }
"""

LEGEND_FILL = {
    "waiting": "#f3f4f6", "running": "#dbeafe", "preempted": "#fed7aa", "delayed": "#e9d5ff", "done": "#dcfce7",
    "reused": "#fdba74", "rewritten": "#fecaca", "clobbered": "#f87171", "busy": "#fef3c7", "alert": "#fecaca",
}


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _wrap(lines: Sequence[str], width: int = CHARS) -> list[str]:
    out: list[str] = []
    for line in lines:
        indent = line[: len(line) - len(line.lstrip(" "))]
        out.extend(textwrap.wrap(line, width=width, subsequent_indent=indent + "  ", break_on_hyphens=False)
                   or [""])
    return out


@dataclass(frozen=True)
class _Geometry:
    top: int  # y of the header row
    header_h: int
    lane_y: dict[str, tuple[int, int]]  # lane id -> (y, height)
    group_y: list[tuple[str, int]]
    bottom: int
    width: int


def _x(index: int) -> int:
    return LABEL_W + index * COL_W


def _header_lines(column: Column) -> list[str]:
    return _wrap([column.label.name]) + _wrap(list(column.label.params))


def _layout(timeline: Timeline, top: int) -> _Geometry:
    header_h = (3 + max(len(_header_lines(c)) for c in timeline.columns)) * LINE_PX + PAD
    y = top + header_h
    lane_y: dict[str, tuple[int, int]] = {}
    group_y: list[tuple[str, int]] = []
    group = None
    for lane in timeline.lanes:
        if lane.group != group:
            group = lane.group
            group_y.append((group, y))
            y += GROUP_H
        lines = max(max(len(_wrap(cell.lines)) for cell in lane.cells), len(_wrap([lane.label], 19)))
        height = lines * LINE_PX + 2 * PAD
        lane_y[lane.id] = (y, height)
        y += height
    return _Geometry(top, header_h, lane_y, group_y, y, LABEL_W + len(timeline.columns) * COL_W)


def _text_block(x: float, y: float, lines: Sequence[str], css: str) -> str:
    spans = "".join(f'<tspan x="{x:.0f}" dy="{LINE_PX if i else 0}">{_e(line)}</tspan>'
                    for i, line in enumerate(lines))
    return f'<text class="{css}" x="{x:.0f}" y="{y:.0f}">{spans}</text>'


def _cell(x: int, y: int, height: int, cell: TimelineCell) -> str:
    classes = " ".join(c for c in ("cell", cell.tone, "offending" if cell.alert else "") if c)
    quiet = cell.lines in (("—",), ()) and not cell.alert
    text_css = "celltext" + (" changed" if cell.changed else "") + (" quiet" if quiet else "")
    hint = f"<title>{_e(cell.hint)}</title>" if cell.hint else ""
    return (f'<g>{hint}<rect class="{classes}" x="{x}" y="{y}" width="{COL_W}" height="{height}"/>'
            + _text_block(x + PAD, y + PAD + FONT_PX, _wrap(cell.lines), text_css) + "</g>")


def _loop_arc(timeline: Timeline, g: _Geometry) -> str:
    if timeline.loop_index is None:
        return ""
    last = len(timeline.columns) - 1
    start, end = _x(last) + COL_W // 2, _x(timeline.loop_index) + COL_W // 2
    base = g.top - 4
    parts = [f'<rect class="loopframe" x="{_x(timeline.loop_index) + 2}" y="{g.top + 2}" '
             f'width="{(last - timeline.loop_index + 1) * COL_W - 4}" height="{g.bottom - g.top - 4}"/>']
    if last == timeline.loop_index:
        label = f"↻ step {last} repeats forever (stuttering)"
        parts.append(f'<path class="looparc" d="M {start - 30} {base} C {start - 30} {base - 30}, '
                     f'{start + 30} {base - 30}, {start + 30} {base}"/>')
        parts.append(f'<polygon class="arrowhead" points="{start + 30},{base + 2} {start + 24},{base - 8} '
                     f'{start + 36},{base - 8}"/>')
        parts.append(f'<text class="looptext" text-anchor="end" x="{_x(last) + COL_W - 4}" '
                     f'y="{base - LOOP_H + 12}">{_e(label)}</text>')
    else:
        label = f"↻ loop: after step {last} the behaviour returns to step {timeline.loop_index}, forever"
        parts.append(f'<path class="looparc" d="M {start} {base} C {start} {base - 34}, {end} {base - 34}, '
                     f'{end} {base}"/>')
        parts.append(f'<polygon class="arrowhead" points="{end},{base + 2} {end - 6},{base - 9} {end + 6},{base - 9}"/>')
        half = len(label) * CHAR_PX / 2 + 4
        middle = min(max((start + end) / 2, half + 4), g.width - half)
        parts.append(f'<text class="looptext" text-anchor="middle" x="{middle:.0f}" '
                     f'y="{base - LOOP_H + 12}">{_e(label)}</text>')
    return "".join(parts)


def render_svg(timeline: Timeline, *, standalone: bool = True) -> str:
    """The timeline chart; ``standalone`` adds the XML namespace and a title line (for ``--svg``)."""
    title_h = 2 * LINE_PX + 16 if standalone else 0
    top = title_h + (LOOP_H if timeline.loop_index is not None else 8)
    g = _layout(timeline, top)
    finding_lines = _finding_lines(timeline)
    height = g.bottom + (len(finding_lines) * LINE_PX + 24 if finding_lines else 12)
    width = max(g.width, 900) + 8
    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(_title(timeline))}">',
           f"<style>{SVG_CSS}</style>", f'<rect class="bg" x="0" y="0" width="{width}" height="{height}"/>']
    if standalone:
        out.append(_text_block(8, 20, [_title(timeline)], "title"))
        out.append(_text_block(8, 20 + LINE_PX + 4, [f"{len(timeline.columns)} steps · {timeline.source}"],
                               "subtitle"))

    for column in timeline.columns:
        x = _x(column.index)
        css = "head" + (" loop" if column.in_loop else "") + (" marked" if column.marked else "")
        marked = ' data-marked="true"' if column.marked else ""
        out.append(f'<rect class="{css}" data-step="{column.index}" data-action="{_e(column.label.name)}"{marked} '
                   f'x="{x}" y="{g.top}" width="{COL_W}" height="{g.header_h}"/>')
        first = g.top + PAD + FONT_PX
        if column.marked:
            what = "loop starts:" if _is_loop_finding(timeline) else "breaks"
            out.append(_text_block(x + PAD, first, [f"step {column.index}  ✗ {what}"], "marktext"))
            out.append(_text_block(x + PAD, first + LINE_PX, _wrap([timeline.violated or ""])[:1], "marktext"))
        else:
            out.append(_text_block(x + PAD, first, [f"step {column.index}"], "stepno"))
        lines = _header_lines(column)
        out.append(_text_block(x + PAD, first + 2 * LINE_PX, lines[:1], "action"))
        if len(lines) > 1:
            out.append(_text_block(x + PAD, first + 3 * LINE_PX, lines[1:], "param"))

    for group, y in g.group_y:
        out.append(f'<rect class="group" x="0" y="{y}" width="{g.width}" height="{GROUP_H}"/>')
        out.append(_text_block(PAD, y + 15, [group], "grouptext"))
    for lane in timeline.lanes:
        y, h = g.lane_y[lane.id]
        out.append(f'<rect class="lanelabel" x="0" y="{y}" width="{LABEL_W}" height="{h}"/>')
        out.append(_text_block(PAD, y + PAD + FONT_PX, _wrap([lane.label], 19), "lanetext"))
        out.extend(_cell(_x(i), y, h, cell) for i, cell in enumerate(lane.cells))

    out.append(_loop_arc(timeline, g))
    for column in timeline.columns:
        if column.marked:
            out.append(f'<rect class="markframe" x="{_x(column.index) + 1}" y="{g.top}" width="{COL_W - 2}" '
                       f'height="{g.bottom - g.top}"/>')
    if finding_lines:
        out.append(_text_block(8, g.bottom + 20, finding_lines, "finding"))
    out.append("</svg>")
    return "\n".join(out)


def _is_loop_finding(timeline: Timeline) -> bool:
    return timeline.loop_index is not None and timeline.finding is not None and \
        timeline.finding.step == timeline.loop_index


def _title(timeline: Timeline) -> str:
    variant = f" ({timeline.variant})" if timeline.variant else ""
    return f"{timeline.model}{variant}: {timeline.verdict}"


def _finding_lines(timeline: Timeline) -> list[str]:
    if timeline.finding is None:
        return []
    width = max(80, int((LABEL_W + len(timeline.columns) * COL_W) / CHAR_PX) - 4)
    lines = _wrap([timeline.finding.summary], width)
    for offence in timeline.finding.offences:
        lines.extend(_wrap(["• " + offence.text], width))
    return lines


def _legend(timeline: Timeline) -> str:
    items = [f'<span><span class="swatch" style="background:{LEGEND_FILL[tone]}"></span>{_e(text)}</span>'
             for tone, text in timeline.tones.items() if tone in LEGEND_FILL]
    items.append('<span><b>bold</b> text: changed in this step</span>')
    items.append('<span><span class="swatch" style="border:3px solid #b91c1c"></span>offending value</span>')
    if timeline.binding == "DeferDump":
        items.append("<span>r1#2: request r1's prompt block 2 (a block's content)</span>")
    return f'<div class="legend">{"".join(items)}</div>'


def render_html(timeline: Timeline, steps_detail: Sequence[tuple[int, str, str]] = ()) -> str:
    """One self-contained page: header, the finding in words, the chart, a legend and each step's action.

    ``steps_detail`` lists (step, action name, full action record text) for the table at the bottom.
    """
    verdict_css = "pass" if timeline.violated is None else "fail"
    finding = ""
    if timeline.finding is not None:
        items = "".join(f"<li>{_e(o.text)}</li>" for o in timeline.finding.offences)
        finding = (f'<section class="finding"><h2>✗ {_e(timeline.finding.property)}: step '
                   f'{timeline.finding.step}</h2><p>{_e(timeline.finding.summary)}</p>'
                   + (f"<ul>{items}</ul>" if items else "") + "</section>")
    detail_rows = "".join(f"<tr><td>{i}</td><td>{_e(name)}</td><td><code>{_e(text)}</code></td></tr>"
                          for i, name, text in steps_detail)
    details = (f"<details><summary>Each step's full <code>action</code> record</summary>"
               f'<table class="steps"><tr><th>step</th><th>action</th><th>record</th></tr>{detail_rows}'
               f"</table></details>") if detail_rows else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(_title(timeline))}</title>
<style>{PAGE_CSS}</style>
</head>
<body>
<header>
<h1>deferdump explain: {_e(timeline.model)}</h1>
<dl class="meta">
<dt>model</dt><dd id="model">{_e(timeline.model)}</dd>
<dt>variant</dt><dd id="variant">{_e(timeline.variant or "—")}</dd>
<dt>verdict</dt><dd id="verdict" class="verdict {verdict_css}">{_e(timeline.verdict)}</dd>
<dt>trace</dt><dd id="source">{_e(timeline.source)} · {len(timeline.columns)} steps</dd>
</dl>
</header>
{finding}
<div class="scroll">
{render_svg(timeline, standalone=False)}
</div>
{_legend(timeline)}
{details}
</body>
</html>
"""
