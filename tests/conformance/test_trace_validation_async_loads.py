"""Trace validation of the receive side (asynchronous loads, the connector's `load_async`) through real TLC:
hand-written logs in the reference adapter's format (docs/trace-log.md) that match the model, and logs of known
bad behaviours rejected at the event that shows them: real bug P8's dropped receive, a block handed to another
request while a load still writes it, a receive delivered before every rank reported it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deferdump.conformance.tracevalidate import BeyondModel, validate
from support.tracelogs import write_run

pytestmark = pytest.mark.slow


def _build(step: int, reqs: list[dict[str, Any]] = (), load: list[dict[str, Any]] = (),  # type: ignore[assignment]
           finished: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {"step": step, "event": "build_connector_meta", "block_size": 4, "reqs": list(reqs), "dump": [],
            "load": list(load), "preempted": [], "finished": list(finished)}


def _parked(step: int, req: str, blocks: list[int]) -> list[dict[str, Any]]:
    """The scheduler admits `req` with a hit of all but its last token, answered load_async: vLLM parks it."""
    external = 4 * len(blocks) - 1
    return [{"step": step, "event": "get_num_new_matched_tokens", "req": req, "num_computed_tokens": 0,
             "matched": external, "load_async": True},
            {"step": step, "event": "update_state_after_alloc", "req": req, "block_ids": blocks,
             "num_external_tokens": external}]


def _update(step: int, recving: list[str] = (), invalid: list[int] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    record: dict[str, Any] = {"step": step, "event": "update_connector_output", "finished_sending": [],
                              "finished_recving": list(recving)}
    if invalid:
        record["invalid_block_ids"] = list(invalid)
    return record


def _rank_step(step: int, loads: list[dict[str, Any]] = (), finished: list[str] = (),  # type: ignore[assignment]
               recving: list[str] = (), receiving: list[str] = (), errors: list[int] = ()  # type: ignore[assignment]
               ) -> list[dict[str, Any]]:
    """A worker step with asynchronous loads, in vLLM's order (the adapter's fields)."""
    return [{"step": step, "event": "handle_preemptions", "preempted": [], "waited": []},
            {"step": step, "event": "start_load_kv", "loads": list(loads)},
            {"step": step, "event": "wait_for_save", "reaped": [], "submitted": [], "submit_error": None},
            {"step": step, "event": "get_finished", "finished_req_ids": list(finished), "waited": [], "reported": [],
             "reported_recving": list(recving), "receiving": list(receiving)},
            {"step": step, "event": "get_block_ids_with_load_errors", "block_ids": list(errors)}]


def _load(req: str, blocks: list[int], task: int) -> dict[str, Any]:
    return {"req": req, "block_ids": blocks, "task": task}


def _served(ranks: int = 1) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """`a` (8 tokens) is parked for its hit, loaded on every rank while steps go by, received, then runs its
    last token on the loaded blocks and finishes."""
    slice_ = {"req": "a", "block_ids": [1, 2]}
    scheduler = [
        *_parked(0, "a", [1, 2]),
        _build(1, load=[slice_]), _update(1),
        _build(2), _update(2, recving=["a"]),
        _build(3, reqs=[{"req": "a", "new": True, "resumed": False, "block_ids": [1, 2], "num_computed_tokens": 7,
                         "num_scheduled_tokens": 1}]),
        {"step": 3, "event": "request_finished", "req": "a", "block_ids": [1, 2], "delayed": False}, _update(3),
        _build(4, finished=["a"]),
        {"step": 4, "event": "shutdown", "waited": []},
    ]
    workers = {rank: [*_rank_step(1, loads=[_load("a", [1, 2], 10 + rank)], receiving=["a"]),
                      *_rank_step(2, recving=["a"]), *_rank_step(3), *_rank_step(4, finished=["a"]),
                      {"step": 4, "event": "shutdown", "waited": []}]
               for rank in range(ranks)}
    return scheduler, workers


def _aborted_while_loading(*, drop: bool) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """`a` is aborted while its load runs: the connector answers False and vLLM delays the free itself until
    finished_recving. `drop`: the worker forgets the aborted request's receive (real bug P8, the reference's
    TEST-ONLY `test_drop_aborted_recving`): no report ever comes, and its blocks are never freed."""
    scheduler = [
        *_parked(0, "a", [1, 2]),
        _build(1, load=[{"req": "a", "block_ids": [1, 2]}]),
        {"step": 1, "event": "request_finished", "req": "a", "block_ids": [1, 2], "delayed": False}, _update(1),
        _build(2, finished=["a"]), _update(2),
        _build(3), _update(3, recving=[] if drop else ["a"]),
        {"step": 3, "event": "shutdown", "waited": []},
    ]
    worker = [*_rank_step(1, loads=[_load("a", [1, 2], 10)], receiving=["a"]),
              *_rank_step(2, finished=["a"], receiving=[] if drop else ["a"]),
              *_rank_step(3, recving=[] if drop else ["a"]),
              {"step": 3, "event": "shutdown", "waited": []}]
    return scheduler, {0: worker}


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_parked_hit_loaded_received_and_run_matches(tmp_path: Path, ranks: int) -> None:
    result = validate([write_run(tmp_path, *_served(ranks))])
    assert result.matched, result.first_unmatched
    assert result.model_constants["ranks"] == list(range(ranks))


def test_an_abort_during_the_load_freed_at_its_receive_matches(tmp_path: Path) -> None:
    result = validate([write_run(tmp_path, *_aborted_while_loading(drop=False))])
    assert result.matched, result.first_unmatched


def test_p8_dropped_receive_is_rejected_where_the_rank_drops_it(tmp_path: Path) -> None:
    result = validate([write_run(tmp_path, *_aborted_while_loading(drop=True))])
    unmatched = result.first_unmatched
    assert not result.matched and unmatched is not None
    assert (unmatched.event, unmatched.record["step"], unmatched.record["rank"]) == ("get_finished", 2, 0)
    assert unmatched.reason.startswith("receiving: a load dropped without its finished_recving")


def test_a_receive_delivered_before_every_rank_reported_it_is_rejected(tmp_path: Path) -> None:
    scheduler, workers = _served(2)
    step2 = next(e for e in workers[1] if e["event"] == "get_finished" and e["step"] == 2)
    step2["reported_recving"], step2["receiving"] = [], ["a"]  # rank 1 still loads: vLLM must not deliver it
    result = validate([write_run(tmp_path, scheduler, workers)])
    unmatched = result.first_unmatched
    assert not result.matched and unmatched is not None
    assert (unmatched.event, unmatched.record["step"]) == ("update_connector_output", 2)
    assert unmatched.reason.startswith("finished_recving: not exactly the requests every rank reported")


def test_a_block_handed_to_another_request_under_a_running_load_is_rejected(tmp_path: Path) -> None:
    """vLLM frees a request waiting for remote KV while its load runs (real bug P10's first hole): the block goes
    to the next request, whose forward writes it while the load still does."""
    scheduler, workers = _served(1)
    assert scheduler[4]["event"] == "build_connector_meta" and scheduler[4]["step"] == 2
    scheduler[4] = _build(2, reqs=[{"req": "b", "new": True, "resumed": False, "block_ids": [2],
                                    "num_computed_tokens": 0, "num_scheduled_tokens": 4}])
    result = validate([write_run(tmp_path, scheduler, workers)])
    unmatched = result.first_unmatched
    assert not result.matched and unmatched is not None
    assert (unmatched.event, unmatched.record["step"]) == ("build_connector_meta", 2)
    assert unmatched.reason == "reqs: a block written by this step is held by another request"


def test_a_load_the_step_did_not_send_is_rejected(tmp_path: Path) -> None:
    scheduler, workers = _served(1)
    workers[0][1]["loads"] = [_load("a", [1, 3], 10)]
    result = validate([write_run(tmp_path, scheduler, workers)])
    unmatched = result.first_unmatched
    assert not result.matched and unmatched is not None
    assert (unmatched.event, unmatched.reason) == ("start_load_kv", "loads: not the step's asynchronous load slices")


def test_a_failed_receive_frees_the_blocks_and_the_request_recomputes(tmp_path: Path) -> None:
    """One KV-cache group: the failed load's blocks come as invalid_block_ids with the receive; vLLM frees them
    (the first block failed), looks the request up again (a miss) and schedules it from 0 on new blocks."""
    scheduler, workers = _served(1)
    assert scheduler[5] == _update(2, recving=["a"])
    scheduler[5] = _update(2, recving=["a"], invalid=[1, 2])
    scheduler[6:6] = [{"step": 2, "event": "get_num_new_matched_tokens", "req": "a", "num_computed_tokens": 0,
                       "matched": 0, "load_async": False},
                      {"step": 2, "event": "update_state_after_alloc", "req": "a", "block_ids": [2, 1],
                       "num_external_tokens": 0}]
    assert scheduler[8]["event"] == "build_connector_meta" and scheduler[9]["event"] == "request_finished"
    scheduler[8] = _build(3, reqs=[{"req": "a", "new": True, "resumed": False, "block_ids": [2, 1],
                                    "num_computed_tokens": 0, "num_scheduled_tokens": 8}])
    scheduler[9]["block_ids"] = [2, 1]
    step2 = next(e for e in workers[0] if e["event"] == "get_block_ids_with_load_errors" and e["step"] == 2)
    step2["block_ids"] = [1, 2]
    result = validate([write_run(tmp_path, scheduler, workers)])
    assert result.matched, result.first_unmatched


def test_asynchronous_loads_on_a_hybrid_model_are_beyond_the_model(tmp_path: Path) -> None:
    scheduler, workers = _served(1)
    scheduler[1]["group_block_ids"] = [[3, 4]]
    with pytest.raises(BeyondModel, match="several KV-cache groups"):
        validate([write_run(tmp_path, scheduler, workers)])
