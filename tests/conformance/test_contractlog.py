"""`check_contract_log`: hand-written boundary logs of each safety design (ok) and of each violation kind.

The logs of `support.tracelogs` were written for TraceDeferDump (the reference connector's own check);
the contract must reach the same verdict on them without reading their DeferDump-specific meaning.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from deferdump.conformance.contractlog import (
    DELAYED_EVENTUALLY_REPORTED, NO_REUSE_BEFORE_REPORT, NO_WRITE_WHILE_TRANSFER, SENDING_ONLY_DELAYED,
    ContractVerdict, check_contract_log)
from deferdump.conformance.tracelog import TraceLogError
from deferdump.conformance.tracesynth import write_synthetic_run
from deferdump.reference.errors import UserError
from support.tracelogs import build, finished_run, hybrid_run, preempt_run, req, step_worker, task, write_run


def _check(tmp_path: Path, scheduler: list[dict[str, Any]], workers: dict[int, list[dict[str, Any]]],
           **kwargs: Any) -> ContractVerdict:
    return check_contract_log([write_run(tmp_path / "run", scheduler, workers)], **kwargs)


def _finish(step: int, name: str, blocks: list[int], delayed: bool) -> dict[str, Any]:
    return {"step": step, "event": "request_finished", "req": name, "block_ids": blocks, "delayed": delayed}


def _output(step: int, sending: list[str]) -> dict[str, Any]:
    return {"step": step, "event": "update_connector_output", "finished_sending": sending, "finished_recving": []}


def _two_requests(*, delayed: bool, flush: bool, reuse_step: int = 2, report: bool = True,
                  reap_step: int | None = None) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """Request a computes block 1 and its save (task 7) reads it; a finishes in step 1. Request b is given
    block 1 in `reuse_step` and writes it. Delayed free: a's report (step 2, after waiting task 7) frees
    block 1 first; flush on reuse: handle_preemptions of the reuse step waits task 7; neither: the forward
    rewrites block 1 under the save."""
    scheduler: list[dict[str, Any]] = [build(1, [req("a", [1], 0, 4, new=True)]), _finish(1, "a", [1], delayed)]
    worker = step_worker(1, preempted=[], submitted=[task(7, ["a"], [1])])
    for step in range(2, reuse_step + 1):
        reqs = [req("b", [1], 0, 4, new=True)] if step == reuse_step else []
        scheduler.append(build(step, reqs, finished=["a"] if step == 2 else []))
        waits_pre = [7] if flush and step == reuse_step else []
        reaped = [7] if reap_step == step else []
        reports = delayed and report and step == 2
        worker += step_worker(step, preempted=[], waited_pre=waits_pre, reaped=reaped,
                              finished=["a"] if step == 2 else [], waited=[7] if reports else [],
                              reported=["a"] if reports else [])
        if reports:
            scheduler.append(_output(step, ["a"]))
    return scheduler, {0: worker}


# ----------------------------------------------------------------------------- each design passes
def test_delayed_free_passes_and_the_drained_run_reports_every_delay(tmp_path: Path) -> None:
    verdict = check_contract_log([write_run(tmp_path, *finished_run())], drained=True)
    assert verdict == ContractVerdict(True, None, None, 12, ())


def test_delayed_free_reused_after_the_report_passes(tmp_path: Path) -> None:
    verdict = _check(tmp_path, *_two_requests(delayed=True, flush=False, reuse_step=3), drained=True)
    assert (verdict.ok, verdict.unchecked) == (True, ())


def test_flush_on_reuse_passes(tmp_path: Path) -> None:
    verdict = _check(tmp_path, *_two_requests(delayed=False, flush=True))
    assert (verdict.ok, verdict.property) == (True, None)


def test_pinning_passes_the_block_comes_back_only_after_the_copy(tmp_path: Path) -> None:
    # never delayed, never flushed: vLLM hands block 1 out again only after the save ended (reaped, step 2)
    verdict = _check(tmp_path, *_two_requests(delayed=False, flush=False, reuse_step=3, reap_step=2))
    assert verdict.ok, verdict.detail


def test_the_reference_connectors_fenced_and_hooked_logs_pass(tmp_path: Path) -> None:
    assert _check(tmp_path / "p", *preempt_run(hook=True)).ok
    assert _check(tmp_path / "h", *hybrid_run(fence=True)).ok


def test_a_long_protocol_correct_log_passes(tmp_path: Path) -> None:
    events = write_synthetic_run(tmp_path, 1000)
    verdict = check_contract_log([tmp_path])
    assert (verdict.ok, verdict.events, verdict.unchecked) == (True, events, (DELAYED_EVENTUALLY_REPORTED,))


def test_a_prefix_hit_on_a_delayed_requests_block_is_no_reuse(tmp_path: Path) -> None:
    # b shares a's first block as a local prefix hit (4 tokens computed) and writes only block 5
    scheduler = [build(1, [req("a", [1, 2], 0, 6, new=True)]), _finish(1, "a", [1, 2], True),
                 build(2, [req("b", [1, 5], 4, 3, new=True)], finished=["a"])]
    verdict = _check(tmp_path, scheduler, {})
    assert verdict.ok, verdict.detail
    assert verdict.unchecked == (NO_WRITE_WHILE_TRANSFER, DELAYED_EVENTUALLY_REPORTED)  # a black box


# ----------------------------------------------------------------------------- each violation
def test_free_before_copy_is_a_write_under_a_running_save(tmp_path: Path) -> None:
    verdict = _check(tmp_path, *_two_requests(delayed=False, flush=False))
    assert (verdict.ok, verdict.property) == (False, NO_WRITE_WHILE_TRANSFER)
    assert verdict.detail is not None
    assert "worker-rank0-2.ndjson:" in verdict.detail and "event wait_for_save, request b, block 1" in verdict.detail
    assert "save task 7 of a" in verdict.detail


def test_report_before_copy_is_a_write_under_a_running_save(tmp_path: Path) -> None:
    scheduler, workers = _two_requests(delayed=True, flush=False, reuse_step=3)
    for event in workers[0]:
        if event["event"] == "get_finished":
            event["waited"] = []  # reports a without waiting its task
    verdict = _check(tmp_path, scheduler, workers)
    assert (verdict.ok, verdict.property) == (False, NO_WRITE_WHILE_TRANSFER)
    assert "request b, block 1" in (verdict.detail or "")


def test_the_reference_connectors_broken_logs_fail_as_traced(tmp_path: Path) -> None:
    no_hook = _check(tmp_path / "p", *preempt_run(hook=False))
    no_fence = _check(tmp_path / "h", *hybrid_run(fence=False))
    assert (no_hook.property, no_fence.property) == (NO_WRITE_WHILE_TRANSFER, NO_WRITE_WHILE_TRANSFER)
    assert "request b, block 1" in (no_hook.detail or "") and "request b, block 11" in (no_fence.detail or "")


def test_a_report_of_an_undelayed_request(tmp_path: Path) -> None:
    scheduler, workers = finished_run(delayed=False)
    scheduler[3]["finished_sending"] = ["a"]
    verdict = _check(tmp_path, scheduler, workers)
    assert (verdict.ok, verdict.property) == (False, SENDING_ONLY_DELAYED)
    assert "scheduler-1.ndjson:4: event update_connector_output, request a" in (verdict.detail or "")
    assert "not delayed" in (verdict.detail or "")


def test_a_second_report_of_one_life(tmp_path: Path) -> None:
    scheduler, workers = finished_run()
    scheduler.insert(4, _output(2, ["a"]))
    verdict = _check(tmp_path, scheduler, workers)
    assert (verdict.property, "scheduler-1.ndjson:5:" in (verdict.detail or "")) == (SENDING_ONLY_DELAYED, True)
    assert "already reported" in (verdict.detail or "")


def test_a_report_for_an_unknown_request(tmp_path: Path) -> None:
    verdict = _check(tmp_path, [build(1), _output(1, ["ghost"])], {})
    assert (verdict.property, "never saw" in (verdict.detail or "")) == (SENDING_ONLY_DELAYED, True)


def test_a_delayed_requests_block_written_for_another_before_the_report(tmp_path: Path) -> None:
    scheduler = [build(1, [req("a", [1, 2], 0, 6, new=True)]), _finish(1, "a", [1, 2], True),
                 build(2, [req("b", [5, 2], 4, 3, new=True)], finished=["a"])]  # b writes block 2
    verdict = _check(tmp_path, scheduler, {})
    assert (verdict.ok, verdict.property) == (False, NO_REUSE_BEFORE_REPORT)
    assert "scheduler-1.ndjson:3: event build_connector_meta, request a, block 2" in (verdict.detail or "")


def test_never_reports_fails_only_once_the_run_is_known_drained(tmp_path: Path) -> None:
    scheduler, workers = finished_run()
    scheduler[3]["finished_sending"] = []
    workers[0][-2]["reported"] = []
    run = write_run(tmp_path, scheduler, workers)
    open_run = check_contract_log([run])
    assert (open_run.ok, open_run.unchecked) == (True, (DELAYED_EVENTUALLY_REPORTED,))
    drained = check_contract_log([run], drained=True)
    assert (drained.ok, drained.property) == (False, DELAYED_EVENTUALLY_REPORTED)
    assert "scheduler-1.ndjson:2: event request_finished, request a" in (drained.detail or "")


def test_the_verdict_is_frozen() -> None:
    verdict = ContractVerdict(True, None, None, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.ok = False  # type: ignore[misc]


def test_bad_input_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(TraceLogError, match="no such file"):
        check_contract_log([tmp_path / "missing"])
    (tmp_path / "s.ndjson").write_text('{"seq": 0}\n')
    with pytest.raises(UserError, match=r"s\.ndjson:1: field"):
        check_contract_log([tmp_path / "s.ndjson"])
