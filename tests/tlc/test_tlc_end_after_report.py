"""Ending a TLC JVM once it has reported a clean finish, instead of waiting out its ~0.3 s shutdown.

Real TLC on the fixture specs: the ended run must report exactly what the run left to exit by itself
reports, and runs that may still write something at exit (dumps, kept run directories, JVM recordings,
violations, whose exit status is the verdict) must be left to exit by themselves.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from deferdump.tools.tlc.bridge import Kind, Status, ends_after_report, run_tlc
from deferdump.tools.tlc.output import Code, MessageStream, TlcMessage, finished_cleanly
from support import FIXTURES as ALL_FIXTURES

FIXTURES = ALL_FIXTURES / "tla"


def _same_report(left: object, right: object) -> None:
    fields = ("status", "kind", "property", "distinct_states", "generated_states", "depth", "exit_code",
              "tlc_version", "message")
    assert [getattr(left, f) for f in fields] == [getattr(right, f) for f in fields]


def test_a_clean_finish_ends_the_jvm_and_reports_what_a_full_exit_reports() -> None:
    ended = run_tlc(FIXTURES / "Counter.tla")
    waited = run_tlc(FIXTURES / "Counter.tla", end_after_report=False)
    assert ended.ended_after_report and not waited.ended_after_report
    assert ended.status is Status.PASS and ended.exit_code == waited.exit_code == 0
    _same_report(ended, waited)
    assert [m.code for m in ended.messages] == [m.code for m in waited.messages]
    assert ended.messages[-1].code == Code.FINISHED


@pytest.mark.parametrize(("spec", "kind"), [("Queue.tla", Kind.INVARIANT), ("Deadlock.tla", Kind.DEADLOCK),
                                            ("Lasso.tla", Kind.LIVENESS)])
def test_a_violation_is_left_to_exit_with_its_status(spec: str, kind: Kind) -> None:
    result = run_tlc(FIXTURES / spec)
    assert (result.status, result.kind) == (Status.VIOLATION, kind)
    assert not result.ended_after_report and result.exit_code not in (None, 0)


def test_a_run_that_dumps_its_state_graph_is_left_to_exit(tmp_path: Path) -> None:
    keep = tmp_path / "run"
    result = run_tlc(FIXTURES / "Counter.tla", extra_args=["-dump", "dot", "graph"], keep_dir=keep)
    assert result.status is Status.PASS and not result.ended_after_report and result.exit_code == 0
    assert (keep / "graph.dot").read_text().rstrip().endswith("}")  # written whole, at the end of the run


@pytest.mark.parametrize(
    ("extra_args", "jvm_args", "keep", "ends"),
    [
        ((), (), False, True),
        ((), ("-XX:TieredStopAtLevel=1", "-Xmx512m", "-XX:-UseParallelGC", "-XX:+UseSerialGC"), False, True),
        (("-dump", "dot", "g"), (), False, False),
        (("-simulate", "file=t,num=1"), (), False, False),
        ((), (), True, False),
        ((), ("-XX:StartFlightRecording=filename=r.jfr",), False, False),
        ((), ("-XX:ArchiveClassesAtExit=a.jsa",), False, False),
        ((), ("-Xlog:gc:file=gc.log",), False, False),
    ],
)
def test_only_runs_that_write_nothing_at_exit_are_ended(extra_args: tuple[str, ...], jvm_args: tuple[str, ...],
                                                        keep: bool, ends: bool, tmp_path: Path) -> None:
    assert ends_after_report(extra_args, jvm_args, tmp_path if keep else None) is ends


def _stream(*messages: tuple[int, int]) -> MessageStream:
    stream = MessageStream()
    stream.messages.extend(TlcMessage(code=code, severity=severity) for code, severity in messages)
    return stream


@pytest.mark.parametrize(
    ("messages", "clean"),
    [
        (((Code.SUCCESS, 0), (Code.STATS, 0), (Code.FINISHED, 0)), True),
        (((Code.SUCCESS, 0), (3000, 3), (Code.FINISHED, 0)), True),  # a warning does not change the status
        (((Code.SUCCESS, 0), (Code.STATS, 0)), False),  # not finished yet
        (((Code.STATS, 0), (Code.FINISHED, 0)), False),  # no "No error has been found"
        (((Code.SUCCESS, 0), (Code.GENERAL, 1), (Code.FINISHED, 0)), False),  # an error
        (((Code.SUCCESS, 0), (2998, 2), (Code.FINISHED, 0)), False),  # a TLC bug report
        (((Code.INVARIANT_VIOLATED_BEHAVIOR, 1), (Code.SUCCESS, 0), (Code.FINISHED, 0)), False),
        (((Code.TEMPORAL_PROPERTY_VIOLATED, 0), (Code.SUCCESS, 0), (Code.FINISHED, 0)), False),
        ((), False),
    ],
)
def test_a_clean_finish_is_success_then_finished_with_no_error_or_violation(
        messages: tuple[tuple[int, int], ...], clean: bool) -> None:
    assert finished_cleanly(_stream(*messages)) is clean
