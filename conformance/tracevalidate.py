"""Trace validation: does a real run's connector event log match a behaviour of the TLA+ model?

`validate(paths)` merges the logs (`tracelog.load_events`), writes an MC module holding the log as a
TLA+ sequence literal with the constants read from it, and has TLC search `spec/TraceDeferDump.tla`.
TLC reporting `TraceNotDoneInv` violated is the witness that a behaviour reproduces the whole log
with every state satisfying the model's safety invariants; any other outcome names the first event no
behaviour reaches, and why.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deferdump.conformance.tracelog import REFERENCE_FIELDS, LogEvent, load_events
from deferdump.reference.errors import DeferDumpError, UserError
from deferdump.tools.tlc.bridge import run_tlc
from deferdump.tools.tlc.output import Kind, Status
from deferdump.tools.tlc.specfiles import spec_dir
from deferdump.tools.tlc.values import Value, format_value

logger = logging.getLogger(__name__)

MC_MODULE = "MCTraceDeferDump"
NULL_BLOCK = 0  # vLLM's null block: a sliding-window position out of the window, not a block
# In this order: TLC reports the first invariant a state breaks, and the witness must come last.
SAFETY_INVARIANTS = ("TraceTypeInv", "NoOverwriteWhileDumpingInv", "NoUnexpectedReportInv",
                     "PreemptWaitsOnlyPreemptedInv", "NoWaitInWaitForSaveInv", "TraceReportOnceInv",
                     "TraceNoLoadIntoFreedBlockInv")
ACCEPTED_INV, WITNESS_INV = "TraceAcceptedInv", "TraceNotDoneInv"
# Before the search TLC evaluates every constant-level definition of every module, the instantiated
# DeferDump's too: DD!Symmetry is Permutations(Req) \cup Permutations(Block), with a log's hundreds of
# requests the bulk of the run (minutes of allocation and GC for a 1,000-event log). The trace module
# declares no SYMMETRY, so TLC 2.15's veto (one name: SpecProcessor skips its evaluation) is lossless.
# A validation run is short and evaluates the same few operators once per event: the C1 compiler alone
# (no C2 threads competing for the cores) halves the wall time, from 1,000 to 10,000 events.
JVM_ARGS = ("-Dtlc2.tool.impl.SpecProcessor.vetoed=DD!Symmetry", "-XX:TieredStopAtLevel=1")


class ValidationError(DeferDumpError):
    """TLC failed in a way that says nothing about the log (a bug in the model or the tool)."""


class BeyondModel(UserError):
    """A log of a run the trace model cannot express (e.g. more than two KV-cache groups)."""


class ValidationTimeout(UserError):
    """TLC did not finish within the time limit (the CLI: one line, exit 2; raise --timeout)."""


@dataclass
class Unmatched:
    """The first event no behaviour of the model reaches."""

    file: str
    seq: int
    event: str
    reason: str
    line: int = 0
    record: Mapping[str, Any] = field(default_factory=dict)
    state_before: Mapping[str, Value] = field(default_factory=dict)  # the model's state just before it

    def as_json(self) -> dict[str, Any]:
        return {"file": self.file, "seq": self.seq, "event": self.event, "reason": self.reason}


@dataclass
class ValidationResult:
    matched: bool
    events: int
    matched_events: int
    first_unmatched: Unmatched | None
    model_constants: dict[str, Any]
    seconds: float
    distinct_states: int | None = None

    def as_json(self) -> dict[str, Any]:
        """Exactly the object `deferdump validate --json` prints."""
        return {
            "matched": self.matched,
            "events": self.events,
            "matched_events": self.matched_events,
            "first_unmatched": None if self.first_unmatched is None else self.first_unmatched.as_json(),
            "model_constants": self.model_constants,
            "seconds": round(self.seconds, 3),
        }


# ------------------------------------------------------------------------------------ the module
def _s(text: str) -> str:
    return json.dumps(text)  # TLA+ string literals escape '"' and '\' as JSON does


def _set(items: Iterable[str]) -> str:
    return "{" + ", ".join(items) + "}"


def _seq(items: Iterable[str]) -> str:
    return "<<" + ", ".join(items) + ">>"


def _ints(values: Iterable[int]) -> str:
    return _seq(str(int(v)) for v in values)


def _strs(values: Iterable[str]) -> str:
    return _set(_s(v) for v in sorted(set(values)))


def _int_set(values: Iterable[int]) -> str:
    return _set(str(int(v)) for v in sorted(set(values)))


def event_literal(record: Mapping[str, Any]) -> str:
    """One log line as the TLA+ record TraceDeferDump reads."""
    name = record["event"]
    common = [f"event |-> {_s(name)}", f"step |-> {record['step']}", f"rank |-> {record['rank']}",
              f"role |-> {_s(record['role'])}"]
    if name == "build_connector_meta":
        reqs = _seq(
            f"[req |-> {_s(x['req'])}, new |-> {_b(x['new'])}, resumed |-> {_b(x['resumed'])}, "
            f"blocks |-> {_ints(x['block_ids'])}, sw |-> {_sw(x)}, computed |-> {x['num_computed_tokens']}, "
            f"scheduled |-> {x['num_scheduled_tokens']}]"
            for x in record["reqs"]
        )
        dump = _set(f"[req |-> {_s(d['req'])}, blocks |-> {_ints(d['block_ids'])}, sw |-> {_sw(d)}]"
                    for d in record["dump"])
        loads = _set(f"[req |-> {_s(d['req'])}, blocks |-> {_ints(d['block_ids'])}]" for d in record["load"])
        fields = [f"reqs |-> {reqs}", f"dump |-> {dump}", f"preempted |-> {_strs(record['preempted'])}",
                  f"finished |-> {_strs(record['finished'])}",
                  f"loading |-> {_strs(sorted({d['req'] for d in record['load']}))}", f"loads |-> {loads}"]
    elif name == "request_finished":
        fields = [f"req |-> {_s(record['req'])}", f"blocks |-> {_ints(record['block_ids'])}",
                  f"sw |-> {_sw(record)}", f"delayed |-> {_b(record['delayed'])}"]
    elif name == "update_connector_output":
        fields = [f"sending |-> {_strs(record['finished_sending'])}",
                  f"recving |-> {_strs(record['finished_recving'])}",
                  f"invalid |-> {_int_set(record.get('invalid_block_ids', []))}"]
    elif name == "handle_preemptions":
        fields = [f"preempted |-> {_strs(record['preempted'])}", f"waited |-> {_int_set(record['waited'])}"]
    elif name == "wait_for_save":
        submitted = _set(f"[id |-> {s['task']}, reqs |-> {_strs(s['reqs'])}, blocks |-> {_ints(s['blocks'])}]"
                         for s in record["submitted"])
        fields = [f"reaped |-> {_int_set(record['reaped'])}", f"submitted |-> {submitted}",
                  f"error |-> {_b(record['submit_error'] is not None)}",
                  f"skipped |-> {_strs(record.get('skipped_failed_loads', []))}"]
    elif name == "get_finished":
        fields = [f"finished |-> {_strs(record['finished_req_ids'])}", f"waited |-> {_int_set(record['waited'])}",
                  f"reported |-> {_strs(record['reported'])}",
                  f"recving |-> {_strs(record.get('reported_recving', []))}",
                  f"hasReceiving |-> {_b('receiving' in record)}",
                  f"receiving |-> {_strs(record.get('receiving', []))}"]
    elif name == "get_num_new_matched_tokens":
        fields = [f"req |-> {_s(record['req'])}", f"matched |-> {int(record['matched'] or 0)}",
                  f"async |-> {_b(record['load_async'])}"]
    elif name == "update_state_after_alloc":
        fields = [f"req |-> {_s(record['req'])}", f"blocks |-> {_ints(record['block_ids'])}",
                  f"external |-> {record['num_external_tokens']}"]
    elif name == "start_load_kv":
        loads = {(x["req"], tuple(x["block_ids"])) for x in record["loads"]}
        fields = [f"loads |-> {_set(f'[req |-> {_s(r)}, blocks |-> {_ints(b)}]' for r, b in sorted(loads))}"]
    elif name == "get_block_ids_with_load_errors":
        fields = [f"blocks |-> {_int_set(record['block_ids'])}"]
    else:  # shutdown
        fields = [f"waited |-> {_int_set(record['waited'])}"]
    return "[" + ", ".join(common + fields) + "]"


def _sw(item: Mapping[str, Any]) -> str:
    """The sliding-window group's block list of a logged request, slice or finish (<<>> with one group)."""
    groups = item.get("group_block_ids") or []
    return _ints(groups[0]) if groups else "<<>>"


