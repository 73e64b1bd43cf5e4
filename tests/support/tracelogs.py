"""Small hand-written connector event logs (docs/trace-log.md), for the trace-validation tests.

Events are given without the common fields; `write_run` numbers them (`seq`) per file and adds role,
rank and engine, as the adapter does.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ENGINE = "engine-test"


def lines(role: str, rank: int, events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"seq": seq, "role": role, "rank": rank, "engine": ENGINE, **event} for seq, event in enumerate(events)]


def write_run(directory: Path, scheduler: Iterable[Mapping[str, Any]],
              workers: Mapping[int, Iterable[Mapping[str, Any]]]) -> Path:
    """Write one run's logs (`scheduler-1.ndjson`, `worker-rank<r>-2.ndjson`) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {"scheduler-1.ndjson": lines("scheduler", 0, scheduler)}
    files.update({f"worker-rank{rank}-2.ndjson": lines("worker", rank, events) for rank, events in workers.items()})
    for name, records in files.items():
        (directory / name).write_text("".join(json.dumps(record) + "\n" for record in records))
    return directory


def build(step: int, reqs: list[dict[str, Any]] = (), dump: list[dict[str, Any]] = (),  # type: ignore[assignment]
          preempted: list[str] = (), finished: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {"step": step, "event": "build_connector_meta", "block_size": 4, "reqs": list(reqs), "dump": list(dump),
            "load": [], "preempted": list(preempted), "finished": list(finished)}


def req(name: str, blocks: list[int], computed: int, scheduled: int, *, new: bool = False,
        resumed: bool = False) -> dict[str, Any]:
    return {"req": name, "new": new, "resumed": resumed, "block_ids": blocks, "num_computed_tokens": computed,
            "num_scheduled_tokens": scheduled}


def step_worker(step: int, *, preempted: list[str] | None = None, waited_pre: list[int] = (),  # type: ignore[assignment]
                reaped: list[int] = (), submitted: list[dict[str, Any]] = (),  # type: ignore[assignment]
                finished: list[str] = (), waited: list[int] = (), reported: list[str] = ()  # type: ignore[assignment]
                ) -> list[dict[str, Any]]:
    """One worker step in vLLM's order: [handle_preemptions] wait_for_save get_finished."""
    events: list[dict[str, Any]] = []
    if preempted is not None:
        events.append({"step": step, "event": "handle_preemptions", "preempted": preempted, "waited": list(waited_pre)})
    events.append({"step": step, "event": "wait_for_save", "reaped": list(reaped), "submitted": list(submitted),
                   "submit_error": None})
    events.append({"step": step, "event": "get_finished", "finished_req_ids": list(finished), "waited": list(waited),
                   "reported": list(reported)})
    return events


def task(task_id: int, reqs: list[str], blocks: list[int]) -> dict[str, Any]:
    return {"task": task_id, "reqs": reqs, "blocks": blocks}


def finished_run(*, delayed: bool = True) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """One request of 6 tokens (block size 4): its full block dumped, it finishes, the free is delayed until
    the worker reports it. `delayed=False`: request_finished answers False (the protocol broken)."""
    scheduler = [
        build(1, [req("a", [1, 2], 0, 6, new=True)], dump=[{"req": "a", "block_ids": [1]}]),
        {"step": 1, "event": "request_finished", "req": "a", "block_ids": [1, 2], "delayed": delayed},
        build(2, finished=["a"]),
        {"step": 2, "event": "update_connector_output", "finished_sending": ["a"] if delayed else [],
         "finished_recving": []},
        {"step": 2, "event": "shutdown", "waited": []},
    ]
    worker = [
        *step_worker(1, preempted=[], submitted=[task(7, ["a"], [1])]),
        *step_worker(2, preempted=[], finished=["a"], waited=[7], reported=["a"] if delayed else []),
        {"step": 2, "event": "shutdown", "waited": []},
    ]
    return scheduler, {0: worker}


def preempt_run(*, hook: bool = True) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """Request a dumps block 1 (task 7, still running); in step 2 it is preempted and b is given block 1 and
    writes it. With the hook, handle_preemptions waits task 7 before that forward; without it (a connector
    that ignores the hook), the forward rewrites block 1 under the running dump."""
    scheduler = [
        build(1, [req("a", [1], 0, 4, new=True), req("b", [2], 0, 4, new=True)], dump=[{"req": "a", "block_ids": [1]}]),
        build(2, [req("b", [1], 4, 4)], preempted=["a"]),
        {"step": 2, "event": "request_finished", "req": "b", "block_ids": [2, 1], "delayed": False},
        {"step": 2, "event": "request_finished", "req": "a", "block_ids": [], "delayed": True},
    ]
    worker = [
        *step_worker(1, preempted=[], submitted=[task(7, ["a"], [1])]),
        *step_worker(2, preempted=["a"] if hook else None, waited_pre=[7] if hook else []),
    ]
    if not hook:
        worker[-1]["reaped"] = []
    return scheduler, {0: worker}


def reap_run(tasks: int) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """`tasks` requests, each dumping its full block in its own task in step 1 (a layer-wise connector
    submits one task per save); step 2's wait_for_save reaps them all, so the store completes `tasks` tasks,
    unlogged, between two events."""
    names = [f"r{i}" for i in range(tasks)]
    scheduler = [
        build(1, [req(name, [i + 1], 0, 4, new=True) for i, name in enumerate(names)],
              dump=[{"req": name, "block_ids": [i + 1]} for i, name in enumerate(names)]),
        build(2),
    ]
    worker = [
        *step_worker(1, preempted=[], submitted=[task(i + 1, [name], [i + 1]) for i, name in enumerate(names)]),
        *step_worker(2, preempted=[], reaped=[i + 1 for i in range(tasks)]),
    ]
    return scheduler, {0: worker}


def hybrid_run(*, fence: bool = True) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """A hybrid model (full attention + a sliding window of 16 tokens, block size 32). Request a (70 tokens)
    dumps its 2 full blocks of both groups (task 7: blocks 1, 2 and window blocks 11, 12). In step 2 its
    window leaves block 11 (70 - 16 + 1 = 55 skipped tokens: one whole block), vLLM frees it and gives it to
    the new request b, whose forward writes it. With the fence handle_preemptions waits task 7 first (it
    reads a freed block); without it (#989 as merged) the forward rewrites block 11 under the running dump."""
    def build_hybrid(step: int, reqs: list[dict[str, Any]], dump: list[dict[str, Any]]) -> dict[str, Any]:
        return {**build(step, reqs, dump), "block_size": 32, "sliding_window": [16]}

    def hybrid_req(name: str, blocks: list[int], window: list[int], computed: int, scheduled: int,
                   new: bool = False) -> dict[str, Any]:
        return {**req(name, blocks, computed, scheduled, new=new), "group_block_ids": [window]}

    scheduler = [
        build_hybrid(1, [hybrid_req("a", [1, 2, 3], [11, 12, 13], 0, 70, new=True)],
                     [{"req": "a", "block_ids": [1, 2], "group_block_ids": [[11, 12]]}]),
        build_hybrid(2, [hybrid_req("a", [], [], 70, 1), hybrid_req("b", [4], [11], 0, 10, new=True)], []),
    ]
    worker = [
        *step_worker(1, preempted=[], submitted=[task(7, ["a"], [1, 2, 11, 12])]),
        *step_worker(2, preempted=[], waited_pre=[7] if fence else []),
    ]
    return scheduler, {0: worker}
