"""`deferdump explain` on any spec and any file: the generic one-lane-per-variable binding on a real TLC
lasso, ITF files from disk, and bad input (malformed traces, unknown targets, unsafe outputs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deferdump.tools.explain.html import render_svg
from deferdump.tools.explain.source import load_target, timeline_for
from deferdump.tools.explain.trace import ACTION_VARIABLE, from_tlc_result
from deferdump.tools.tlc.values import itf_trace
from deferdump.tools.tlc.bridge import run_tlc
from support import FIXTURES as ALL_FIXTURES

DEFERDUMP = str(Path(sys.executable).parent / "deferdump")
FIXTURES = ALL_FIXTURES / "tla"


def deferdump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DEFERDUMP, *args], capture_output=True, text=True, timeout=600)


def assert_one_clean_line(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def lasso_itf(tmp_path: Path) -> Path:
    """TLC's lasso counterexample of the Lasso fixture, written as an ITF file with its loop."""
    result = run_tlc(FIXTURES / "Lasso.tla", FIXTURES / "Lasso.cfg")
    trace = from_tlc_result(result, model="Lasso", variant=None)
    states = [{**step.values, ACTION_VARIABLE: step.action} for step in trace.steps]
    path = tmp_path / "lasso.itf.json"
    path.write_text(json.dumps(itf_trace(list(states[0]), states, {"model": "Lasso"}, loop=trace.loop_index)),
                    encoding="utf-8")
    return path


def test_generic_binding_draws_any_spec_and_its_lasso() -> None:
    result = run_tlc(FIXTURES / "Lasso.tla", FIXTURES / "Lasso.cfg")
    trace = from_tlc_result(result, model="Lasso", variant=None)
    timeline = timeline_for(trace)
    assert timeline.binding == "generic" and trace.kind == "liveness" and trace.loop_index is not None
    assert {lane.label for lane in timeline.lanes} == set(trace.variables)
    svg = render_svg(timeline)
    assert svg.count("data-step=") == len(trace.steps) and 'class="looparc"' in svg


def test_itf_lasso_keeps_its_loop_and_renders_text(tmp_path: Path) -> None:
    source = lasso_itf(tmp_path)
    trace = load_target(str(source))
    assert trace.model == "Lasso" and trace.loop_index is not None
    out = deferdump("explain", str(source))
    assert out.returncode == 0, out.stderr
    assert "↻ loop starts here" in out.stdout and "returns to step" in out.stdout
    html = deferdump("explain", str(source), "--html", str(tmp_path / "lasso.html"))
    assert html.returncode == 0, html.stderr
    assert 'class="looparc"' in (tmp_path / "lasso.html").read_text(encoding="utf-8")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "lasso.html").stat().st_mode & 0o777 == 0o666 & ~umask
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".lasso.html.")], "no temp file left"


@pytest.mark.parametrize("content, fragment", [
    ("{not json", "bad JSON"),
    (json.dumps({"vars": ["x"], "states": [{"x": 1.5}]}), "non-integer number"),
    (json.dumps({"vars": ["x"], "states": [{}]}), "missing variable 'x'"),
    (json.dumps({"vars": ["x"], "states": []}), "no states"),
    (json.dumps([1, 2]), "must be a JSON object"),
])
def test_malformed_trace_file_is_one_clear_line(tmp_path: Path, content: str, fragment: str) -> None:
    bad = tmp_path / "bad.itf.json"
    bad.write_text(content, encoding="utf-8")
    out = deferdump("explain", str(bad), "--html", str(tmp_path / "out.html"))
    assert out.returncode == 2
    assert_one_clean_line(out.stderr, str(bad), fragment)
    assert not (tmp_path / "out.html").exists()


def test_bad_targets_and_outputs(tmp_path: Path) -> None:
    out = deferdump("explain", "NoSuchModel")
    assert out.returncode == 2
    assert_one_clean_line(out.stderr, "'NoSuchModel' is not a trace file", "unknown model")
    missing = deferdump("explain", str(tmp_path / "missing.itf.json"))
    assert missing.returncode == 2
    assert_one_clean_line(missing.stderr, "missing.itf.json", "cannot read")

    source = lasso_itf(tmp_path)
    before = source.read_bytes()
    over = deferdump("explain", str(source), "--html", str(source))
    assert over.returncode == 2
    assert_one_clean_line(over.stderr, "refusing to write over the trace")
    assert source.read_bytes() == before
    nowhere = deferdump("explain", str(source), "--svg", str(tmp_path / "no" / "dir" / "x.svg"))
    assert nowhere.returncode == 2
    assert_one_clean_line(nowhere.stderr, "does not exist")


def test_values_are_escaped_and_the_page_stays_inert(tmp_path: Path) -> None:
    """Strings from a trace never become markup: a hostile ITF value shows up as text."""
    states = [{"note": "<script>alert(1)</script>", "action": {"name": "init"}},
              {"note": "a & b </svg>", "action": {"name": "Edit", "by": "<img src=x>"}}]
    source = tmp_path / "hostile.itf.json"
    source.write_text(json.dumps(itf_trace(["note", "action"], states)), encoding="utf-8")
    out = deferdump("explain", str(source), "--html", str(tmp_path / "h.html"), "--svg", str(tmp_path / "h.svg"))
    assert out.returncode == 0, out.stderr
    for name in ("h.html", "h.svg"):
        text = (tmp_path / name).read_text(encoding="utf-8")
        assert "<script" not in text and "<img" not in text and "&lt;script&gt;" in text
        assert text.count("</svg>") == 1