def _b(value: bool) -> str:
    return "TRUE" if value else "FALSE"


# Events of the boundary log that the DeferDump trace model does not express (docs/trace-log.md).
_BEYOND_EVENTS = ("scribble",)
# The receive side (asynchronous loads), which the model reads with one KV-cache group only.
_RECEIVE_EVENTS = ("get_num_new_matched_tokens", "update_state_after_alloc", "start_load_kv",
                   "get_block_ids_with_load_errors")


def require_reference_log(events: Sequence[LogEvent]) -> None:
    """Refuse, in one line, a log the DeferDump trace model cannot read: a watching wrapper's log of another
    connector (its `connector` line, or lines without the reference connector's own fields), or events of
    paths the trace model does not express."""
    for event in events:
        record = event.record
        if event.event == "connector":
            raise BeyondModel(f"{event.file}:{event.line}: a watching wrapper's log of {record['inner']}: the "
                              "DeferDump model checks only the reference connector's own logs")
        if event.event in _BEYOND_EVENTS:
            raise BeyondModel(f"{event.file}:{event.line}: event {event.event}: the DeferDump trace model does "
                              "not express it")
        for field in REFERENCE_FIELDS.get(event.event, ()):
            if field not in record:
                raise BeyondModel(f"{event.file}:{event.line}: field {field}: missing; the DeferDump model needs "
                                  "the reference connector's own fields")
        if event.event == "start_load_kv" and "loads" not in record:
            raise BeyondModel(f"{event.file}:{event.line}: field loads: missing; the DeferDump model needs the "
                              "reference connector's own fields")
        if event.event in _RECEIVE_EVENTS and record.get("group_block_ids"):
            raise BeyondModel(f"{event.file}:{event.line}: event {event.event}: asynchronous loads on several "
                              "KV-cache groups; the DeferDump trace model expresses them with one group only")
        if event.event == "build_connector_meta" and record.get("sliding_window") and any(
                e.event in _RECEIVE_EVENTS for e in events):
            raise BeyondModel(f"{event.file}:{event.line}: asynchronous loads on several KV-cache groups; the "
                              "DeferDump trace model expresses them with one group only")


