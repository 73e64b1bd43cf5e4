"""Reading the connector's event logs (docs/trace-log.md): the JSON Schema, loading, the engine-order merge.

The adapter (`deferdump.reference.vllm`, `trace_log` key) writes one NDJSON file per connector instance
and process. `load_events` checks every line against `SCHEMA` and reports the first bad one as one line
naming file, line and field (`TraceLogError`, a `UserError`); `merge` orders the processes' events the
way the engine ran them.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from deferdump.reference.errors import UserError

_IDS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
_BLOCKS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_TASKS = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
# Two or more KV-cache groups (a hybrid model): the other groups' block lists, in the connector's group
# order after the full-attention group's `block_ids` (0 is vLLM's null block: a position out of a window).
_GROUPS = {"type": "array", "items": _BLOCKS}
_SLICES = {
    "type": "array",
    "items": {"type": "object", "required": ["req", "block_ids"],
              "properties": {"req": {"type": "string"}, "block_ids": _BLOCKS, "group_block_ids": _GROUPS}},
}
_EVENTS: dict[str, dict[str, Any]] = {
    # The first line of each file a watching wrapper writes (`deferdump watch`): which connector it wraps.
    "connector": {
        "required": ["inner", "hma", "scribble"],
        "properties": {"inner": {"type": "string"}, "hma": {"type": "boolean"}, "scribble": {"type": "boolean"}},
    },
    "build_connector_meta": {
        # `dump` and `load` are the reference connector's own slices: a wrapper around another connector
        # cannot see them, and leaves them out.
        "required": ["block_size", "reqs", "preempted", "finished"],
        "properties": {
            "role": {"const": "scheduler"},
            "block_size": {"type": "integer", "minimum": 1},
            "sliding_window": {"type": "array", "items": {"type": ["integer", "null"], "minimum": 1}},
            "reqs": {"type": "array", "items": {
                "type": "object",
                "required": ["req", "new", "resumed", "block_ids", "num_computed_tokens", "num_scheduled_tokens"],
                "properties": {
                    "req": {"type": "string"}, "new": {"type": "boolean"}, "resumed": {"type": "boolean"},
                    "block_ids": _BLOCKS, "num_computed_tokens": {"type": "integer", "minimum": 0},
                    "num_scheduled_tokens": {"type": "integer", "minimum": 0},
                    "group_block_ids": _GROUPS,
                }}},
            "dump": _SLICES, "load": _SLICES, "preempted": _IDS, "finished": _IDS,
        },
    },
    "get_num_new_matched_tokens": {
        "required": ["req", "num_computed_tokens", "matched", "load_async"],
        "properties": {"role": {"const": "scheduler"}, "req": {"type": "string"},
                       "num_computed_tokens": {"type": "integer", "minimum": 0},
                       "matched": {"type": ["integer", "null"], "minimum": 0}, "load_async": {"type": "boolean"}},
    },
    "update_state_after_alloc": {
        "required": ["req", "block_ids", "num_external_tokens"],
        "properties": {"role": {"const": "scheduler"}, "req": {"type": "string"}, "block_ids": _BLOCKS,
                       "group_block_ids": _GROUPS, "num_external_tokens": {"type": "integer", "minimum": 0}},
    },
    "request_finished": {
        "required": ["req", "block_ids", "delayed"],
        "properties": {"role": {"const": "scheduler"}, "req": {"type": "string"}, "block_ids": _BLOCKS,
                       "group_block_ids": _GROUPS, "delayed": {"type": "boolean"}},
    },
    "update_connector_output": {
        "required": ["finished_sending", "finished_recving"],
        "properties": {"role": {"const": "scheduler"}, "finished_sending": _IDS, "finished_recving": _IDS,
                       "invalid_block_ids": _BLOCKS},
    },
    "handle_preemptions": {
        "required": ["preempted"],
        "properties": {"role": {"const": "worker"}, "preempted": _IDS, "waited": _TASKS},
    },
    "scribble": {
        "required": ["block_ids"],
        "properties": {"role": {"const": "worker"}, "block_ids": _BLOCKS},
    },
    "start_load_kv": {
        "required": [],
        "properties": {"role": {"const": "worker"}, "loads": {"type": "array", "items": {
            "type": "object", "required": ["req", "block_ids", "task"],
            "properties": {"req": {"type": "string"}, "block_ids": _BLOCKS, "task": {"type": "integer"}}}}},
    },
    "wait_for_save": {
        "required": [],
        "properties": {
            "role": {"const": "worker"}, "reaped": _TASKS,
            "submitted": {"type": "array", "items": {
                "type": "object", "required": ["task", "reqs", "blocks"],
                "properties": {"task": {"type": "integer"}, "reqs": _IDS, "blocks": _BLOCKS}}},
            "submit_error": {"type": ["string", "null"]},
            "skipped_failed_loads": _IDS,
        },
    },
    "get_finished": {
        "required": ["finished_req_ids", "reported"],
        "properties": {"role": {"const": "worker"}, "finished_req_ids": _IDS, "waited": _TASKS, "reported": _IDS,
                       "reported_recving": _IDS, "receiving": _IDS},
    },
    "get_block_ids_with_load_errors": {
        "required": ["block_ids"],
        "properties": {"role": {"const": "worker"}, "block_ids": _BLOCKS},
    },
    "shutdown": {"required": ["waited"], "properties": {"waited": _TASKS}},
}

#: Fields only the reference connector's adapter writes (its own dumps, loads and store tasks). The
#: DeferDump trace model needs them; a log without them comes from another connector's boundary.
REFERENCE_FIELDS: dict[str, tuple[str, ...]] = {
    "build_connector_meta": ("dump", "load"),
    "handle_preemptions": ("waited",),
    "wait_for_save": ("reaped", "submitted", "submit_error"),
    "get_finished": ("waited",),
}

#: The JSON Schema of one log line (draft 2020-12).
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://deferdump.invalid/trace-log-line.json",
    "title": "deferdump connector event log line",
    "type": "object",
    "required": ["seq", "step", "role", "rank", "engine", "event"],
    "properties": {
        "seq": {"type": "integer", "minimum": 0},
        "step": {"type": "integer", "minimum": 0},
        "role": {"enum": ["scheduler", "worker"]},
        "rank": {"type": "integer", "minimum": 0},
        "engine": {"type": "string"},
        "event": {"enum": sorted(_EVENTS)},
    },
    "allOf": [
        {"if": {"properties": {"event": {"const": name}}, "required": ["event"]}, "then": body}
        for name, body in _EVENTS.items()
    ],
}

_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


class TraceLogError(UserError):
    """A log file that cannot be read or breaks the schema (one line: file, line, field)."""


@dataclass(frozen=True)
class LogEvent:
    """One line of one file: where it came from and the object it holds."""

    file: str
    line: int  # 1-based
    record: dict[str, Any]

    @property
    def event(self) -> str:
        return str(self.record["event"])

    @property
    def seq(self) -> int:
        return int(self.record["seq"])


def _field(error: jsonschema.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return f"{path}.{missing}".lstrip(".") if path else missing
    return path or "(line)"


def check_line(record: Any, file: str, line: int) -> None:
    """Raise `TraceLogError` naming file, line and field when `record` breaks the schema."""
    error = jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(record))
    if error is not None:
        raise TraceLogError(f"{file}:{line}: field {_field(error)}: {error.message}")


def read_file(path: Path) -> list[LogEvent]:
    """Every line of one log file, checked; `seq` must run 0, 1, 2, ... (a gap means a lost line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceLogError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceLogError(f"{path}: not UTF-8 text: {exc.reason}") from None
    events: list[LogEvent] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceLogError(f"{path}:{number}: not JSON: {exc.msg}") from None
        check_line(record, str(path), number)
        if record["seq"] != len(events):
            raise TraceLogError(f"{path}:{number}: field seq: is {record['seq']}, expected {len(events)}")
        events.append(LogEvent(str(path), number, record))
    if not events:
        raise TraceLogError(f"{path}: empty log")
    return events


def log_files(paths: Iterable[Path | str]) -> list[Path]:
    """PATHs as files: a directory stands for the `*.ndjson` files in it."""
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(path.glob("*.ndjson"))
            if not found:
                raise TraceLogError(f"{path}: no *.ndjson log in this directory")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise TraceLogError(f"{path}: no such file or directory")
    if not files:
        raise TraceLogError("no log file given")
    return files


# Within one engine step: the schedule, then the ranks' execution, then the output's processing. The
# scheduler's calls while it schedules step s+1 (matched tokens, allocations) carry step s, the number of
# schedules it has finished: they come after step s's output, before step s+1's metadata. A wrapper's
# `connector` line comes before everything.
_PHASE = {"connector": -1, "build_connector_meta": 0, "request_finished": 2, "update_connector_output": 2,
          "get_num_new_matched_tokens": 2, "update_state_after_alloc": 2}


def _order(event: LogEvent) -> tuple[int, int, int, int]:
    record = event.record
    if record["role"] == "scheduler":
        phase = 3 if event.event == "shutdown" else _PHASE[event.event]
        return record["step"], phase, 0, event.seq
    phase = 4 if event.event == "shutdown" else -1 if event.event == "connector" else 1
    return record["step"], phase, record["rank"], event.seq


def merge(files: Sequence[Sequence[LogEvent]]) -> list[LogEvent]:
    """The processes' events in engine order: by (step, phase, rank, seq).

    Phase: 0 the scheduler's `build_connector_meta` of the step, 1 the workers' calls for it, 2 the
    scheduler's processing of its output (and aborts before the next schedule), then the shutdowns.
    One file's order is kept (its `seq`). All files must come from one engine (one `engine` id), and
    one scheduler and one worker per rank.
    """
    engines = {events[0].record["engine"] for events in files}
    if len(engines) > 1:
        raise TraceLogError(f"logs of {len(engines)} engines ({', '.join(sorted(engines))}): validate one run at a time")
    seen: dict[tuple[str, int], str] = {}
    for events in files:
        first = events[0].record
        key = (first["role"], first["rank"] if first["role"] == "worker" else 0)
        if key in seen:
            raise TraceLogError(f"{events[0].file}: a second {key[0]} log for rank {key[1]} (first: {seen[key]})")
        seen[key] = events[0].file
        for event in events:
            if (event.record["role"], event.record["rank"]) != (first["role"], first["rank"]):
                raise TraceLogError(f"{event.file}:{event.line}: field role: one file holds one instance's events")
    merged = [event for events in files for event in events]
    merged.sort(key=_order)
    return merged


def load_events(paths: Iterable[Path | str]) -> list[LogEvent]:
    """Read, check and merge the logs of one run (files, or a directory holding them)."""
    return merge([read_file(path) for path in log_files(paths)])
