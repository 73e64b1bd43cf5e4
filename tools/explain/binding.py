"""The DeferDump model drawn as swimlanes, read from the spec's variable and action-record names.

Lanes: one per request (its scheduler state and blocks), one per KV block (owner, content and which
pending dump tasks read it; highlighted when rewritten), per rank the pending dump tasks (request sets,
blocks, event handles, tracked ids) and the connector calls of the step (waits, submits, reports), and
the scheduler (delayed frees, finished_sending, tracked ids). The evaluators describe, from the states,
the values that break each ``…Inv``/``…Prop`` of ``spec/DeferDump.tla``. Variable meanings: spec/README.md.
If the spec renames a variable or an action field, this module and the conformance driver's refinement
mapping (conformance/deferdump_driver.py) change with it.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from deferdump.tools.explain.timeline import (ActionLabel, Cell, LaneBinding, LaneGroup, Offence, generic_binding, lane_id,
                               natural_key, show, show_set)
from deferdump.tools.explain.trace import Step
from deferdump.tools.tlc.values import TlaFunction, TlaSet, Value, value_key

REQUESTS, BLOCKS, TASKS, CALLS, SCHEDULER = "Requests", "Blocks", "Dump tasks", "Connector calls", "Scheduler"
REQUIRED = frozenset({"reqState", "blocksOf", "pending"})

# --------------------------------------------------------------------------------------------
# Reading the state
# --------------------------------------------------------------------------------------------


def _get(mapping: Any, key: Value, default: Any = None) -> Any:
    try:
        return mapping[key] if isinstance(mapping, Mapping) and key in mapping else default
    except (KeyError, TypeError):
        return default


def _fn(step: Step, variable: str) -> Mapping[Value, Any]:
    value = step.values.get(variable)
    return value if isinstance(value, Mapping) else {}


def _set(step: Step, variable: str) -> TlaSet:
    """A set variable, kept a TlaSet: a plain frozenset would merge FALSE and 0 (Python's False == 0)."""
    value = step.values.get(variable)
    return TlaSet(value) if isinstance(value, Iterable) and not isinstance(value, (str, Mapping)) else TlaSet()


def _tasks(step: Step, rank: Value) -> list[Mapping[str, Any]]:
    tasks = _get(_fn(step, "pending"), rank, ())
    return sorted((t for t in tasks if isinstance(t, Mapping)), key=lambda t: _get(t, "id", 0))


def _owner(step: Step, block: Value) -> tuple[Value, int] | None:
    for req, blocks in _fn(step, "blocksOf").items():
        for position, held in enumerate(blocks or ()):
            if value_key(held) == value_key(block):  # held == block would take 0 for FALSE
                return req, position + 1
    return None


# --------------------------------------------------------------------------------------------
# Block contents, from the history of forward writes in the action records
# --------------------------------------------------------------------------------------------


def _writes(step: Step) -> Mapping[Value, tuple[Value, Value]]:
    """Block -> (request, prompt index) written by this step's forward (every rank writes the same).

    Keyed by :func:`value_key` while built (the last write wins), so blocks FALSE and 0 stay two blocks."""
    written: dict[Any, tuple[Value, tuple[Value, Value]]] = {}
    for rank in _get(_phase(step.action, "execute_model"), "ranks", {}):
        for call in _calls(step.action, rank):
            if call.get("name") == "forward":
                for write in (*_get(call, "writes", ()), *_get(call, "sw_writes", ())):  # both KV-cache groups
                    if isinstance(write, tuple) and len(write) == 3:
                        written[value_key(write[0])] = (write[0], (write[1], write[2]))
    return TlaFunction(written.values())


def version(steps: Sequence[Step], block: Value, i: int) -> tuple[int, tuple[Value, Value] | None]:
    """How many times ``block`` was written up to step i, and what the last write put there."""
    count, last = 0, None
    for step in steps[: i + 1]:
        write = _writes(step).get(block)
        if write is not None:
            count, last = count + 1, write
    return count, last


def content(write: tuple[Value, Value] | None) -> str:
    """A block's content as ``r1#2`` (request r1's prompt block 2), or ``empty``."""
    return "empty" if write is None else f"{show(write[0])}#{show(write[1])}"


def _same_task(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(_same(_get(a, f), _get(b, f)) for f in ("id", "reqs", "blocks", "layer"))


def _same(a: Any, b: Any) -> bool:
    """TLA+ equality (``FALSE`` is not ``0``); None for an absent field."""
    if a is None or b is None:
        return a is b
    return bool(value_key(a) == value_key(b))


def submitted_at(steps: Sequence[Step], rank: Value, task: Mapping[str, Any], i: int) -> int:
    """The step that submitted ``task`` (pending on ``rank`` at step i): the start of its pending run."""
    start = i
    while start > 0 and any(_same_task(t, task) for t in _tasks(steps[start - 1], rank)):
        start -= 1
    return start


def clobbered_blocks(steps: Sequence[Step], rank: Value, task: Mapping[str, Any], i: int) -> list[Value]:
    """Blocks of a running task rewritten since its submission (the spec's ``clobbered`` flag, explained)."""
    if _get(task, "status") != "running":
        return []
    since = submitted_at(steps, rank, task, i)
    blocks = sorted(_get(task, "blocks", ()), key=show)
    rewritten = [b for b in blocks if version(steps, b, i)[0] > version(steps, b, since)[0]]
    return rewritten or (blocks if _get(task, "clobbered") is True else [])


def overwrites(steps: Sequence[Step], i: int) -> list[tuple[Value, Mapping[str, Any], Value]]:
    """(rank, task, block) for each block that step i's forward wrote while ``task`` still read it: the task
    was pending and running before the step and handle_preemptions did not wait it first. The task may
    be waited later in the same step (get_finished), so the event need not show in any state."""
    if i == 0:
        return []
    events = []
    for rank in _get(_phase(steps[i].action, "execute_model"), "ranks", {}):
        waited, written = TlaSet(), TlaSet()  # keyed sets: FALSE and 0 stay two values
        for call in _calls(steps[i].action, rank):
            if call.get("name") == "handle_preemptions":
                waited |= TlaSet(_get(record, "task") for record in _get(call, "waited", ()))
            if call.get("name") == "forward":
                written = TlaSet(w[0] for w in (*_get(call, "writes", ()), *_get(call, "sw_writes", ()))
                                 if isinstance(w, tuple) and w)
                break
        for task in _tasks(steps[i - 1], rank):
            if _get(task, "status") == "running" and _get(task, "id") not in waited:
                events.extend((rank, task, block) for block in sorted(TlaSet(_get(task, "blocks", ())) & written,
                                                                      key=show))
    return events


def _running_readers(step: Step, block: Value) -> list[tuple[Value, Mapping[str, Any]]]:
    """(rank, task) for every still-running pending task that reads ``block``."""
    return [(rank, task) for rank in _fn(step, "pending") for task in _tasks(step, rank)
            if _get(task, "status") == "running" and block in _get(task, "blocks", ())]


def _phase(action: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The action's record of one engine-loop phase: the action itself, or one of an ``engine_step``'s
    fused ``phases`` (schedule, execute_model, update_from_output); empty when the step has no such phase."""
    records = _get(action, "phases", ()) if action.get("name") == "engine_step" else (action,)
    return next((r for r in records if isinstance(r, Mapping) and r.get("name") == name), {})


def _calls(action: Mapping[str, Any], rank: Value) -> list[Mapping[str, Any]]:
    """Rank ``rank``'s connector calls in this step's execute_model, in vLLM's order."""
    return [c for c in _get(_get(_phase(action, "execute_model"), "ranks", {}), rank, ()) if isinstance(c, Mapping)]




# --------------------------------------------------------------------------------------------
# Lanes
# --------------------------------------------------------------------------------------------

TONES = {
    "waiting": "request waiting", "running": "request running", "preempted": "request preempted",
    "delayed": "finished, free delayed until finished_sending", "done": "freed",
    "reused": "block given to another request while a dump reads it",
    "rewritten": "block rewritten in this step", "clobbered": "a running dump reads a rewritten block",
    "busy": "dump tasks still running", "alert": "a call that breaks the protocol",
}


def _request_cell(req: Value, steps: Sequence[Step], i: int) -> Cell:
    step = steps[i]
    state = str(_get(_fn(step, "reqState"), req, "?"))
    blocks = _get(_fn(step, "blocksOf"), req, ())
    lines = [state]
    if blocks:
        lines.append("blocks " + " ".join(show(b) for b in blocks))
    if req in _set(step, "schedAsync"):
        lines.append("dump tracked")
    dumping = sorted({str(_get(t, "id")) for rank in _fn(step, "pending") for t in _tasks(step, rank)
                      if _get(t, "status") == "running" and req in _get(t, "reqs", ())}, key=natural_key)
    if dumping:
        lines.append(f"dump pending: task {' '.join(dumping)}")
    return Cell(tuple(lines), tone=state, hint=f"request {show(req)}: {state}")


def _block_cell(block: Value, steps: Sequence[Step], i: int) -> Cell:
    step = steps[i]
    owner = _owner(step, block)
    count, write = version(steps, block, i)
    lines = [f"owner {show(owner[0])}" if owner else "free",
             f"v{count}: {content(write)}" if count else "empty"]
    tone = "owned" if owner else "free"
    before, previous = version(steps, block, i - 1) if i else (0, None)
    under: dict[str, list[str]] = {}
    for rank, task, _ in (event for event in overwrites(steps, i) if event[2] == block):
        under.setdefault(str(_get(task, "id")), []).append(show(rank))
    if count > before and before:
        lines.append(f"REWRITTEN (was v{before}: {content(previous)})")
        tone = "rewritten"
    for task_id, ranks in under.items():
        lines.append(f"  under running dump task {task_id} (rank{'s' if len(ranks) > 1 else ''} {' '.join(ranks)})!")
        tone = "clobbered"
    readers: dict[str, list[str]] = {}
    for rank, task in _running_readers(step, block):
        task_id = str(_get(task, "id"))
        clobbered = block in clobbered_blocks(steps, rank, task, i)
        if owner and write is not None and owner[0] != write[0] and not clobbered:
            lines.append(f"given to {show(owner[0])} while task {task_id} reads {content(write)}")
            tone = "reused"
        if clobbered and task_id not in under:
            old = version(steps, block, submitted_at(steps, rank, task, i))
            lines.append(f"rank {show(rank)} task {task_id} still reads v{old[0]}: {content(old[1])}!")
            tone = "clobbered"
        elif not clobbered:
            readers.setdefault(task_id, []).append(show(rank))
    for task_id, ranks in readers.items():
        lines.append(f"read by task {task_id} (rank{'s' if len(ranks) > 1 else ''} {' '.join(ranks)})")
    return Cell(tuple(lines), tone=tone, hint=f"block {show(block)}")


def _tasks_cell(rank: Value, steps: Sequence[Step], i: int) -> Cell:
    step = steps[i]
    lines: list[str] = []
    running = False
    for task in _tasks(step, rank):
        status = str(_get(task, "status", "?"))
        running = running or status == "running"
        layer = _get(task, "layer", 0)
        lines.append(f"task {_get(task, 'id')} {status}" + (f" L{layer}" if layer else "")
                     + (" CLOBBERED" if clobbered_blocks(steps, rank, task, i) else ""))
        lines.append(f"  reqs {show_set(_get(task, 'reqs', ()))}")
        lines.append(f"  reads {show_set(_get(task, 'blocks', ()))} · ev {_get(task, 'event')}")
    if not lines:
        lines.append("no pending tasks")
    lines.append(f"tracked {show_set(_get(_fn(step, 'workerAsync'), rank, ()))}")
    lines.append(f"live events {show_set(_get(_fn(step, 'live'), rank, ()))}")
    bad = _get(_fn(step, "releaseErrors"), rank, ())
    if bad:
        lines.append(f"released twice: ev {show_set(bad)}")
    return Cell(tuple(lines), tone="busy" if running else "", hint=f"rank {show(rank)}: _pending_dump_tasks")


def _waited(records: Iterable[Mapping[str, Any]]) -> str:
    records = list(records)
    if not records:
        return "nothing"
    return " ".join(f"task {_get(r, 'task')}" + (" (blocking)" if _get(r, "blocking") else "")
                    + (" raised" if _get(r, "outcome") == "error" else "")
                    for r in sorted(records, key=lambda r: _get(r, "task", 0)))


def _call_lines(call: Mapping[str, Any]) -> list[str]:
    name = call.get("name")
    if name == "handle_preemptions":
        preempted = _get(call, "preempted_req_ids", ())
        return [f"handle_preemptions({show_set(preempted)}): waited {_waited(_get(call, 'waited', ()))}"] \
            if preempted else []
    if name == "forward":
        writes = sorted((*_get(call, "writes", ()), *_get(call, "sw_writes", ())), key=show)
        return ["forward: " + ", ".join(f"{show(w[0])}←{show(w[1])}#{show(w[2])}" for w in writes)] if writes else []
    if name == "save_kv_layer" and _get(call, "saved"):
        return [f"save_kv_layer L{_get(call, 'layer')}: saved {show_set(_get(call, 'saved', ()))} before returning"]
    if name == "save_kv_layer":
        submitted = _get(call, "submitted", 0)
        return [f"save_kv_layer L{_get(call, 'layer')}: " + ("submit FAILED" if _get(call, "submit_error")
                                                              else f"submit task {submitted}")]
    if name == "wait_for_save":
        parts = []
        if _get(call, "saved"):
            parts.append(f"saved {show_set(_get(call, 'saved', ()))} before returning")
        if _get(call, "reaped"):
            parts.append(f"reaped {_waited(_get(call, 'reaped', ()))}")
        if _get(call, "check_error"):
            parts.append("check raised")
        if _get(call, "tracked"):
            parts.append(f"track {show_set(_get(call, 'tracked', ()))}")
        if _get(call, "submit_error"):
            parts.append("submit FAILED")
        elif _get(call, "submitted"):
            parts.append(f"submit task {_get(call, 'submitted')}")
        if _get(call, "blocked"):
            parts.append(f"BLOCKED on task {show_set(_get(call, 'blocked', ()))}")
        return ["wait_for_save: " + "; ".join(parts)] if parts else []
    if name == "get_finished":
        finished = _get(call, "finished_req_ids", ())
        sending = _get(call, "finished_sending", ())
        if not finished and not sending and not _get(call, "waited"):
            return []
        return [f"get_finished({show_set(finished)}): waited {_waited(_get(call, 'waited', ()))}"
                f" → finished_sending {show_set(sending)}"]
    return [f"{name}: " + ", ".join(f"{k}={show(v)}" for k, v in call.items() if k != "name")]


def _completions(action: Mapping[str, Any]) -> dict[Value, str]:
    """Rank -> the task ids a ``task_complete`` finished there (one task, or every rank in lockstep)."""
    if action.get("name") != "task_complete":
        return {}
    tasks = _get(action, "tasks")
    if isinstance(tasks, Mapping):
        return {rank: show_set(ids) for rank, ids in tasks.items()}
    return {_get(action, "rank"): str(_get(action, "task", "?"))}


def _calls_cell(rank: Value, steps: Sequence[Step], i: int) -> Cell:
    action = steps[i].action
    lines: list[str] = []
    for call in _calls(action, rank):
        lines.extend(_call_lines(call))
    done = _completions(action)
    if rank in done:
        lines.append(f"store: task {done[rank]} completes ({_get(action, 'outcome')})")
    blocked = any(_get(c, "blocked") for c in _calls(action, rank))
    return Cell(tuple(lines) or ("—",), tone="alert" if blocked else "", hint=f"rank {show(rank)}: calls")


_SCHEDULER_LANES = ("delayed frees", "finished_sending", "tracked (_async_dump_req_ids)", "finished_req_ids")


def _scheduler_cell(lane: Value, steps: Sequence[Step], i: int) -> Cell:
    step = steps[i]
    states = _fn(step, "reqState")
    if lane == "delayed frees":
        delayed = [r for r, s in states.items() if s == "delayed"]
        return Cell((f"holding {show_set(delayed)}",) if delayed else ("—",), tone="delayed" if delayed else "")
    if lane == "finished_sending":
        update = _phase(step.action, "update_from_output")
        if not update:
            return Cell(("—",))
        calls = list(_get(update, "calls", ()))
        xfer = next((c for c in calls if _get(c, "name") == "_update_from_kv_xfer_finished"), {})
        emitted, unexpected = _get(xfer, "finished_sending", ()), _get(xfer, "unexpected", ())
        lines = [f"freed {show_set(TlaSet(emitted) - TlaSet(unexpected))}"] if emitted else ["—"]
        if unexpected:
            lines.append(f"UNEXPECTED {show_set(unexpected)} (assert)")
        return Cell(tuple(lines), tone="alert" if unexpected else "")
    if lane == "tracked (_async_dump_req_ids)":
        return Cell((show_set(_set(step, "schedAsync")),))
    return Cell((show_set(_set(step, "finishedIds")),))


def _blocks(step: Step) -> Iterable[Value]:
    """Blocks held, read by a task, or written in this step (the spec's Block set is not a variable)."""
    held = TlaSet(b for blocks in _fn(step, "blocksOf").values() for b in blocks or ())
    read = TlaSet(b for rank in _fn(step, "pending") for t in _tasks(step, rank) for b in _get(t, "blocks", ()))
    return held | read | TlaSet(_writes(step)) | _parked_blocks(step)


def _parked(step: Step) -> list[Mapping[str, Any]]:
    """The deferred frees (the spec's `parked`, move "defer_block_free")."""
    return [e for e in _set(step, "parked") if isinstance(e, Mapping)]


def _parked_blocks(step: Step, by: str | None = None) -> TlaSet:
    return TlaSet(b for e in _parked(step) if by is None or _get(e, "by") == by for b in _get(e, "blocks", ()))


def _ranks(step: Step) -> Iterable[Value]:
    return _fn(step, "pending").keys()


def _rank_label(rank: Value) -> str:
    return f"rank {show(rank)}"


GROUPS = (
    LaneGroup(REQUESTS, keys=lambda s: _fn(s, "reqState").keys(), label=show, cell=_request_cell),
    LaneGroup(BLOCKS, keys=_blocks, label=show, cell=_block_cell),
    LaneGroup(TASKS, keys=_ranks, label=_rank_label, cell=_tasks_cell),
    LaneGroup(CALLS, keys=_ranks, label=_rank_label, cell=_calls_cell),
    LaneGroup(SCHEDULER, keys=lambda s: _SCHEDULER_LANES, label=str, cell=_scheduler_cell),
)

# --------------------------------------------------------------------------------------------
# Column labels
# --------------------------------------------------------------------------------------------


def _schedule_params(record: Mapping[str, Any]) -> list[str]:
    params = []
    allocated = sorted(_get(record, "allocated", ()), key=lambda a: show(_get(a, "block")))
    if allocated:
        params.append("allocate " + ", ".join(f"{show(_get(a, 'block'))}→{show(_get(a, 'req'))}#{_get(a, 'idx')}"
                                              for a in allocated))
    if _get(record, "preempted"):
        params.append(f"PREEMPT {show_set(_get(record, 'preempted', ()))} (blocks freed)")
    for call in _get(record, "calls", ()):
        if _get(call, "name") == "build_connector_meta":
            dump = sorted(_get(call, "dump", ()), key=lambda d: show(_get(d, "block")))
            parts = []
            if dump:
                parts.append("dump " + ", ".join(f"{show(_get(d, 'req'))}:{show(_get(d, 'block'))}" for d in dump))
            if _get(call, "tracked"):
                parts.append(f"track {show_set(_get(call, 'tracked', ()))}")
            if _get(call, "finished_req_ids"):
                parts.append(f"finished_req_ids {show_set(_get(call, 'finished_req_ids', ()))}")
            params.append("build_connector_meta: " + ("; ".join(parts) if parts else "nothing to dump"))
    return params


def _execute_params(record: Mapping[str, Any]) -> list[str]:
    params = []
    ranks = _get(record, "ranks", {})
    first = next(iter(ranks.values()), ()) if isinstance(ranks, Mapping) else ()
    for call in first:
        if _get(call, "name") == "handle_preemptions" and _get(call, "preempted_req_ids"):
            params.append(f"preempted_req_ids {show_set(_get(call, 'preempted_req_ids', ()))}")
        if _get(call, "name") == "get_finished" and _get(call, "finished_req_ids"):
            params.append(f"finished_req_ids {show_set(_get(call, 'finished_req_ids', ()))}")
    params.append(f"on {len(ranks)} rank{'s' if len(ranks) != 1 else ''}")
    return params


def _update_params(record: Mapping[str, Any]) -> list[str]:
    params = []
    if _get(record, "finished"):
        params.append(f"finish {show_set(_get(record, 'finished', ()))}")
    for call in _get(record, "calls", ()):
        if _get(call, "name") == "request_finished" and _get(call, "reqs"):
            params.append(f"request_finished → delay {show_set(_get(call, 'delayed', ()))}")
        if _get(call, "name") == "_update_from_kv_xfer_finished" and _get(call, "finished_sending"):
            params.append(f"finished_sending {show_set(_get(call, 'finished_sending', ()))}")
    return params


_PHASE_PARAMS = {"schedule": _schedule_params, "execute_model": _execute_params,
                 "update_from_output": _update_params}


def describe_action(action: Mapping[str, Any]) -> ActionLabel:
    """The step's vLLM/UCM method or environment event, with its parameters in words."""
    name = str(action.get("name", "step"))
    params: list[str] = []
    if name in _PHASE_PARAMS:
        params = _PHASE_PARAMS[name](action)
    elif name == "engine_step":  # sync scheduling fused into one step: each phase, then its parameters
        for phase in _get(action, "phases", ()):
            phase_name = str(_get(phase, "name", "?"))
            params.append(f"{phase_name}:")
            params.extend("  " + line for line in _PHASE_PARAMS.get(phase_name, lambda _: [])(phase))
    elif name == "task_complete":
        params = [f"rank {show(rank)} task {ids}: {_get(action, 'outcome')}"
                  for rank, ids in _completions(action).items()]
    elif name != "init":
        params = [f"{k}: {show(v)}" for k, v in action.items() if k != "name"]
    return ActionLabel(name, tuple(params))


# --------------------------------------------------------------------------------------------
# Offending values of the spec's properties
# --------------------------------------------------------------------------------------------


def _when(steps: Sequence[Step], until: int, predicate: Any) -> int | None:
    """The last step <= until that starts a run of steps satisfying predicate up to ``until``."""
    start = None
    for index in range(until, -1, -1):
        if not predicate(steps[index]):
            break
        start = index
    return start


def no_overwrite_while_dumping(steps: Sequence[Step], i: int) -> list[Offence]:
    """A forward rewrote a block that a still-running dump task read (the spec's ``dumpOverwrites`` history
    flag when the trace has it: the step that set it; otherwise the overwrites of step i)."""
    flagged = "dumpOverwrites" in steps[i].values
    k = _first_true(steps, i, "dumpOverwrites") if flagged else i
    if k is None:
        return []
    offences = []
    for rank, task, block in overwrites(steps, k):
        submitted = submitted_at(steps, rank, task, k - 1)
        then, now = version(steps, block, k - 1)[1], version(steps, block, k)[1]
        owner = _owner(steps[k], block)
        victim = then[0] if then is not None else None
        text = (f"Block {show(block)} was rewritten while its dump was still pending: in step {k} the forward "
                f"wrote {content(now)} into {show(block)} while dump task {_get(task, 'id')} on rank {show(rank)} "
                f"(requests {show_set(_get(task, 'reqs', ()))}, submitted in step {submitted}) was still running "
                f"and reading it for {content(then)}" + (f" ({show(owner[0])} was given the block)." if owner else "."))
        lanes = {lane_id(BLOCKS, show(block)), lane_id(TASKS, _rank_label(rank)), lane_id(CALLS, _rank_label(rank))}
        if victim is not None:
            lanes.add(lane_id(REQUESTS, show(victim)))
            text += _preemption_story(steps, k, rank, victim, _get(task, "id"))
        if owner is not None:
            lanes.add(lane_id(REQUESTS, show(owner[0])))
        text += f" The dump would store {content(now)}'s data under {content(then)}'s key."
        offences.append(Offence(text, frozenset(lanes)))
    if flagged and not offences:
        offences.append(Offence(f"step {k}: a forward rewrote a block that a still-running dump task read"))
    return offences


def _preemption_story(steps: Sequence[Step], i: int, rank: Value, victim: Value, task: Value) -> str:
    """How a preempted request's block got reused: when it was preempted and what handle_preemptions waited."""
    states = [_get(_fn(s, "reqState"), victim) for s in steps[: i + 1]]
    if states[-1] == "done":
        freed = _when(steps, i, lambda s: _get(_fn(s, "reqState"), victim) == "done")
        update = _phase(steps[freed or 0].action, "update_from_output")
        calls = {_get(c, "name"): c for c in _get(update, "calls", ())}
        why = ""
        if victim in _get(calls.get("_update_from_kv_xfer_finished", {}), "finished_sending", ()):
            why = ": finished_sending reported it before its dump ended"
        elif victim in _get(calls.get("request_finished", {}), "reqs", ()):
            why = ": request_finished did not delay the free"
        return f" {show(victim)} finished and its blocks were freed in step {freed}{why}."
    if states[-1] != "preempted":
        return f" {show(victim)} is {states[-1]}."
    since = _when(steps, i, lambda s: _get(_fn(s, "reqState"), victim) == "preempted")
    text = f" {show(victim)} was preempted in step {since} and its blocks were freed"
    waits = [(k, call) for k in range(since or 0, i + 1) for r, call in _each_call(steps, k, "handle_preemptions")
             if r == rank and victim in _get(call, "preempted_req_ids", ())]
    if waits:
        k, call = waits[-1]
        text += (f"; handle_preemptions({show_set(_get(call, 'preempted_req_ids', ()))}) in step {k} waited "
                 f"{_waited(_get(call, 'waited', ()))}, not task {task}, before the forward reused the block.")
    else:
        text += "; no handle_preemptions waited its task before the block was reused."
    return text


def _first_true(steps: Sequence[Step], i: int, variable: str) -> int | None:
    """The step where a sticky history flag of the spec first became true (None: false at step i)."""
    if steps[i].values.get(variable) is not True:
        return None
    return next(k for k in range(i + 1) if steps[k].values.get(variable) is True)


def no_unexpected_report(steps: Sequence[Step], i: int) -> list[Offence]:
    """finished_sending for a request whose free was not delayed (from the action, or the history set)."""
    unexpected = TlaSet()
    for call in _get(_phase(steps[i].action, "update_from_output"), "calls", ()):
        unexpected |= TlaSet(_get(call, "unexpected", ()) or ())
    unexpected |= _set(steps[i], "unexpectedReports")
    offences = []
    for req in sorted(unexpected, key=show):
        when = next((k for k in range(i + 1) if req in _set(steps[k], "unexpectedReports")), i)
        state = _get(_fn(steps[when - 1] if when else steps[when], "reqState"), req)
        offences.append(Offence(
            f"step {when}: finished_sending reports {show(req)}, whose free was not delayed (it was {state}): "
            "vLLM's `assert req_id in self.requests` fails",
            frozenset({lane_id(SCHEDULER, "finished_sending"), lane_id(REQUESTS, show(req))})))
    return offences


def _seen_finished(step: Step, req: Value) -> bool:
    if _get(_fn(step, "reqState"), req) not in ("delayed", "done") or req in _set(step, "finishedIds"):
        return False
    inflight = step.values.get("inflight") or ()
    executed = step.values.get("executed", 0)
    return all(req not in _get(meta, "finished", ()) for meta in list(inflight)[executed:])


def report_once(steps: Sequence[Step], i: int) -> list[Offence]:
    step = steps[i]
    offences = []
    for rank, per_req in _fn(step, "reported").items():
        for req, count in per_req.items():
            if count > 1:
                text = f"rank {show(rank)} reported {show(req)} in finished_sending {count} times"
            elif count == 1 and not _seen_finished(step, req):
                text = f"rank {show(rank)} reported {show(req)} before its connector was told {show(req)} finished"
            else:
                continue
            offences.append(Offence(text, frozenset({lane_id(CALLS, _rank_label(rank)),
                                                     lane_id(REQUESTS, show(req))})))
    return offences


def event_released_once(steps: Sequence[Step], i: int) -> list[Offence]:
    return [Offence(f"rank {show(rank)} released event handle(s) {show_set(bad)} that were not live "
                    "(a double destroy)", frozenset({lane_id(TASKS, _rank_label(rank))}))
            for rank, bad in _fn(steps[i], "releaseErrors").items() if bad]


def no_event_leak(steps: Sequence[Step], i: int) -> list[Offence]:
    step = steps[i]
    offences = []
    for rank, live in _fn(step, "live").items():
        owned = TlaSet(_get(task, "event") for task in _tasks(step, rank))
        leaked, missing = TlaSet(live) - owned, owned - TlaSet(live)
        if leaked:
            offences.append(Offence(f"rank {show(rank)}: event handle(s) {show_set(leaked)} still live with no "
                                    "pending task (leaked)", frozenset({lane_id(TASKS, _rank_label(rank))})))
        if missing:
            offences.append(Offence(f"rank {show(rank)}: pending task(s) hold released handle(s) "
                                    f"{show_set(missing)}", frozenset({lane_id(TASKS, _rank_label(rank))})))
    return offences


def _each_call(steps: Sequence[Step], i: int, name: str) -> Iterable[tuple[Value, Mapping[str, Any]]]:
    action = steps[i].action
    for rank in _get(_phase(action, "execute_model"), "ranks", {}):
        for call in _calls(action, rank):
            if call.get("name") == name:
                yield rank, call


def no_wait_in_wait_for_save(steps: Sequence[Step], i: int) -> list[Offence]:
    """A wait_for_save that waited a still-running task (its call record, or the spec's history flag)."""
    when = _first_true(steps, i, "blockingWaits")
    k = i if when is None else when
    offences = [Offence(f"step {k}: wait_for_save on rank {show(rank)} blocked on still-running task(s) "
                        f"{show_set(_get(call, 'blocked', ()))}; the PR promises it only submits",
                        frozenset({lane_id(CALLS, _rank_label(rank))}))
                for rank, call in _each_call(steps, k, "wait_for_save") if _get(call, "blocked")]
    if not offences and when is not None:
        offences.append(Offence(f"step {when}: a wait_for_save waited a still-running dump task"))
    return offences


def preempt_waits_only_preempted(steps: Sequence[Step], i: int) -> list[Offence]:
    """handle_preemptions waited a task of no preempted request (its call record, or the history flag)."""
    when = _first_true(steps, i, "preemptOverWaits")
    k = i if when is None else when
    offences = []
    for rank, call in _each_call(steps, k, "handle_preemptions"):
        preempted = TlaSet(_get(call, "preempted_req_ids", ()))
        for record in _get(call, "waited", ()):
            if not TlaSet(_get(record, "reqs", ())) & preempted:
                offences.append(Offence(
                    f"step {k}: handle_preemptions({show_set(preempted)}) on rank {show(rank)} waited task "
                    f"{_get(record, 'task')} of requests {show_set(_get(record, 'reqs', ()))}, none of them "
                    "preempted: a needless block of the step", frozenset({lane_id(CALLS, _rank_label(rank))})))
    if not offences and when is not None:
        offences.append(Offence(f"step {when}: a handle_preemptions waited a task of no preempted request"))
    return offences


def sched_tracks_unfinished(steps: Sequence[Step], i: int) -> list[Offence]:
    """A tracked id that outlived its request: request_finished never untracked it."""
    step = steps[i]
    states = _fn(step, "reqState")
    return [Offence(f"the scheduler still tracks {show(req)} although {show(req)} is {_get(states, req)}: "
                    "request_finished did not untrack it, so nothing ever will",
                    frozenset({lane_id(SCHEDULER, "tracked (_async_dump_req_ids)"), lane_id(REQUESTS, show(req))}))
            for req in _set(step, "schedAsync") if _get(states, req) not in ("waiting", "running", "preempted")]


def workers_track(steps: Sequence[Step], i: int) -> list[Offence]:
    """Once no unexecuted step still dumps a request, every rank tracks what the scheduler tracks."""
    step = steps[i]
    inflight = list(step.values.get("inflight") or ())
    dumping = TlaSet(_get(slice_, "req") for meta in inflight[step.values.get("executed", 0):]
                     for slice_ in _get(meta, "dump", ()))
    return [Offence(f"rank {show(rank)} does not track {show(req)}, which the scheduler tracks: it will never "
                    f"report {show(req)}, so the delayed free never comes",
                    frozenset({lane_id(CALLS, _rank_label(rank)), lane_id(REQUESTS, show(req))}))
            for req in _set(step, "schedAsync") if req not in dumping
            for rank, tracked in _fn(step, "workerAsync").items() if req not in tracked]


def shutdown_drained(steps: Sequence[Step], i: int) -> list[Offence]:
    """After shutdown no rank holds a pending task or a live event handle."""
    step = steps[i]
    if not step.values.get("down"):
        return []
    offences = []
    for rank in _fn(step, "pending"):
        tasks = [_get(task, "id") for task in _tasks(step, rank)]
        live = _get(_fn(step, "live"), rank, ())
        if tasks or live:
            offences.append(Offence(f"rank {show(rank)} shut down holding pending task(s) {show_set(tasks)} and "
                                    f"live event handle(s) {show_set(live)}",
                                    frozenset({lane_id(TASKS, _rank_label(rank))})))
    return offences


def no_load_while_dumping(steps: Sequence[Step], i: int) -> list[Offence]:
    """A load read a prompt whose dump was still running (the spec's history flag `dirtyLoads`)."""
    when = _first_true(steps, i, "dirtyLoads")
    if when is None:
        return []
    return [Offence(f"step {when}: a store hit was loaded while the dump writing that prompt was still running "
                    "on the rank: the store showed a block it had not finished writing",
                    frozenset({lane_id(TASKS, _rank_label(rank)) for rank in _fn(steps[when], "pending")}))]


def no_dump_of_failed_load(steps: Sequence[Step], i: int) -> list[Offence]:
    """A rank dumped a block its forward computed over a load that failed in the same step (the spec's
    history flag `dirtyDumps`): the store would keep wrong KV under that block's key."""
    when = _first_true(steps, i, "dirtyDumps")
    if when is None:
        return []
    ranks = [rank for rank in _fn(steps[when], "pending") if _tasks(steps[when], rank)] or list(_fn(steps[when], "pending"))
    return [Offence(f"step {when}: a load of a store hit failed, and the same step dumped the block computed over it: "
                    "the store keeps KV computed from whatever the failed load left in the hit blocks",
                    frozenset({lane_id(TASKS, _rank_label(rank)) for rank in ranks}))]


def no_null_block_write(steps: Sequence[Step], i: int) -> list[Offence]:
    """A forward wrote vLLM's null block (the spec's history flag `nullWrites`, hybrid models): a recompute
    in place of a position that had left the sliding window, whose entry in the group's list is the null
    block every request shares."""
    when = _first_true(steps, i, "nullWrites")
    if when is None:
        return []
    reqs = sorted((req for req, seq in _fn(steps[when], "swBlocksOf").items() if 0 in tuple(seq or ())), key=show)
    return [Offence(f"step {when}: the forward wrote the null block (block 0 of the sliding-window group) for "
                    f"{show_set(reqs)}: a prompt block that had left the window was recomputed in place, into the "
                    "block every request shares for its out-of-window positions",
                    frozenset(lane_id(REQUESTS, show(req)) for req in reqs))]


def _prefix_shares(steps: Sequence[Step], i: int) -> set[Value] | None:
    """Blocks a schedule shared through the prefix cache ("shared_prefix": the schedule record's `shared`)
    up to step i; None when the trace records no schedule's allocations (the model ran without `Record`)."""
    shared: set[Value] = set()
    recorded = False
    for step in steps[:i + 1]:
        schedule = _phase(step.action, "schedule")
        if "allocated" in schedule:
            recorded = True
        for pair in _get(schedule, "shared", ()) or ():
            shared.add(tuple(pair)[1])
    return shared if recorded else None


def blocks_exclusive(steps: Sequence[Step], i: int) -> list[Offence]:
    """A block held by two requests (outside a prefix-cache share), by both groups, or held while parked.

    Whether a model lets requests share blocks ("shared_prefix") is a constant the trace does not carry: a
    recorded trace names its shares in the schedule records; an unrecorded one is given the benefit of the
    doubt for the only shape a share takes (every holder's one block)."""
    step = steps[i]
    holders: dict[Value, list[Value]] = {}
    whole: dict[Value, bool] = {}
    for req, blocks in _fn(step, "blocksOf").items():
        seq = tuple(blocks or ())
        for block in seq:
            holders.setdefault(block, []).append(req)
            whole[block] = whole.get(block, True) and len(seq) == 1
    for req, blocks in _fn(step, "swBlocksOf").items():
        for block in tuple(blocks or ()):
            if block != 0:
                holders.setdefault(block, []).append(req)
                whole[block] = False
    parked = {b for entry in (step.values.get("parked") or ()) for b in (_get(entry, "blocks", ()) or ())}
    shares = _prefix_shares(steps, i)
    offences = []
    for block, reqs in sorted(holders.items(), key=lambda kv: show(kv[0])):
        shared = block in shares if shares is not None else whole[block]
        if (len(reqs) > 1 and not shared) or block in parked:
            why = "parked by a deferred free" if block in parked else f"held by {show_set(sorted(reqs, key=show))}"
            offences.append(Offence(f"block {show(block)} is {why}: the pool handed out a block it had not got back",
                                    frozenset({lane_id(BLOCKS, show(block))} | {lane_id(REQUESTS, show(r)) for r in reqs})))
    return offences


def no_stale_read(steps: Sequence[Step], i: int) -> list[Offence]:
    """A schedule ran a request over a block whose KV a failed load left invalid (the spec's history flag
    `staleReads`, "shared_prefix"): it shares the block with the request that is still to recompute it."""
    when = _first_true(steps, i, "staleReads")
    if when is None:
        return []
    invalid = set(_get(steps[when].values, "invalidKV", ()) or ())
    holders = sorted((req for req, blocks in _fn(steps[when], "blocksOf").items()
                      if invalid & set(tuple(blocks or ()))), key=show)
    return [Offence(f"step {when}: {show_set(holders)} hold block(s) {show_set(sorted(invalid, key=show))}, whose load "
                    "failed and whose recompute is still to come, and a request ran on them: it attends over "
                    "whatever the failed load left there",
                    frozenset({lane_id(REQUESTS, show(req)) for req in holders}
                              | {lane_id(BLOCKS, show(b)) for b in invalid}))]


def no_fruitless_preemption(steps: Sequence[Step], i: int) -> list[Offence]:
    """A preemption whose victims' blocks a deferred free parked: it freed nothing for its allocation."""
    blocks = _parked_blocks(steps[i], "preempt")
    if not blocks:
        return []
    when = next(k for k in range(i + 1) if _parked_blocks(steps[k], "preempt"))
    return [Offence(f"step {when}: a preemption freed nothing: a step that ran the victims is still in flight, so "
                    f"their blocks {show_set(sorted(blocks, key=show))} were parked by a deferred free",
                    frozenset(lane_id(BLOCKS, show(b)) for b in blocks))]


def drained_when_due(steps: Sequence[Step], i: int) -> list[Offence]:
    """A deferred free whose fence has passed still parked: the drain was skipped (after an empty step)."""
    due = TlaSet(b for e in _parked(steps[i]) if _get(e, "wait") == 0 for b in _get(e, "blocks", ()))
    if not due:
        return []
    return [Offence(f"step {i}: blocks {show_set(sorted(due, key=show))} are still parked although the step their "
                    "deferred free waited for has been processed: the drain was skipped after an empty step",
                    frozenset(lane_id(BLOCKS, show(b)) for b in due))]


def parked_eventually_freed(steps: Sequence[Step], loop: int) -> list[Offence]:
    """Blocks parked by a deferred free through the whole loop: they are never returned to the pool."""
    if not all(_parked(s) for s in steps[loop:]):
        return []
    blocks = _parked_blocks(steps[loop])
    for s in steps[loop + 1:]:
        blocks = blocks & _parked_blocks(s)
    return [Offence(f"blocks {show_set(sorted(blocks, key=show))} stay parked by a deferred free forever: the "
                    "steps that would drain them never come", frozenset(lane_id(BLOCKS, show(b)) for b in blocks))]


def delayed_eventually_freed(steps: Sequence[Step], loop: int) -> list[Offence]:
    last = len(steps) - 1
    offences = []
    for req in _fn(steps[-1], "reqState"):
        states = [_get(_fn(s, "reqState"), req) for s in steps]
        first = next((k for k, state in enumerate(states) if state == "delayed"), None)
        if first is None or any(state == "done" for state in states[min(first, loop):]):
            continue
        reporters = [show(rank) for rank, per_req in _fn(steps[last], "reported").items()
                     if _get(per_req, req, 0) >= 1]
        silent = [show(rank) for rank in _fn(steps[last], "reported") if show(rank) not in reporters]
        text = f"{show(req)} finished at step {first} and stays delayed forever: its blocks are never freed"
        if silent:
            text += (f"; finished_sending for {show(req)} came from rank(s) {' '.join(reporters) or 'none'} but "
                     f"never from rank(s) {' '.join(silent)}")
            trackers = [r for r in silent for s in steps
                        if req in _get(_fn(s, "workerAsync"), _rank_of(steps, r), ())]
            if not trackers:
                text += f" (which never tracked {show(req)})"
        offences.append(Offence(text, frozenset({lane_id(REQUESTS, show(req)), lane_id(SCHEDULER, "delayed frees")}
                                                | {lane_id(CALLS, f"rank {r}") for r in silent}
                                                | {lane_id(TASKS, f"rank {r}") for r in silent})))
    return offences


def no_load_into_freed_block(steps: Sequence[Step], i: int) -> list[Offence]:
    """A running load task ("async_loads") writes a block its request no longer holds: freed under the load."""
    step = steps[i]
    states, blocks = _fn(step, "reqState"), _fn(step, "blocksOf")
    sw_blocks = _fn(step, "swBlocksOf")  # hybrid: a load also writes the sliding-window group's blocks
    offences = []
    for rank, tasks in _fn(step, "loadTasks").items():
        for task in tasks:
            req, block = _get(task, "req"), _get(task, "block")
            if _get(task, "status") != "running":
                continue
            state = _get(states, req)
            held = tuple(_get(blocks, req, ()) or ()) + tuple(_get(sw_blocks, req, ()) or ())
            if state not in ("remote", "delayed") or block not in held:
                offences.append(Offence(
                    f"rank {show(rank)}: the load of {show(req)} still writes block {show(block)}, but {show(req)} is "
                    f"{state} and no longer holds it: the block was freed under the load and may be handed to "
                    "another request", frozenset({lane_id(REQUESTS, show(req)), lane_id(BLOCKS, show(block))})))
    return offences


def freed_after_transfers(steps: Sequence[Step], i: int) -> list[Offence]:
    """A freed request still has a running load or a running dump task on some rank."""
    step = steps[i]
    done = {req for req, state in _fn(step, "reqState").items() if state == "done"}
    offences = []
    for rank, tasks in _fn(step, "loadTasks").items():
        for task in tasks:
            if _get(task, "status") == "running" and _get(task, "req") in done:
                offences.append(Offence(
                    f"rank {show(rank)}: {show(_get(task, 'req'))} was freed while its load still runs",
                    frozenset({lane_id(REQUESTS, show(_get(task, "req")))})))
    for rank in _fn(step, "pending"):
        for task in _tasks(step, rank):
            for req in set(_get(task, "reqs", ()) or ()) & done:
                if _get(task, "status") == "running":
                    offences.append(Offence(
                        f"rank {show(rank)}: {show(req)} was freed while dump task {_get(task, 'id')} still reads it",
                        frozenset({lane_id(REQUESTS, show(req)), lane_id(TASKS, _rank_label(rank))})))
    return offences


def remote_has_load(steps: Sequence[Step], i: int) -> list[Offence]:
    """A request waits for remote KV with no load that will ever be reported."""
    step = steps[i]
    loading = {req for reqs in _fn(step, "workerRecv").values() for req in reqs}
    counted = {req for req, n in _fn(step, "aggRecv").items() if n}
    queued = {_get(slice_, "req") for meta in (step.values.get("inflight") or ()) for slice_ in _get(meta, "recv", ()) or ()}
    ready = _set(step, "recvDone")
    return [Offence(f"{show(req)} waits for remote KV, but no rank loads it and no receive is counted: it waits forever",
                    frozenset({lane_id(REQUESTS, show(req))}))
            for req, state in _fn(step, "reqState").items()
            if state == "remote" and req not in loading | counted | queued | ready]


def remote_eventually_leaves(steps: Sequence[Step], loop: int) -> list[Offence]:
    """A request waits for remote KV in every state of the loop."""
    return [Offence(f"{show(req)} waits for remote KV (WAITING_FOR_REMOTE_KVS) in every state of the loop: it never "
                    "runs and is never freed", frozenset({lane_id(REQUESTS, show(req))}))
            for req in _fn(steps[-1], "reqState")
            if all(_get(_fn(s, "reqState"), req) == "remote" for s in steps[loop:])]


def _rank_of(steps: Sequence[Step], label: str) -> Value:
    return next((rank for rank in _fn(steps[-1], "pending") if show(rank) == label), label)


def _always_in_loop(variable: str, what: str) -> Any:
    def check(steps: Sequence[Step], loop: int) -> list[Offence]:
        offences = []
        for rank in _fn(steps[-1], variable):
            if all(_get(_fn(s, variable), rank) for s in steps[loop:]):
                held = show_set(_get(_fn(steps[-1], variable), rank, ()) if variable == "live" else
                                [_get(t, "id") for t in _tasks(steps[-1], rank)])
                offences.append(Offence(f"rank {show(rank)}: {what} {held} never go away in the loop",
                                        frozenset({lane_id(TASKS, _rank_label(rank))})))
        return offences
    return check


_RANK = re.compile(r"\brank ([A-Za-z0-9_]+)")


def merged_over_ranks(check: Any) -> Any:
    """Ranks often break a property identically (lockstep stores): one offence naming all those ranks."""
    def merged(steps: Sequence[Step], i: int) -> list[Offence]:
        groups: dict[str, tuple[list[str], set[str]]] = {}
        for offence in check(steps, i):
            ranks = _RANK.findall(offence.text)
            key = _RANK.sub("rank ?", offence.text) if len(ranks) == 1 else offence.text
            names, lanes = groups.setdefault(key, ([], set()))
            names.extend(r for r in ranks[:1] if r not in names)
            lanes.update(offence.lanes)
        return [Offence(key.replace("rank ?", f"rank{'s' if len(names) > 1 else ''} {' '.join(names)}", 1)
                        if "rank ?" in key else key, frozenset(lanes)) for key, (names, lanes) in groups.items()]
    return merged


BINDING = LaneBinding(
    name="DeferDump",
    required=REQUIRED,
    groups=GROUPS,
    describe_action=describe_action,
    invariants={name: merged_over_ranks(check) for name, check in {
        "NoOverwriteWhileDumpingInv": no_overwrite_while_dumping,
        "NoUnexpectedReportInv": no_unexpected_report,
        "ReportOnceInv": report_once,
        "EventReleasedOnceInv": event_released_once,
        "NoEventLeakInv": no_event_leak,
        "NoWaitInWaitForSaveInv": no_wait_in_wait_for_save,
        "PreemptWaitsOnlyPreemptedInv": preempt_waits_only_preempted,
        "SchedTracksUnfinishedInv": sched_tracks_unfinished,
        "WorkersTrackInv": workers_track,
        "ShutdownDrainedInv": shutdown_drained,
        "NoLoadWhileDumpingInv": no_load_while_dumping,
        "NoDumpOfFailedLoadInv": no_dump_of_failed_load,
        "BlocksExclusiveInv": blocks_exclusive,
        "NoNullBlockWriteInv": no_null_block_write,
        "NoStaleReadInv": no_stale_read,
        "NoFruitlessPreemptionInv": no_fruitless_preemption,
        "DrainedWhenDueInv": drained_when_due,
        "NoLoadIntoFreedBlockInv": no_load_into_freed_block,
        "FreedAfterTransfersInv": freed_after_transfers,
        "RemoteHasLoadInv": remote_has_load,
    }.items()},
    liveness={name: merged_over_ranks(check) for name, check in {
        "DelayedEventuallyFreedProp": delayed_eventually_freed,
        "PendingEventuallyDrainedProp": _always_in_loop("pending", "pending dump tasks"),
        "EventsEventuallyReleasedProp": _always_in_loop("live", "live event handles"),
        "ParkedEventuallyFreedProp": parked_eventually_freed,
        "RemoteEventuallyLeavesProp": remote_eventually_leaves,
    }.items()},
    tones=TONES,
)


def binding_for(variables: Iterable[str]) -> LaneBinding:
    """The DeferDump binding when the trace has its variables, else one lane per variable."""
    names = list(variables)
    return BINDING if REQUIRED <= set(names) else generic_binding(names)


def step_lines(action: Mapping[str, Any]) -> list[str]:
    """One step of a counterexample in connector-method words, a few short lines: what the scheduler
    allocated and put in the metadata, each rank's connector calls (ranks with the same calls merged), and
    what ``request_finished`` / ``finished_sending`` did. Used where a whole page is too much (``deferdump mro``)."""
    name = str(action.get("name", "step"))
    if name == "init":
        return ["initial state"]
    if name == "task_complete":
        return [f"store: {line}" for line in describe_action(action).params]
    lines: list[str] = []
    schedule = _phase(action, "schedule")
    if schedule:
        lines.extend(f"scheduler: {p}" for p in _schedule_params(schedule))
    execute = _phase(action, "execute_model")
    if execute:
        by_calls: dict[tuple[str, ...], list[Value]] = {}
        for rank in sorted(_get(execute, "ranks", {}), key=show):
            calls = tuple(line for call in _calls(action, rank) for line in _call_lines(call))
            by_calls.setdefault(calls, []).append(rank)
        for calls, ranks in by_calls.items():
            who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(show(r) for r in ranks)}"
            lines.append(f"{who}: " + ("; ".join(calls) if calls else "no connector work"))
    update = _phase(action, "update_from_output")
    if update:
        params = _update_params(update)
        for call in _get(update, "calls", ()):
            if _get(call, "name") == "_update_from_kv_xfer_finished" and _get(call, "unexpected"):
                params.append(f"UNEXPECTED finished_sending {show_set(_get(call, 'unexpected', ()))} "
                              "(vLLM asserts req_id in self.requests)")
        lines.extend(f"scheduler: {p}" for p in params)
    return lines or [name]
