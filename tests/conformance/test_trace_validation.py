"""Trace validation through real TLC: hand-written logs that match the model, that break it at a known
event, and bad input."""
from __future__ import annotations

from pathlib import Path

import pytest

from deferdump.conformance.tracelog import TraceLogError
from deferdump.conformance.tracevalidate import BeyondModel, generate_module, model_constants, validate
from deferdump.conformance.tracelog import load_events
from support.tracelogs import finished_run, hybrid_run, preempt_run, reap_run, write_run


def test_delayed_free_log_matches(tmp_path: Path) -> None:
    result = validate([write_run(tmp_path, *finished_run())])
    assert result.matched, result.first_unmatched
    assert (result.events, result.matched_events, result.first_unmatched) == (12, 12, None)
    assert result.model_constants == {"requests": ["a"], "blocks": 2, "ranks": [0], "block_size": 4}
    assert set(result.as_json()) == {"matched", "events", "matched_events", "first_unmatched", "model_constants",
                                     "seconds"}


def test_free_not_delayed_is_rejected_at_request_finished(tmp_path: Path) -> None:
    result = validate([write_run(tmp_path, *finished_run(delayed=False))])
    assert not result.matched
    unmatched = result.first_unmatched
    assert unmatched is not None
    assert (unmatched.event, unmatched.seq, Path(unmatched.file).name) == ("request_finished", 1, "scheduler-1.ndjson")
    assert unmatched.reason.startswith("delayed: false")
    assert result.matched_events == 4  # step 1: build, then the worker's three calls
    assert str(unmatched.state_before["schedAsync"]) and "a" in unmatched.state_before["schedAsync"]


def test_preemption_waited_by_the_hook_matches(tmp_path: Path) -> None:
    result = validate([write_run(tmp_path, *preempt_run())])
    assert result.matched, result.first_unmatched


def test_ignored_preemption_hook_is_rejected_at_the_overwriting_forward(tmp_path: Path) -> None:
    result = validate([write_run(tmp_path, *preempt_run(hook=False))])
    assert not result.matched
    unmatched = result.first_unmatched
    assert unmatched is not None
    assert (unmatched.event, unmatched.record["step"]) == ("wait_for_save", 2)
    assert unmatched.reason.startswith("NoOverwriteWhileDumpingInv violated")


def test_hidden_completions_take_one_order(tmp_path: Path) -> None:
    # 5 tasks complete, unlogged, before the wait_for_save that reaps them: one state per completion (task-id
    # order), not one per subset of them (2^5), or the search grows exponentially with a step's tasks.
    result = validate([write_run(tmp_path, *reap_run(5))])
    assert result.matched, result.first_unmatched
    assert result.events == 8
    assert result.distinct_states == 1 + result.events + 5


def test_reaping_a_task_never_submitted_is_rejected(tmp_path: Path) -> None:
    scheduler, workers = reap_run(2)
    workers[0][4]["reaped"] = [1, 2, 9]  # step 2's wait_for_save
    result = validate([write_run(tmp_path, scheduler, workers)])
    assert not result.matched and result.first_unmatched is not None
    assert (result.first_unmatched.event, result.first_unmatched.reason[:7]) == ("wait_for_save", "reaped:")


def test_hybrid_fenced_window_free_matches(tmp_path: Path) -> None:
    result = validate([write_run(tmp_path, *hybrid_run())])
    assert result.matched, result.first_unmatched
    assert result.model_constants["sliding_window"] == 16 and result.model_constants["blocks"] == 7


def test_hybrid_unfenced_window_free_is_rejected_at_the_overwriting_forward(tmp_path: Path) -> None:
    result = validate([write_run(tmp_path, *hybrid_run(fence=False))])
    assert not result.matched and result.first_unmatched is not None
    assert (result.first_unmatched.event, result.first_unmatched.record["step"]) == ("wait_for_save", 2)
    assert result.first_unmatched.reason.startswith("NoOverwriteWhileDumpingInv violated")


def test_hybrid_block_reused_while_in_the_window_is_rejected(tmp_path: Path) -> None:
    scheduler, workers = hybrid_run()
    scheduler[1]["reqs"][0]["num_computed_tokens"] = 40  # 25 tokens skipped: block 11 is still in a's window
    result = validate([write_run(tmp_path, scheduler, workers)])
    assert not result.matched and result.first_unmatched is not None
    assert result.first_unmatched.event == "build_connector_meta"
    assert "held by another request" in result.first_unmatched.reason


def test_more_kv_cache_groups_than_the_model_is_bad_input(tmp_path: Path) -> None:
    scheduler, workers = hybrid_run()
    scheduler[0]["sliding_window"] = [16, None]
    with pytest.raises(BeyondModel, match="3 KV-cache groups"):
        validate([write_run(tmp_path, scheduler, workers)])


