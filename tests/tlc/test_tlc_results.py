"""run_tlc against real TLC on small fixture specs: every field of the result, for every outcome kind."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from deferdump.tools.tlc.values import ModelValue, Record, TlaSet, Tup
from deferdump.tools.tlc.bridge import Kind, Progress, RunDirNotEmpty, SpecNotFound, Status, TlcUsageError, run_tlc
from deferdump.tools.tlc.output import Code, parse_simulation_trace
from support import FIXTURES as ALL_FIXTURES

FIXTURES = ALL_FIXTURES / "tla"


def test_pass_reports_exact_counts() -> None:
    result = run_tlc(FIXTURES / "Counter.tla")
    assert (result.status, result.kind, result.property) == (Status.PASS, None, None)
    assert (result.distinct_states, result.generated_states, result.depth) == (9, 14, 5)
    assert result.exit_code == 0 and result.trace == [] and result.loop_index is None and result.message is None
    assert result.tlc_version is not None and result.tlc_version.startswith("TLC2 Version 2.15")
    assert result.config == FIXTURES / "Counter.cfg"


def test_invariant_violation_decodes_the_trace() -> None:
    result = run_tlc(FIXTURES / "Queue.tla")
    assert (result.status, result.kind, result.property, result.exit_code) == (
        Status.VIOLATION, Kind.INVARIANT, "LogBoundInv", 12)
    assert [state.action for state in result.trace] == [None, "Produce", "Produce", "Produce"]
    assert result.trace[1].location == "line 13, col 15 to line 16, col 27 of module Queue"
    w1 = ModelValue("w1")
    assert result.trace[0].values == {"log": Tup(()), "seen": TlaSet(), "n": 0}
    last = result.trace[3].values
    assert last["n"] == 3 and type(last["n"]) is int
    assert last["seen"] == TlaSet([w1])
    assert last["log"] == Tup(Record(n=i, who=w1) for i in range(3))
    assert result.loop_index is None and result.message == "Invariant LogBoundInv is violated."


def test_deadlock() -> None:
    result = run_tlc(FIXTURES / "Deadlock.tla")
    assert (result.status, result.kind, result.property, result.exit_code) == (
        Status.VIOLATION, Kind.DEADLOCK, None, 11)
    assert [(s.action, s.values["x"]) for s in result.trace] == [(None, 0), ("Step", 1), ("Step", 2)]
    assert result.message == "Deadlock reached."


def test_liveness_lasso_names_the_single_property_and_the_loop() -> None:
    result = run_tlc(FIXTURES / "Lasso.tla")
    assert (result.status, result.kind, result.property, result.exit_code) == (
        Status.VIOLATION, Kind.LIVENESS, "ReachThreeProp", 13)
    assert [s.values["x"] for s in result.trace] == [0, 1, 2]
    assert result.loop_index == 1 and not result.stuttering
    assert result.distinct_states == 3


def test_temporal_properties_are_checked_once_on_the_whole_graph() -> None:
    """TLC's default checks liveness at timed intervals mid-search, so under load a mutant's lasso and state
    count change from run to run (a CI failure: another lasso than the one the test expected). The bridge
    asks for `-lncheck final`; simulation, which has no graph to check at the end, does without."""
    result = run_tlc(FIXTURES / "Lasso.tla")
    at = result.command.index("-lncheck")
    assert result.command[at + 1] == "final" and result.command.index("-config") < at < len(result.command) - 1
    simulated = run_tlc(FIXTURES / "Counter.tla", extra_args=["-simulate", "num=2", "-depth", "3", "-seed", "1"])
    assert "-lncheck" not in simulated.command and simulated.status is Status.PASS


def test_action_property_violation() -> None:
    result = run_tlc(FIXTURES / "Lasso.tla", FIXTURES / "LassoAction.cfg")
    assert (result.status, result.kind, result.property, result.exit_code) == (
        Status.VIOLATION, Kind.ACTION, "MonotoneProp", 13)
    assert [s.values["x"] for s in result.trace] == [0, 1, 2, 1]
    assert result.loop_index is None


def test_assert_failure() -> None:
    result = run_tlc(FIXTURES / "AssertFail.tla")
    assert (result.status, result.kind, result.exit_code) == (Status.VIOLATION, Kind.ASSERT, 75)
    assert result.message == ('Assert failed: "x must stay below 1" at Line 7, column 9 to line 8, column 21 '
                              "in AssertFail")
    assert result.trace == []


def test_parse_error_names_file_and_line() -> None:
    result = run_tlc(FIXTURES / "ParseError.tla")
    assert (result.status, result.kind, result.exit_code) == (Status.ERROR, Kind.PARSE, 150)
    assert result.message is not None
    assert result.message.startswith(f"{FIXTURES / 'ParseError.tla'}:6:16: parse error:")


def test_config_names_an_undefined_invariant() -> None:
    result = run_tlc(FIXTURES / "Counter.tla", FIXTURES / "CounterUndefinedInv.cfg")
    assert (result.status, result.kind, result.exit_code) == (Status.ERROR, Kind.CONFIG, 151)
    assert result.message == ("The invariant NoSuchInv specified in the configuration file is not defined "
                              "in the specification.")


def test_config_leaves_a_constant_unassigned() -> None:
    result = run_tlc(FIXTURES / "Counter.tla", FIXTURES / "CounterNoConstant.cfg")
    assert (result.status, result.kind, result.exit_code) == (Status.ERROR, Kind.CONFIG, 151)
    assert result.message == "The constant parameter N is not assigned a value by the configuration file."


def test_timeout_kills_the_jvm() -> None:
    started = time.monotonic()
    result = run_tlc(FIXTURES / "Big.tla", timeout=1.5)
    assert time.monotonic() - started < 5
    assert (result.status, result.kind, result.exit_code) == (Status.ERROR, Kind.TIMEOUT, None)
    assert result.message is not None and result.message.startswith("TLC timed out after")


def test_cancel_kills_the_jvm() -> None:
    cancel = threading.Event()
    timer = threading.Timer(1.0, cancel.set)
    timer.start()
    started = time.monotonic()
    try:
        result = run_tlc(FIXTURES / "Big.tla", cancel=cancel)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 5
    assert (result.status, result.kind, result.exit_code) == (Status.ERROR, Kind.CANCELLED, None)


def test_progress_callback_gets_final_counts() -> None:
    reports: list[Progress] = []
    run_tlc(FIXTURES / "Counter.tla", progress=reports.append)
    assert reports and reports[-1].distinct_states == 9 and reports[-1].generated_states == 14


def test_generated_module_and_kept_run_dir(tmp_path: Path) -> None:
    mc = "---- MODULE MCCounter ----\nEXTENDS Counter\nBoundInv == x + y < 3\n====\n"
    cfg = "CONSTANT N = 2\nSPECIFICATION Spec\nINVARIANT BoundInv\n"
    keep = tmp_path / "run"
    result = run_tlc(FIXTURES / "MCCounter.tla", "MCCounter.cfg",
                     extra_modules={"MCCounter": mc, "MCCounter.cfg": cfg}, keep_dir=keep,
                     extra_args=["-dump", "dot,actionlabels", "graph"])
    assert (result.status, result.kind, result.property) == (Status.VIOLATION, Kind.INVARIANT, "BoundInv")
    assert [s.values for s in result.trace][-1] in ({"x": 2, "y": 1}, {"x": 1, "y": 2})
    assert result.run_dir == keep and (keep / "MCCounter.tla").read_text() == mc
    assert 'label="IncX"' in (keep / "graph.dot").read_text()
    assert not list(FIXTURES.glob("*.dot")) and not (FIXTURES / "states").exists()
    assert not (FIXTURES / "MCCounter.tla").exists()
    with pytest.raises(RunDirNotEmpty):
        run_tlc(FIXTURES / "Counter.tla", keep_dir=keep)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(SpecNotFound, match="spec not found"):
        run_tlc(tmp_path / "Nope.tla")
    with pytest.raises(SpecNotFound, match="config not found"):
        run_tlc(FIXTURES / "Counter.tla", tmp_path / "Nope.cfg")
    with pytest.raises(TlcUsageError, match="workers"):
        run_tlc(FIXTURES / "Counter.tla", workers=0)


def test_stuttering_lasso() -> None:
    result = run_tlc(FIXTURES / "Stutter.tla")
    assert (result.status, result.kind, result.property) == (Status.VIOLATION, Kind.LIVENESS, "ReachOneProp")
    assert [s.values for s in result.trace] == [{"x": 0}]
    assert result.loop_index == 0 and result.stuttering


def test_invariant_violated_by_the_initial_state() -> None:
    result = run_tlc(FIXTURES / "Stutter.tla", FIXTURES / "StutterInitInv.cfg")
    assert (result.status, result.kind, result.property) == (Status.VIOLATION, Kind.INVARIANT, "StartedInv")
    assert [(s.action, s.values) for s in result.trace] == [(None, {"x": 0})]
    assert result.message == "Invariant StartedInv is violated by the initial state"


def test_simulation_traces_in_kept_dir(tmp_path: Path) -> None:
    keep = tmp_path / "sim"
    result = run_tlc(FIXTURES / "Counter.tla", keep_dir=keep,
                     extra_args=["-simulate", "file=trace,num=2", "-depth", "6", "-seed", "7"])
    assert (result.status, result.distinct_states) == (Status.PASS, None)
    # TLC 2.15 prints the count only from a reporter thread that a run this short can end before it runs
    # (tools/tlc/simulate.py): the count is there exactly when TLC printed a progress report.
    reported = any(message.code == Code.SIMULATION_PROGRESS for message in result.messages)
    assert (result.generated_states is not None and result.generated_states > 0) == reported
    traces = [parse_simulation_trace((keep / f"trace_0_{i}").read_text()) for i in range(2)]
    for states in traces:
        assert states[0] == {"x": 0, "y": 0} and 2 <= len(states) <= 6
        for before, after in zip(states, states[1:]):
            assert sum(after[v] - before[v] for v in ("x", "y")) in (0, 1)


def test_stuttering_copies_are_dropped_but_a_state_revisited_later_is_kept() -> None:
    from deferdump.tools.tlc.output import without_stuttering

    a, b = {"x": 0, "s": TlaSet([1])}, {"x": 1, "s": TlaSet([1])}
    assert without_stuttering([a, dict(a), b, dict(b), dict(b), a]) == [a, b, a]
    assert without_stuttering([]) == []
