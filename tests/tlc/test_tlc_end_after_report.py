"""Ending a TLC JVM once its report is complete, instead of waiting out its ~0.3 s shutdown.

Real TLC on the fixture specs: the ended run must report exactly what the run left to exit by itself
reports (a clean finish, and invariant, deadlock and liveness violations, whose exit status the bridge
then records as TLC gives it), and runs that may still write something at exit (dumps, kept run
directories, JVM recordings) or whose exit status is not one value must be left to exit by themselves.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from deferdump.tools.tlc.bridge import Kind, Status, ends_after_report, run_tlc
from deferdump.tools.tlc.output import Code, MessageStream, TlcMessage, finished_cleanly, reported_exit_status
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


@pytest.mark.parametrize(("spec", "kind", "exit_code"), [("Queue.tla", Kind.INVARIANT, 12),
                                                         ("Deadlock.tla", Kind.DEADLOCK, 11),
                                                         ("Lasso.tla", Kind.LIVENESS, 13)])
def test_a_violation_ends_the_jvm_once_reported_and_reports_what_a_full_exit_reports(
        spec: str, kind: Kind, exit_code: int) -> None:
    ended = run_tlc(FIXTURES / spec)
    waited = run_tlc(FIXTURES / spec, end_after_report=False)
    assert ended.ended_after_report and not waited.ended_after_report
    assert (ended.status, ended.kind) == (Status.VIOLATION, kind)
    assert ended.exit_code == waited.exit_code == exit_code  # the status TLC itself gave the full run
    _same_report(ended, waited)
    assert ended.trace == waited.trace and ended.loop_index == waited.loop_index


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


@pytest.mark.parametrize(
    ("messages", "status"),
    [
        (((Code.SUCCESS, 0), (Code.STATS, 0), (Code.FINISHED, 0)), 0),
        (((Code.INVARIANT_VIOLATED_BEHAVIOR, 1), (Code.BEHAVIOR_UP_TO_THIS_POINT, 1), (Code.STATE, 4),
          (Code.STATS, 0), (Code.FINISHED, 0)), 12),
        (((Code.INVARIANT_VIOLATED_INITIAL, 1), (Code.STATE, 4), (Code.FINISHED, 0)), 12),
        (((Code.DEADLOCK_REACHED, 1), (Code.BEHAVIOR_UP_TO_THIS_POINT, 1), (Code.STATE, 4), (Code.FINISHED, 0)),
         11),
        (((Code.TEMPORAL_PROPERTY_VIOLATED, 1), (Code.COUNTER_EXAMPLE, 1), (Code.STATE, 4), (Code.BACK_TO_STATE, 4),
          (Code.FINISHED, 0)), 13),
        (((Code.INVARIANT_VIOLATED_BEHAVIOR, 1), (Code.STATE, 4)), None),  # the trace may not be over
        (((Code.INVARIANT_VIOLATED_BEHAVIOR, 1), (Code.GENERAL, 1), (Code.FINISHED, 0)), None),  # and an error
        (((Code.INVARIANT_VIOLATED_BEHAVIOR, 1), (2998, 2), (Code.FINISHED, 0)), None),  # and a TLC bug report
        (((Code.INVARIANT_VIOLATED_BEHAVIOR, 1), (Code.DEADLOCK_REACHED, 1), (Code.FINISHED, 0)), None),  # two
        (((Code.ACTION_PROPERTY_VIOLATED, 1), (Code.FINISHED, 0)), None),  # exits 12 or 13
        (((Code.ASSERT_FAILED, 1), (Code.FINISHED, 0)), None),  # exits 75 in TLC 2.15, not 14
        (((Code.ASSUMPTION_FALSE, 1), (Code.FINISHED, 0)), None),
        (((Code.STATS, 0), (Code.FINISHED, 0)), None),  # finished, but neither a success nor a violation
        ((), None),
    ],
)
def test_the_reported_exit_status_is_known_only_for_a_complete_report_of_one_known_kind(
        messages: tuple[tuple[int, int], ...], status: int | None) -> None:
    assert reported_exit_status(_stream(*messages)) == status