def test_a_field_no_behaviour_reproduces_is_named(tmp_path: Path) -> None:
    scheduler, workers = finished_run()
    workers[0][5]["reported"] = []  # step 2's get_finished: the finished, tracked request is not reported
    result = validate([write_run(tmp_path, scheduler, workers)])
    assert not result.matched and result.first_unmatched is not None
    assert result.first_unmatched.event == "get_finished"
    assert result.first_unmatched.reason.startswith("reported:")


def test_generated_module_holds_the_log_and_its_constants(tmp_path: Path) -> None:
    events = load_events([write_run(tmp_path, *finished_run())])
    constants = model_constants(events)
    module, cfg = generate_module(events, constants)
    assert module.startswith("---- MODULE MCTraceDeferDump ----") and "EXTENDS TraceDeferDump" in module
    assert module.count('event |-> "') == len(events) == 12
    assert 'GenReq == {"a"}' in module and "GenBlock == {1, 2}" in module and "GenBlockSize == 4" in module
    assert cfg.splitlines()[-1].strip() == "TraceNotDoneInv"  # the witness is checked last


def test_bad_input_raises_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(TraceLogError, match="no such file"):
        validate([tmp_path / "missing"])
    run = write_run(tmp_path / "run", *finished_run())
    (run / "scheduler-1.ndjson").write_text('{"seq": 0}\n')
    with pytest.raises(TraceLogError, match=r"scheduler-1.ndjson:1: field step"):
        validate([run])


def test_the_speed_measures_still_apply() -> None:
    # The trace module reads the cfg-bound constants only through its cached definitions (TLC re-evaluates a
    # CONSTANT bound to a definition at every reference: the log literal, per state), and the JVM veto names
    # a definition that exists (a renamed one would be evaluated again: minutes for a long log).
    from deferdump.conformance.tracevalidate import JVM_ARGS
    from deferdump.tools.tlc.specfiles import spec_dir

    trace = (spec_dir() / "TraceDeferDump.tla").read_text()
    body = trace.split("Ranks == TraceRank\n", 1)[1]
    code = "\n".join(line.split("\\*")[0] for line in body.splitlines() if not line.lstrip().startswith("(*"))
    for constant in ("TraceLog", "TraceReq", "TraceBlock", "TraceRank"):
        assert constant not in code, constant
    veto = next(a for a in JVM_ARGS if "vetoed=" in a).split("=", 1)[1]
    instance, name = veto.split("!")
    assert f"{instance} == INSTANCE DeferDump" in trace
    assert f"\n{name} ==" in (spec_dir() / "DeferDump.tla").read_text()


def _skipped_dump_run(*, loading: bool) -> tuple[list[dict], dict[int, list[dict]]]:
    """finished_run where the worker's load of `a` failed in step 1, so it submits no dump of `a` and logs the
    skip (`skipped_failed_loads`); `a` stays tracked and is reported in step 2 with nothing to wait."""
    scheduler, workers = finished_run()
    if loading:
        scheduler[0]["load"] = [{"req": "a", "block_ids": [1]}]
    worker = workers[0]
    assert (worker[1]["event"], worker[5]["event"]) == ("wait_for_save", "get_finished")
    worker[1].update(submitted=[], skipped_failed_loads=["a"])  # step 1's wait_for_save
    worker[5]["waited"] = []  # step 2's get_finished: no task of `a` is pending
    return scheduler, workers


def test_a_dump_skipped_after_a_failed_load_matches(tmp_path: Path) -> None:
    result = validate([write_run(tmp_path, *_skipped_dump_run(loading=True))])
    assert result.matched, result.first_unmatched


def test_a_skip_of_a_request_without_a_load_is_rejected(tmp_path: Path) -> None:
    result = validate([write_run(tmp_path, *_skipped_dump_run(loading=False))])
    assert not result.matched and result.first_unmatched is not None
    assert result.first_unmatched.event == "wait_for_save"
    assert result.first_unmatched.reason.startswith("skipped_failed_loads:"), result.first_unmatched.reason


def test_a_watching_wrappers_log_is_beyond_the_deferdump_model(tmp_path: Path) -> None:
    scheduler, workers = finished_run()
    scheduler.insert(0, {"step": 0, "event": "connector", "inner": "ExampleConnector", "hma": False,
                         "scribble": False})
    with pytest.raises(BeyondModel, match="watching wrapper's log of ExampleConnector"):
        validate([write_run(tmp_path, scheduler, workers)])


def test_a_log_without_the_reference_connectors_own_fields_is_beyond_the_model(tmp_path: Path) -> None:
    scheduler, workers = finished_run()
    del workers[0][1]["submitted"]  # step 1's wait_for_save, as a wrapper around another connector logs it
    with pytest.raises(BeyondModel, match=r"worker-rank0-2.ndjson:2: field submitted: missing"):
        validate([write_run(tmp_path, scheduler, workers)])
