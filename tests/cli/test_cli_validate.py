"""`deferdump validate`: the --json contract and the exit statuses (0 matched, 1 not, 2 bad input)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.tracelogs import finished_run, write_run

DEFERDUMP = str(Path(sys.executable).parent / "deferdump")
KEYS = ["matched", "events", "matched_events", "first_unmatched", "model_constants", "seconds"]


def deferdump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DEFERDUMP, *args], capture_output=True, text=True, timeout=300)


def test_matched_json_exit_0(tmp_path: Path) -> None:
    run = write_run(tmp_path, *finished_run())
    done = deferdump("validate", str(run), "--json")
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)
    assert list(verdict) == KEYS
    assert (verdict["matched"], verdict["events"], verdict["matched_events"], verdict["first_unmatched"]) == (
        True, 12, 12, None)
    assert verdict["model_constants"]["requests"] == ["a"]


def test_not_matched_exit_1_names_the_event(tmp_path: Path) -> None:
    run = write_run(tmp_path, *finished_run(delayed=False))
    files = [str(path) for path in sorted(run.iterdir())]  # files, not the directory
    done = deferdump("validate", *files, "--json")
    assert done.returncode == 1, done.stderr
    first = json.loads(done.stdout)["first_unmatched"]
    assert list(first) == ["file", "seq", "event", "reason"]
    assert (Path(first["file"]).name, first["seq"], first["event"]) == ("scheduler-1.ndjson", 1, "request_finished")
    text = deferdump("validate", str(run))
    assert text.returncode == 1
    assert "request_finished" in text.stdout and "schedAsync" in text.stdout  # the state just before


def test_bad_input_one_line_exit_2(tmp_path: Path) -> None:
    run = write_run(tmp_path, *finished_run())
    (run / "worker-rank0-2.ndjson").write_text('{"seq": 0, "step": 1}\n')
    done = deferdump("validate", str(run), "--json")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "worker-rank0-2.ndjson:1: field role" in lines[0], done.stderr
    missing = deferdump("validate", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such file or directory" in missing.stderr
