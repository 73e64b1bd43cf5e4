"""Scenario processes: a verdict passes through, a child that dies is a crash, one that never answers a hang."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from deferdump.tools.watch.session import last_error_line, run_scenario
from deferdump.tools.watch.verdict import CRASH, HANG, OK

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "watch"


@pytest.fixture
def fake_runner(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))
    return "fake_watch_runner"


def _run(name: str, runner: str, tmp_path: Path, timeout: float = 60.0):
    return run_scenario(name, {"kv_connector": "X"}, hma=False, scribble=True, timeout=timeout, hang_after=5,
                        work_root=tmp_path, runner=runner)


def test_the_childs_verdict_is_returned(fake_runner: str, tmp_path: Path) -> None:
    result = _run("answers", fake_runner, tmp_path)
    assert (result.scenario, result.verdict, result.detail) == ("answers", OK, "fine")
    assert list(tmp_path.iterdir()) == []  # the scenario's work directory is removed


def test_a_child_that_dies_is_a_crash_named_by_its_exception(fake_runner: str, tmp_path: Path) -> None:
    result = _run("dies", fake_runner, tmp_path)
    assert result.verdict == CRASH
    assert "FileNotFoundError: [Errno 2] No such file or directory: '/store/x.safetensors'" in result.detail
    assert "\n" not in result.detail


def test_a_child_without_an_answer_in_time_is_a_hang_and_is_killed(fake_runner: str, tmp_path: Path) -> None:
    result = _run("sleeps", fake_runner, tmp_path, timeout=3)
    assert result.verdict == HANG and "no verdict within 3 s" in result.detail


def test_last_error_line(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("INFO start\nTraceback (most recent call last):\n  File x\nRuntimeError: boom\nINFO exit\n")
    assert last_error_line(log) == "RuntimeError: boom"
    log.write_text("just text\nlast words\n")
    assert last_error_line(log) == "last words"
    log.write_text("")
    assert last_error_line(log) == "no output"
