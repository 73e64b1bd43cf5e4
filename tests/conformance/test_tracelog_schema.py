"""The event log's schema and the engine-order merge (no TLC)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from deferdump.conformance.tracelog import SCHEMA, TraceLogError, check_line, load_events, read_file
from support.tracelogs import ENGINE, finished_run, lines, write_run


def _line(**fields: object) -> dict[str, object]:
    base = {"seq": 0, "step": 1, "role": "scheduler", "rank": 0, "engine": ENGINE, "event": "request_finished",
            "req": "a", "block_ids": [1], "delayed": True}
    base.update(fields)
    return base


@pytest.mark.parametrize(("change", "field"), [
    ({"delayed": "yes"}, "delayed"),
    ({"block_ids": [1, "x"]}, "block_ids[1]"),
    ({"event": "bogus"}, "event"),
    ({"role": "worker"}, "role"),
    ({"seq": -1}, "seq"),
    ({"group_block_ids": [[1, -2]]}, "group_block_ids[0][1]"),
])
def test_a_bad_line_names_file_line_and_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(TraceLogError) as caught:
        check_line(_line(**change), "x.ndjson", 7)
    message = str(caught.value)
    assert message.startswith(f"x.ndjson:7: field {field}:"), message
    assert "\n" not in message


def test_a_missing_field_is_named() -> None:
    record = _line()
    del record["delayed"]
    with pytest.raises(TraceLogError, match=r"^x.ndjson:2: field delayed: "):
        check_line(record, "x.ndjson", 2)


def test_every_written_event_passes_the_schema(tmp_path: Path) -> None:
    scheduler, workers = finished_run()
    for record in lines("scheduler", 0, scheduler) + lines("worker", 0, workers[0]):
        check_line(record, "ok.ndjson", 1)
    assert SCHEMA["$schema"].endswith("2020-12/schema")


def test_seq_gap_and_bad_json_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "scheduler-1.ndjson"
    path.write_text(json.dumps(_line()) + "\n" + json.dumps(_line(seq=2)) + "\n")
    with pytest.raises(TraceLogError, match=r"scheduler-1.ndjson:2: field seq: is 2, expected 1"):
        read_file(path)
    path.write_text("{not json\n")
    with pytest.raises(TraceLogError, match=r"scheduler-1.ndjson:1: not JSON"):
        read_file(path)


def test_merge_orders_schedule_workers_then_output(tmp_path: Path) -> None:
    events = load_events([write_run(tmp_path, *finished_run())])
    order = [(e.record["step"], e.record["role"][0], e.event) for e in events]
    assert order == [
        (1, "s", "build_connector_meta"), (1, "w", "handle_preemptions"), (1, "w", "wait_for_save"),
        (1, "w", "get_finished"), (1, "s", "request_finished"),
        (2, "s", "build_connector_meta"), (2, "w", "handle_preemptions"), (2, "w", "wait_for_save"),
        (2, "w", "get_finished"), (2, "s", "update_connector_output"), (2, "s", "shutdown"), (2, "w", "shutdown"),
    ]


def test_logs_of_two_engines_are_refused(tmp_path: Path) -> None:
    run = write_run(tmp_path, *finished_run())
    worker = run / "worker-rank0-2.ndjson"
    worker.write_text(worker.read_text().replace(ENGINE, "other-engine"))
    with pytest.raises(TraceLogError, match="logs of 2 engines"):
        load_events([run])


def _boundary_run() -> tuple[list[dict[str, object]], dict[int, list[dict[str, object]]]]:
    """A watching wrapper's log of another connector: no slices, no task ids, the receive-side events."""
    scheduler: list[dict[str, object]] = [
        {"step": 0, "event": "connector", "inner": "ExampleConnector", "hma": False, "scribble": True},
        {"step": 0, "event": "get_num_new_matched_tokens", "req": "a", "num_computed_tokens": 0, "matched": 32,
         "load_async": True},
        {"step": 0, "event": "update_state_after_alloc", "req": "a", "block_ids": [1, 2], "num_external_tokens": 32},
        {"step": 1, "event": "build_connector_meta", "block_size": 32, "preempted": [], "finished": [],
         "reqs": [{"req": "a", "new": True, "resumed": False, "block_ids": [1, 2], "num_computed_tokens": 32,
                   "num_scheduled_tokens": 8}]},
        {"step": 1, "event": "update_connector_output", "finished_sending": [], "finished_recving": ["a"],
         "invalid_block_ids": [2]},
    ]
    worker: list[dict[str, object]] = [
        {"step": 0, "event": "connector", "inner": "ExampleConnector", "hma": False, "scribble": True},
        {"step": 1, "event": "handle_preemptions", "preempted": []},
        {"step": 1, "event": "scribble", "block_ids": [1, 2]},
        {"step": 1, "event": "start_load_kv", "loads": [{"req": "a", "block_ids": [1, 2], "task": 7}]},
        {"step": 1, "event": "wait_for_save"},
        {"step": 1, "event": "get_finished", "finished_req_ids": [], "reported": [], "reported_recving": ["a"]},
        {"step": 1, "event": "get_block_ids_with_load_errors", "block_ids": [2]},
    ]
    return scheduler, {0: worker}


def test_boundary_log_events_pass_the_schema_and_merge_in_engine_order(tmp_path: Path) -> None:
    events = load_events([write_run(tmp_path, *_boundary_run())])
    order = [(e.record["role"][0], e.event) for e in events]
    assert order[:2] == [("s", "connector"), ("w", "connector")]  # before everything
    # scheduling step 1 (matched tokens, allocation: step 0) comes before step 1's metadata
    assert order[2:5] == [("s", "get_num_new_matched_tokens"), ("s", "update_state_after_alloc"),
                          ("s", "build_connector_meta")]
    assert order[-1] == ("s", "update_connector_output")


@pytest.mark.parametrize(("event", "change", "field"), [
    ("connector", {"hma": "no"}, "hma"),
    ("get_num_new_matched_tokens", {"matched": -1}, "matched"),
    ("get_num_new_matched_tokens", {"load_async": None}, "load_async"),
    ("update_state_after_alloc", {"num_external_tokens": "x"}, "num_external_tokens"),
    ("scribble", {"block_ids": [-1]}, "block_ids[0]"),
    ("start_load_kv", {"loads": [{"req": "a", "block_ids": [1]}]}, "loads[0].task"),
    ("get_finished", {"reported_recving": [1]}, "reported_recving[0]"),
    ("get_block_ids_with_load_errors", {"block_ids": None}, "block_ids"),
])
def test_a_bad_boundary_line_names_its_field(event: str, change: dict[str, object], field: str) -> None:
    scheduler, workers = _boundary_run()
    record = next(r for r in scheduler + workers[0] if r["event"] == event)
    role = "scheduler" if record in scheduler else "worker"
    line = {"seq": 0, "role": role, "rank": 0, "engine": ENGINE, **record, **change}
    with pytest.raises(TraceLogError) as caught:
        check_line(line, "x.ndjson", 3)
    assert str(caught.value).startswith(f"x.ndjson:3: field {field}:"), caught.value