def model_constants(events: Sequence[LogEvent]) -> dict[str, Any]:
    """Requests, blocks, ranks and block size, read from the log."""
    reqs: set[str] = set()
    blocks: set[int] = set()
    ranks = {0}
    block_size = None
    windows: list[int | None] | None = None
    for event in events:
        r = event.record
        if r["role"] == "worker":
            ranks.add(r["rank"])
        if r["event"] == "build_connector_meta":
            block_size = block_size or r["block_size"]
            windows = r.get("sliding_window", []) if windows is None else windows
            for x in r["reqs"]:
                reqs.add(x["req"])
                blocks.update(x["block_ids"], *x.get("group_block_ids", []))
            for d in r["dump"] + r["load"]:
                reqs.add(d["req"])
                blocks.update(d["block_ids"], *d.get("group_block_ids", []))
            reqs.update(r["preempted"] + r["finished"])
        elif r["event"] in ("request_finished", "update_state_after_alloc", "get_num_new_matched_tokens"):
            reqs.add(r["req"])
            blocks.update(r.get("block_ids", []), *r.get("group_block_ids", []))
        elif r["event"] == "start_load_kv":
            for x in r.get("loads", []):
                reqs.add(x["req"])
                blocks.update(x["block_ids"])
        elif r["event"] == "update_connector_output":
            reqs.update(r["finished_sending"] + r["finished_recving"])
        elif r["event"] == "wait_for_save":
            for s in r["submitted"]:
                reqs.update(s["reqs"])
                blocks.update(s["blocks"])
        elif r["event"] in ("handle_preemptions",):
            reqs.update(r["preempted"])
        elif r["event"] == "get_finished":
            reqs.update(r["finished_req_ids"] + r["reported"] + r.get("reported_recving", []) + r.get("receiving", []))
    blocks.discard(NULL_BLOCK)
    windows = windows or []
    if len(windows) > 1 or None in windows:
        raise BeyondModel(f"{len(windows) + 1} KV-cache groups ({windows}): the trace model expresses one "
                          "full-attention group and at most one sliding-window group")
    constants: dict[str, Any] = {"requests": sorted(reqs), "blocks": len(blocks), "block_ids": sorted(blocks),
                                 "ranks": sorted(ranks), "block_size": block_size or 1}
    if windows:
        constants["sliding_window"] = windows[0]
    return constants


