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


def _wrapper_line(inner: str) -> dict[str, object]:
    return {"step": 0, "event": "connector", "inner": inner, "hma": False, "scribble": False}


def test_contract_json_exit_0_and_1(tmp_path: Path) -> None:
    ok = write_run(tmp_path / "ok", *finished_run())
    done = deferdump("validate", "--contract", "--drained", str(ok), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True, "property": None, "detail": None, "events": 12, "unchecked": []}
    scheduler, workers = finished_run()
    scheduler[3]["finished_sending"] = []  # never reported
    bad = write_run(tmp_path / "bad", scheduler, workers)
    done = deferdump("validate", "--contract", "--drained", str(bad), "--json")
    verdict = json.loads(done.stdout)
    assert (done.returncode, verdict["ok"], verdict["property"]) == (1, False, "DelayedEventuallyReportedProp")
    assert "scheduler-1.ndjson:2: event request_finished, request a" in verdict["detail"]
    text = deferdump("validate", "--contract", str(bad))  # not known drained: ok, the clause left open
    assert text.returncode == 0 and "not decided by this log: DelayedEventuallyReportedProp" in text.stdout


def test_a_wrappers_log_is_checked_against_the_contract_without_the_flag(tmp_path: Path) -> None:
    scheduler, workers = finished_run(delayed=False)
    scheduler[3]["finished_sending"] = ["a"]  # reports a request whose free it did not delay
    scheduler.insert(0, _wrapper_line("tests.UndelayedReporter"))
    workers[0].insert(0, _wrapper_line("tests.UndelayedReporter"))
    run = write_run(tmp_path, scheduler, workers)
    done = deferdump("validate", str(run))
    assert done.returncode == 1, done.stderr
    assert "SendingOnlyDelayedInv violated" in done.stdout and "scheduler-1.ndjson:5" in done.stdout


def test_contract_bad_input_one_line_exit_2(tmp_path: Path) -> None:
    run = write_run(tmp_path, *finished_run())
    (run / "scheduler-1.ndjson").write_text('{"seq": 0, "step": 1, "role": "scheduler", "rank": 0, '
                                            '"engine": "engine-test", "event": "connector"}\n')
    done = deferdump("validate", "--contract", str(run), "--json")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "scheduler-1.ndjson:1: field inner" in lines[0], done.stderr
