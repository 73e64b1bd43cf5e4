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
