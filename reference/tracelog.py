"""The connector's event log: one NDJSON file per connector instance and process, for trace validation.

`deferdump validate` checks such a log against the TLA+ model (does real vLLM behave as the model says
it does?). Each line is one JSON object: `seq` (per file, from 0), `step` (the engine step as this
instance knows it: the number of `build_connector_meta` calls on the scheduler side, of bound metadata
on the worker side), `role`, `rank`, `engine`, `event`, then the call's arguments and result. The format
is documented in docs/trace-log.md; its JSON Schema is `deferdump.conformance.tracelog.SCHEMA`.

Each line is flushed as it is written: vLLM may kill a process that does not shut down in time, and a
log cut after a complete line is still a valid (shorter) log.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from collections.abc import Sequence
from typing import Any, TextIO

logger = logging.getLogger(__name__)

SCHEDULER, WORKER = "scheduler", "worker"


def log_file_name(role: str, rank: int, pid: int, index: int = 0) -> str:
    """`scheduler-<pid>.ndjson` / `worker-rank<r>-<pid>.ndjson`; `-<index>` for a second instance."""
    base = f"scheduler-{pid}" if role == SCHEDULER else f"worker-rank{rank}-{pid}"
    return f"{base}.ndjson" if index == 0 else f"{base}-{index}.ndjson"


class TraceLog:
    """Appends one event per line to this instance's own file (never shared with another instance)."""

    _claim_lock = threading.Lock()  # two instances of one process must not pick the same file name

    def __init__(self, directory: str | os.PathLike[str], role: str, rank: int, engine: str) -> None:
        self.role = role
        self.rank = rank
        self.engine = engine
        self.step = 0
        self._seq = 0
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        with TraceLog._claim_lock:
            index = 0
            while True:
                path = folder / log_file_name(role, rank, os.getpid(), index)
                try:
                    self._file: TextIO | None = open(path, "x", encoding="utf-8")  # noqa: SIM115 - closed in close()
                    break
                except FileExistsError:
                    index += 1
        self.path = path
        logger.info("deferdump trace log: %s", path)

    def next_step(self) -> None:
        """A new engine step begins for this instance (scheduler: a schedule; worker: bound metadata)."""
        self.step += 1

    def write(self, event: str, **fields: Any) -> None:
        """One line: the common fields, then the call's arguments and result."""
        if self._file is None:
            return
        record = {"seq": self._seq, "step": self.step, "role": self.role, "rank": self.rank,
                  "engine": self.engine, "event": event, **fields}
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()
        self._seq += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def ids(values: Any) -> list[str]:
    """A set of request ids as a sorted list (logs are compared as data: order must not vary)."""
    return sorted(str(value) for value in (values or ()))


def build_fields(step: Any, metadata: Any, block_size: int,
                 sliding_windows: Sequence[int | None] = ()) -> dict[str, Any]:
    """`build_connector_meta`'s line: every scheduled request, the dump and load slices, preempted, finished.

    `block_ids` of a request are the blocks vLLM passed this step: all of them for a new or resumed
    request, the added ones for a running request. `step` is a `StepView`, `metadata` the result.
    With more than one KV-cache group (`sliding_windows`: the window of each group after the
    full-attention one, None for full attention) the line also carries `sliding_window` and, per request
    and per slice, `group_block_ids`: the other groups' lists, in the same order.
    """
    hybrid = bool(sliding_windows)

    def entry(req_id: str, new: bool, resumed: bool, blocks: Any, groups: Any, computed: int,
              scheduled: int) -> dict[str, Any]:
        fields: dict[str, Any] = {"req": req_id, "new": new, "resumed": resumed, "block_ids": list(blocks),
                                  "num_computed_tokens": computed, "num_scheduled_tokens": scheduled}
        if hybrid:
            fields["group_block_ids"] = [list(g) for g in groups]
        return fields

    reqs = [
        entry(new.req_id, True, False, new.block_ids, new.group_block_ids, new.num_computed_tokens,
              new.num_scheduled_tokens)
        for new in step.new_requests
    ] + [
        entry(cached.req_id, False, cached.resumed_from_preemption, cached.new_block_ids,
              cached.new_group_block_ids, cached.num_computed_tokens, cached.num_scheduled_tokens)
        for cached in step.cached_requests
    ]
    dump, load = [], []
    for req_id, meta in sorted(metadata.request_meta.items()):
        if meta.dump_block_ids:
            dump.append({"req": req_id, "block_ids": list(meta.dump_block_ids),
                         **({"group_block_ids": [list(g) for g in meta.dump_group_block_ids]} if hybrid else {})})
        if meta.load_block_ids:
            load.append({"req": req_id, "block_ids": list(meta.load_block_ids),
                         **({"group_block_ids": [list(g) for g in meta.load_group_block_ids]} if hybrid else {})})
    fields: dict[str, Any] = {"block_size": block_size}
    if hybrid:
        fields["sliding_window"] = list(sliding_windows)
    return {**fields, "reqs": reqs, "dump": dump, "load": load,
            "preempted": ids(step.preempted_req_ids), "finished": ids(step.finished_req_ids)}


def task_fields(task: Any) -> dict[str, Any]:
    """A pending dump task as logged: its id, request ids and block ids."""
    return {"task": task.task.task_id, "reqs": ids(task.request_ids), "blocks": list(task.block_ids)}
