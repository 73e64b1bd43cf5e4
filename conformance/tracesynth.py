"""A synthetic, protocol-correct connector event log of any length (for `deferdump bench`).

Each engine step admits one request of two blocks (block size 4, 6 prompt tokens: one full block is
dumped), finishes the previous one (its free delayed), and the worker reports it one step later, which
releases its blocks to later requests: about 7 events per step, in the adapter's format.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENGINE = "synthetic"


def synthetic_run(min_events: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(scheduler events, rank 0 worker events) with at least `min_events` events in all."""
    scheduler: list[dict[str, Any]] = []
    worker: list[dict[str, Any]] = []
    free = list(range(1, 9))
    held: dict[str, list[int]] = {}
    task_of: dict[str, int] = {}
    finished: list[str] = []  # finished since the last schedule
    to_report: list[str] = []  # finished requests the worker sees in this step's metadata
    step = 0
    while len(scheduler) + len(worker) < min_events:
        step += 1
        req = f"r{step}"
        blocks = [free.pop(0), free.pop(0)]
        held[req] = blocks
        scheduler.append({"step": step, "event": "build_connector_meta", "block_size": 4,
                          "reqs": [{"req": req, "new": True, "resumed": False, "block_ids": blocks,
                                    "num_computed_tokens": 0, "num_scheduled_tokens": 6}],
                          "dump": [{"req": req, "block_ids": blocks[:1]}], "load": [], "preempted": [],
                          "finished": finished})
        to_report, finished = finished, []
        task_of[req] = step
        worker.append({"step": step, "event": "handle_preemptions", "preempted": [], "waited": []})
        worker.append({"step": step, "event": "wait_for_save", "reaped": [],
                       "submitted": [{"task": step, "reqs": [req], "blocks": blocks[:1]}], "submit_error": None})
        worker.append({"step": step, "event": "get_finished", "finished_req_ids": to_report,
                       "waited": [task_of.pop(r) for r in to_report], "reported": to_report})
        scheduler.append({"step": step, "event": "request_finished", "req": req, "block_ids": blocks, "delayed": True})
        finished = [req]
        if to_report:
            scheduler.append({"step": step, "event": "update_connector_output", "finished_sending": to_report,
                              "finished_recving": []})
            for done in to_report:
                free.extend(held.pop(done))
    return scheduler, worker


def write_synthetic_run(directory: Path, min_events: int) -> int:
    """Write the run's two log files into `directory`; returns the number of events."""
    scheduler, worker = synthetic_run(min_events)
    directory.mkdir(parents=True, exist_ok=True)
    for name, role, events in (("scheduler-1.ndjson", "scheduler", scheduler), ("worker-rank0-1.ndjson", "worker", worker)):
        lines = [json.dumps({"seq": seq, "role": role, "rank": 0, "engine": ENGINE, **event})
                 for seq, event in enumerate(events)]
        (directory / name).write_text("\n".join(lines) + "\n")
    return len(scheduler) + len(worker)
