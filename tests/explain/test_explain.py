"""`deferdump explain` on real TLC output: the manifest's mutant counterexamples, a passing model's trace,
ITF files (round trip and malformed) and the command line (HTML, SVG, terminal text, bad input)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from deferdump.tools.cli.explain import steps_detail
from deferdump.tools.explain.binding import BINDING
from deferdump.tools.explain.html import render_html
from deferdump.tools.explain.source import load_target, timeline_for
from deferdump.tools.explain.timeline import Timeline
from deferdump.tools.explain.trace import ACTION_VARIABLE, ExplainTrace
from deferdump.tools.tlc.cfg import strip_comments
from deferdump.tools.tlc.manifest import ModelEntry, load_manifest
from deferdump.tools.tlc.values import itf_trace

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

DEFERDUMP = str(Path(sys.executable).parent / "deferdump")
MANIFEST = load_manifest()
# explain reads DeferDump's variables; the connector contract's models (variant Contract) are left out.
MUTANTS = [entry for entry in MANIFEST.models
           if entry.mutant and not entry.expect.passes and entry.variant != "Contract"]
PASSING = [entry for entry in MANIFEST.models
           if not entry.mutant and entry.expect.passes and entry.tier == "ci" and entry.variant != "Contract"]


def deferdump(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DEFERDUMP, *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def assert_one_clean_line(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@lru_cache(maxsize=None)
def explained(name: str) -> tuple[ExplainTrace, Timeline]:
    """Each model is run through TLC once per test session."""
    trace = load_target(name)
    return trace, timeline_for(trace)


def page(name: str) -> str:
    trace, timeline = explained(name)
    return render_html(timeline, steps_detail(trace))


def header_steps(html: str) -> list[tuple[int, bool]]:
    """(step, marked) of every column header on the page, in order."""
    return [(int(m.group(1)), m.group(2) is not None)
            for m in re.finditer(r'data-step="(\d+)" data-action="[^"]*"( data-marked="true")?', html)]


def test_manifest_has_the_mutants_the_issue_names() -> None:
    names = {entry.name for entry in MUTANTS}
    assert "NoPreemptWait" in names, f"mutants in the manifest: {sorted(names)}"
    assert PASSING, "the manifest lists no passing ci model"


@pytest.mark.parametrize("entry", MUTANTS, ids=lambda e: e.name)
def test_mutant_counterexample_page(entry: ModelEntry) -> None:
    trace, timeline = explained(entry.name)
    html = page(entry.name)
    assert timeline.violated == entry.expect.violation
    verdict = re.search(r'<dd id="verdict" class="verdict fail">([^<]*)</dd>', html)
    assert verdict is not None and entry.expect.violation in verdict.group(1)
    assert f'<dd id="variant">{entry.variant}</dd>' in html

    columns = header_steps(html)
    assert [step for step, _ in columns] == list(range(len(trace.steps))), "one column per step"
    marked = [step for step, is_marked in columns if is_marked]
    if trace.kind == "liveness":
        assert marked == [trace.loop_index]
        assert 'class="looparc"' in html and "forever" in html
    else:
        assert marked == [len(trace.steps) - 1]
    assert timeline.finding is not None
    assert timeline.finding.offences, f"the binding does not describe {entry.expect.violation}'s offending values"
    assert any(cell.alert for lane in timeline.lanes for cell in lane.cells), "offending cells are highlighted"
    for step in trace.steps:  # each column is labelled with the step's action
        assert f'data-action="{step.name}"' in html


@pytest.mark.parametrize("entry", [e for e in MUTANTS if e.expect.violation in BINDING.invariants], ids=lambda e: e.name)
def test_own_state_check_agrees_with_tlc(entry: ModelEntry, tmp_path: Path) -> None:
    """Written as ITF without a verdict, the counterexample is judged by the binding's own evaluators:
    they must flag TLC's property at TLC's last state, and none of the invariants the model's cfg checks
    earlier (an invariant the cfg leaves out may break first: OuterNoForward also leaves a finished
    request tracked, which only OuterNoForwardTracking checks)."""
    trace, _ = explained(entry.name)
    states = [{**step.values, ACTION_VARIABLE: step.action} for step in trace.steps]
    path = tmp_path / "cx.itf.json"
    path.write_text(json.dumps(itf_trace(list(states[0]), states)), encoding="utf-8")
    loaded = load_target(str(path))
    assert timeline_for(loaded).finding is not None
    cfg_words = set(re.findall(r"\w+", strip_comments(entry.config_path.read_text())))
    checked = {name: check for name, check in BINDING.invariants.items() if name in cfg_words}
    assert entry.expect.violation in checked
    last = len(loaded.steps) - 1
    for k in range(last):
        assert not [name for name, check in checked.items() if check(loaded.steps, k)], f"flagged at step {k}"
    assert checked[entry.expect.violation](loaded.steps, last)


def test_no_preempt_wait_shows_the_reused_block() -> None:
    """The issue's done-criterion: a preempted request's block reused while its dump is still pending."""
    trace, timeline = explained("NoPreemptWait")
    assert timeline.violated == "NoOverwriteWhileDumpingInv"
    last = len(trace.steps) - 1
    lanes = {lane.id: lane for lane in timeline.lanes}
    requests = [lane for lane in timeline.lanes if lane.group == "Requests"]
    assert any(lane.cells[last].lines[0] == "preempted" and lane.cells[last].alert for lane in requests)
    blocks = [lane for lane in timeline.lanes if lane.group == "Blocks" and lane.cells[last].alert]
    assert blocks and any("under running dump task" in line for line in blocks[0].cells[last].lines)
    assert blocks[0].cells[last].tone == "clobbered"
    story = " ".join(o.text for o in timeline.finding.offences)
    for words in ("rewritten while its dump was still pending", "was preempted in step", "handle_preemptions"):
        assert words in story, story
    assert any(lane.cells[last].alert for lane_id, lane in lanes.items() if lane_id.startswith("Dump tasks/"))


@pytest.mark.parametrize("entry", PASSING[:1], ids=lambda e: e.name)
def test_passing_model_gets_a_representative_trace(entry: ModelEntry) -> None:
    trace, timeline = explained(entry.name)
    html = page(entry.name)
    assert trace.passes and timeline.finding is None and timeline.violated is None
    assert '<dd id="verdict" class="verdict pass">passes' in html
    columns = header_steps(html)
    assert len(columns) == len(trace.steps) >= 4 and not any(marked for _, marked in columns)
    assert len({step.name for step in trace.steps}) >= 3, "a representative run shows several kinds of step"
    for index in range(len(trace.steps)):  # the binding's evaluators agree with TLC: no state is bad
        for name, check in BINDING.invariants.items():
            assert check(trace.steps, index) == [], (name, index)


def test_cli_html_svg_and_text_from_an_itf_file(tmp_path: Path) -> None:
    trace, _ = explained("NoPreemptWait")
    states = [{**step.values, ACTION_VARIABLE: step.action} for step in trace.steps]
    source = tmp_path / "cx.itf.json"
    source.write_text(json.dumps(itf_trace(list(states[0]), states, {"model": "NoPreemptWait",
                                                                     "variant": "Direct"})), encoding="utf-8")
    out = deferdump("explain", str(source), "--html", str(tmp_path / "cx.html"), "--svg", str(tmp_path / "cx.svg"))
    assert out.returncode == 0, out.stderr
    html = (tmp_path / "cx.html").read_text(encoding="utf-8")
    svg = (tmp_path / "cx.svg").read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "NoOverwriteWhileDumpingInv" in html
    assert svg.startswith("<svg") and 'xmlns="http://www.w3.org/2000/svg"' in svg
    assert len(header_steps(svg)) == len(trace.steps)
    for text in (html, svg):  # self-contained: nothing to fetch
        assert not re.search(r'(src|href)\s*=|url\(|@import|<script', text, re.IGNORECASE)

    text = deferdump("explain", str(source))
    assert text.returncode == 0, text.stderr
    assert "NoOverwriteWhileDumpingInv" in text.stdout and "✗ breaks" in text.stdout
    for step in range(len(trace.steps)):
        assert f"step {step} · " in text.stdout


def test_conformance_trace_file(tmp_path: Path) -> None:
    """An ITF trace written by `deferdump traces` (the conformance tool) is explained from its file alone."""
    generated = deferdump("traces", "DirectConformance", "--mode", "simulate", "--num", "1", "--seed", "1",
                          "--out", str(tmp_path / "traces"))
    assert generated.returncode == 0, generated.stderr
    [source] = sorted((tmp_path / "traces").glob("*.itf.json"))
    trace = load_target(str(source))
    assert (trace.model, trace.variant) == ("DirectConformance", "Direct")
    out = deferdump("explain", str(source), "--html", str(tmp_path / "conf.html"))
    assert out.returncode == 0, out.stderr
    html = (tmp_path / "conf.html").read_text(encoding="utf-8")
    assert len(header_steps(html)) == len(trace.steps)
    assert '<dd id="verdict" class="verdict pass">no property is violated in this trace</dd>' in html
