"""The connector's event log writer (the adapter's `trace_log` key): file names, lines, the config key."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from deferdump.conformance.tracelog import check_line
from deferdump.reference.errors import ConfigError
from deferdump.reference.metadata import DeferDumpMetadata, RequestDispatchMeta
from deferdump.reference.tracelog import SCHEDULER, WORKER, TraceLog, build_fields
from deferdump.reference.views import CachedRequestView, NewRequestView, StepView
from deferdump.reference.vllm import TRACE_LOG_KEY, split_extra_config


def test_one_file_per_instance_numbered_lines(tmp_path: Path) -> None:
    scheduler = TraceLog(tmp_path, SCHEDULER, 0, "e1")
    second = TraceLog(tmp_path, SCHEDULER, 0, "e1")  # a second instance of the same process
    worker = TraceLog(tmp_path, WORKER, 3, "e1")
    pid = os.getpid()
    assert (scheduler.path.name, second.path.name, worker.path.name) == (
        f"scheduler-{pid}.ndjson", f"scheduler-{pid}-1.ndjson", f"worker-rank3-{pid}.ndjson")
    scheduler.next_step()
    scheduler.write("request_finished", req="a", block_ids=[1], delayed=True)
    scheduler.write("update_connector_output", finished_sending=[], finished_recving=[])
    worker.write("shutdown", waited=[])
    for log in (scheduler, second, worker):
        log.close()
    records = [json.loads(line) for line in scheduler.path.read_text().splitlines()]
    assert [(r["seq"], r["step"], r["role"], r["rank"], r["event"]) for r in records] == [
        (0, 1, "scheduler", 0, "request_finished"), (1, 1, "scheduler", 0, "update_connector_output")]
    for number, record in enumerate(records, start=1):
        check_line(record, str(scheduler.path), number)
    assert second.path.read_text() == ""
    scheduler.write("shutdown", waited=[])  # after close: nothing, no error
    assert len(scheduler.path.read_text().splitlines()) == 2


def test_build_fields_log_the_step_and_the_slices(tmp_path: Path) -> None:
    step = StepView(
        new_requests=(NewRequestView("a", (1, 2, 3), 3, (4, 5), 0, 3),),
        cached_requests=(CachedRequestView("b", (9,), True, 0, 40),),
        finished_req_ids=frozenset({"z"}),
        preempted_req_ids=frozenset({"y"}),
    )
    meta = DeferDumpMetadata({"a": RequestDispatchMeta(dump_hashes=(b"h",), dump_block_ids=(4,)),
                              "b": RequestDispatchMeta(load_hashes=(b"g",), load_block_ids=(9,))}, frozenset({"y"}))
    fields = build_fields(step, meta, 32)
    assert fields["reqs"] == [
        {"req": "a", "new": True, "resumed": False, "block_ids": [4, 5], "num_computed_tokens": 0,
         "num_scheduled_tokens": 3},
        {"req": "b", "new": False, "resumed": True, "block_ids": [9], "num_computed_tokens": 0,
         "num_scheduled_tokens": 40},
    ]
    assert fields["dump"] == [{"req": "a", "block_ids": [4]}] and fields["load"] == [{"req": "b", "block_ids": [9]}]
    assert (fields["preempted"], fields["finished"], fields["block_size"]) == (["y"], ["z"], 32)
    record = {"seq": 0, "step": 1, "role": "scheduler", "rank": 0, "engine": "e", "event": "build_connector_meta",
              **fields}
    check_line(record, "s.ndjson", 1)


def test_build_fields_of_a_hybrid_model_log_the_window_group() -> None:
    step = StepView(
        new_requests=(NewRequestView("a", (1,) * 70, 70, (4, 5, 6), 0, 70, ((11, 12, 13),)),),
        cached_requests=(CachedRequestView("b", (), False, 70, 1, ((),)),),
        finished_req_ids=frozenset(), preempted_req_ids=frozenset(),
    )
    meta = DeferDumpMetadata({"a": RequestDispatchMeta(dump_hashes=(b"h", b"i"), dump_block_ids=(4, 5),
                                                       dump_group_block_ids=((0, 12),))}, frozenset())
    fields = build_fields(step, meta, 32, [16])
    assert fields["sliding_window"] == [16]
    assert [x["group_block_ids"] for x in fields["reqs"]] == [[[11, 12, 13]], [[]]]
    assert fields["dump"] == [{"req": "a", "block_ids": [4, 5], "group_block_ids": [[0, 12]]}]
    check_line({"seq": 0, "step": 1, "role": "scheduler", "rank": 0, "engine": "e", "event": "build_connector_meta",
                **fields}, "s.ndjson", 1)
    assert "sliding_window" not in build_fields(step, meta, 32)  # one group: the line is unchanged


def test_trace_log_key_is_the_adapters_and_checked() -> None:
    config, adapter = split_extra_config({TRACE_LOG_KEY: "/tmp/x", "store": "memory"})
    assert adapter == {TRACE_LOG_KEY: "/tmp/x"} and config.store == "memory"
    with pytest.raises(ConfigError, match="trace_log"):
        split_extra_config({TRACE_LOG_KEY: 3})
    with pytest.raises(ConfigError, match="trace_log"):
        split_extra_config({TRACE_LOG_KEY: ""})
