"""`EngineProcess`: a child per engine, driven over a pipe, on stand-in sessions (no vLLM): the round trip,
engines side by side, and every way a child can fail reported in one line with its log, never a hang."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import support.engine_sessions as sessions
from deferdump.reference.errors import UserError
from deferdump.tools.vllmrun.engine_process import EngineProcess, EngineProcessError

SUPPORT_ROOT = str(Path(sessions.__file__).resolve().parents[1])


@pytest.fixture(autouse=True)
def _children_import_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [SUPPORT_ROOT, os.environ.get("PYTHONPATH")])))


def test_calls_run_in_the_child_in_order_and_its_teardown_runs_at_close(tmp_path: Path) -> None:
    marker = tmp_path / "closed"
    with EngineProcess("a", tmp_path, sessions.counting_session, "a", marker) as child:
        info = child.wait_ready()
        assert info["name"] == "a" and info["pid"] != os.getpid()
        assert info["in_process"] == "0"  # vLLM's in-process mode set before the setup ran
        assert child.call(sessions.count, 2) == {"name": "a", "calls": 2, "pid": info["pid"]}
        assert child.call(sessions.count, 3)["calls"] == 5
    assert marker.read_text() == "closed after 5 calls"


def test_engines_started_together_build_in_parallel(tmp_path: Path) -> None:
    children = [EngineProcess(name, tmp_path, sessions.counting_session, name, tmp_path / name, 3.0).start()
                for name in ("x", "y", "z")]
    try:
        infos = [child.wait_ready() for child in children]
        assert len({info["pid"] for info in infos}) == 3
        assert [child.call(sessions.count, 1)["name"] for child in children] == ["x", "y", "z"]
    finally:
        for child in children:
            child.close()
    # Every build began before any ended (a 3 s build each): side by side, not one after another. Read from
    # the children's own clocks, not from how long the test took.
    assert max(info["began"] for info in infos) < min(info["built"] for info in infos)


def test_a_failing_setup_is_one_line_and_the_log_keeps_the_traceback(tmp_path: Path) -> None:
    with EngineProcess("bad", tmp_path, sessions.failing_setup, "no store here") as child:
        with pytest.raises(EngineProcessError, match=r"^engine bad: start failed: RuntimeError: no store here$"):
            child.wait_ready()
    assert "Traceback" in child.log_path.read_text()
    assert issubclass(EngineProcessError, UserError)


def test_a_failing_call_is_reported_and_the_engine_still_shuts_down(tmp_path: Path) -> None:
    marker = tmp_path / "closed"
    with EngineProcess("a", tmp_path, sessions.counting_session, "a", marker) as child:
        child.wait_ready()
        with pytest.raises(EngineProcessError, match=r"engine a: fail failed: ValueError: the store is full"):
            child.call(sessions.fail, "the store\nis full")
    assert marker.read_text() == "closed after 0 calls"


def test_a_child_that_dies_is_reported_with_its_exit_code(tmp_path: Path) -> None:
    with EngineProcess("a", tmp_path, sessions.counting_session, "a", tmp_path / "m") as child:
        child.wait_ready()
        with pytest.raises(EngineProcessError, match=r"engine a: the process exited during die \(exit code 7\)"):
            child.call(sessions.die, 7)


def test_a_call_past_its_timeout_is_reported_and_the_child_stopped(tmp_path: Path) -> None:
    child = EngineProcess("slow", tmp_path, sessions.counting_session, "slow", tmp_path / "m").start()
    child.wait_ready()
    process = child._process
    assert process is not None
    with pytest.raises(EngineProcessError, match=r"engine slow: no answer to sleep within 1 s"):
        child.call(sessions.sleep, 30.0, timeout=1.0)
    assert process.poll() is not None  # not left running behind the error


def test_a_child_whose_parent_goes_away_exits(tmp_path: Path) -> None:
    child = EngineProcess("orphan", tmp_path, sessions.counting_session, "orphan", tmp_path / "m").start()
    child.wait_ready()
    process = child._process
    assert process is not None and child._to_child is not None
    child._to_child.close()  # what the parent's death does to the pipe
    child._to_child = None
    assert process.wait(30) == 0
    child.close()