def generate_module(events: Sequence[LogEvent], constants: Mapping[str, Any]) -> tuple[str, str]:
    """(the MC module holding the log, its cfg)."""
    log = ",\n    ".join(event_literal(e.record) for e in events)
    module = "\n".join([
        f"---- MODULE {MC_MODULE} ----",
        "(* Generated by deferdump validate: one real run's merged connector event log. *)",
        "EXTENDS TraceDeferDump",
        f"GenLog == <<\n    {log}\n    >>" if events else "GenLog == <<>>",
        f"GenReq == {_strs(constants['requests'])}",
        f"GenBlock == {_int_set(constants['block_ids'])}",
        f"GenRank == {_int_set(constants['ranks'])}",
        f"GenBlockSize == {constants['block_size']}",
        f"GenWindow == {constants.get('sliding_window', 0)}",
        "====",
        "",
    ])
    cfg = "\n".join([
        "\\* Generated by deferdump validate.",
        "CONSTANTS",
        "    TraceLog <- GenLog",
        "    TraceReq <- GenReq",
        "    TraceBlock <- GenBlock",
        "    TraceRank <- GenRank",
        "    BlockSize <- GenBlockSize",
        "    Window <- GenWindow",
        "SPECIFICATION Spec",
        "INVARIANTS",
        *[f"    {name}" for name in (*SAFETY_INVARIANTS, ACCEPTED_INV, WITNESS_INV)],
        "",
    ])
    return module, cfg


# -------------------------------------------------------------------------------------- validate
def validate(paths: Iterable[Path | str], *, timeout: float | None = 600.0, workers: int = 1,
             keep_dir: Path | None = None) -> ValidationResult:
    """Validate one run's logs (files, or a directory of them) against the model with TLC.

    Bad input (unreadable file, schema break, logs of two runs) raises `TraceLogError` (a `UserError`).
    """
    started = time.perf_counter()
    events = load_events(paths)
    require_reference_log(events)
    constants = model_constants(events)
    module, cfg = generate_module(events, constants)
    result = run_tlc(
        spec_dir() / f"{MC_MODULE}.tla",
        f"{MC_MODULE}.cfg",
        workers=workers,
        timeout=timeout,
        extra_modules={MC_MODULE: module, f"{MC_MODULE}.cfg": cfg},
        keep_dir=keep_dir,
        heap="2g",
        jvm_args=JVM_ARGS,
    )
    public = {k: v for k, v in constants.items() if k != "block_ids"}
    seconds = time.perf_counter() - started
    if result.status is Status.VIOLATION and result.kind is Kind.INVARIANT and result.trace:
        last = result.trace[-1].values
        position = int(last["l"])
        if result.property == WITNESS_INV:
            return ValidationResult(True, len(events), len(events), None, public, seconds, result.distinct_states)
        if result.property == ACCEPTED_INV:
            event = events[position]
            unmatched = _unmatched(event, str(last["why"]), last)
            return ValidationResult(False, len(events), position, unmatched, public, seconds, result.distinct_states)
        # a safety invariant broken by the event just applied
        event = events[position - 1]
        before = result.trace[-2].values if len(result.trace) > 1 else last
        reason = f"{result.property} violated: {_INVARIANT_WORDS.get(result.property or '', '')}".rstrip(": ")
        return ValidationResult(False, len(events), position - 1, _unmatched(event, reason, before), public,
                                seconds, result.distinct_states)
    if result.status is Status.VIOLATION and result.kind is Kind.DEADLOCK and result.trace:
        last = result.trace[-1].values
        position = int(last["l"])
        event = events[position]
        return ValidationResult(False, len(events), position,
                                _unmatched(event, "no action of the model takes this event", last),
                                public, seconds, result.distinct_states)
    if result.kind is Kind.TIMEOUT:
        raise ValidationTimeout(f"TLC did not finish validating {len(events)} events within {timeout} s (--timeout)")
    raise ValidationError(
        f"TLC did not settle the log ({result.status.value}, {result.kind.value if result.kind else '-'}): "
        f"{result.message or 'no message'}"
    )


_INVARIANT_WORDS = {
    "NoOverwriteWhileDumpingInv": "the forward wrote a block that a still-running dump task reads",
    "NoUnexpectedReportInv": "finished_sending reached the scheduler for a request whose free was not delayed",
    "PreemptWaitsOnlyPreemptedInv": "handle_preemptions waited a task of no preempted request",
    "NoWaitInWaitForSaveInv": "wait_for_save waited a still-running task",
    "TraceReportOnceInv": "a rank reported a request twice",
    "TraceNoLoadIntoFreedBlockInv": "an asynchronous load still running writes a block its request no longer holds",
    "TraceTypeInv": "a value outside the model's types",
}


def _unmatched(event: LogEvent, reason: str, state: Mapping[str, Value]) -> Unmatched:
    return Unmatched(event.file, event.seq, event.event, reason, event.line, event.record, state)


def render_state(state: Mapping[str, Value]) -> list[str]:
    """The model's state as lines, one per variable (`l` and `why` left out)."""
    return [f"{name} = {format_value(value)}" for name, value in sorted(state.items()) if name not in ("l", "why")]
