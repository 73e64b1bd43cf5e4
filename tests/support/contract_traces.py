"""Behaviours of spec/ConnectorContract.tla, found by TLC, written as boundary logs (docs/trace-log.md).

Used to show that the Python log checker (`conformance.contractlog`) and the TLA+ contract agree: a
behaviour of a correct design becomes a log the checker accepts, a broken design's counterexample a log
it rejects with the same clause. Each contract action becomes the events vLLM's calls would log:
`schedule` a `build_connector_meta` (and, for an async load, `get_num_new_matched_tokens`,
`update_state_after_alloc` and the worker's `start_load_kv`), `execute_model` a worker step
(`handle_preemptions` waiting the transfers the connector flushed or the store ended, `wait_for_save`
submitting the new saves, `get_finished` waiting the rest), `update_from_output` `request_finished` and
`update_connector_output`. Block `bN` is block N; a block holds BLOCK_SIZE tokens.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deferdump.tools.tlc.bridge import run_tlc
from deferdump.tools.tlc.output import TlcResult
from deferdump.tools.tlc.specfiles import spec_dir
from deferdump.tools.tlc.values import ModelValue
from support.tracelogs import write_run

BLOCK_SIZE = 4
Xfer = tuple[frozenset[str], frozenset[int]]


def run_contract(design: str, invariants: Sequence[str], *, loads: bool = True, extra: str = "",
                 live: bool = False, constraint: str | None = None) -> TlcResult:
    """TLC on the contract with 2 requests x 2 blocks, 3 blocks, one preemption (1 request, 2 blocks when
    `live`), checking `invariants` (and `extra`: definitions they use, in a generated module), exploring
    only states that satisfy `constraint` (a definition in `extra`) when given."""
    module = "MCContractWitness"
    cfg = "\n".join([
        "CONSTANTS", "    Req = {r1}" if live else "    Req = {r1, r2}",
        "    Block = {b1, b2}" if live else "    Block = {b1, b2, b3}",
        "    Need = 2", "    MaxPreempt = 1", f"    Loads = {'TRUE' if loads else 'FALSE'}", f'    Design = "{design}"',
        "SPECIFICATION Spec", *([f"CONSTRAINT {constraint}"] if constraint else []),
        "INVARIANTS", *[f"    {name}" for name in invariants],
        *(["PROPERTIES", "    DelayedEventuallyReportedProp"] if live else []), ""])
    text = f"---- MODULE {module} ----\nEXTENDS ConnectorContract\n{extra}\n====\n"
    return run_tlc(spec_dir() / f"{module}.tla", f"{module}.cfg", timeout=600,
                   extra_modules={module: text, f"{module}.cfg": cfg})


def _name(value: Any) -> str:
    assert isinstance(value, ModelValue), value
    return value.name


def _block(value: Any) -> int:
    return int(_name(value).lstrip("b"))


def _view(state: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "rstate": {_name(r): v for r, v in state["rstate"].items()},
        "held": {_name(r): {_block(b) for b in v} for r, v in state["held"].items()},
        "toWrite": {_block(b) for b in state["toWrite"]},
        "xfer": {(frozenset(_name(r) for r in x["reqs"]), frozenset(_block(b) for b in x["blocks"]))
                 for x in state["xfer"]},
        "overwrote": bool(state["overwrote"]),
        "misSent": {_name(r) for r in state["misSent"]},
        "misRecv": {_name(r) for r in state["misRecv"]},
    }


def trace_to_log(states: Sequence[Mapping[str, Any]], actions: Sequence[str | None], directory: Path) -> Path:
    """Write the behaviour (TLC's states and the action that produced each) as one run's log files."""
    sched: list[dict[str, Any]] = []
    worker: list[dict[str, Any]] = []
    ids: dict[Xfer, int] = {}
    loads: set[Xfer] = set()
    store_done: list[int] = []
    finished: list[str] = []
    loaded: set[str] = set()  # async loads reported: the next schedule shows the request as new, all its blocks
    step = 0
    victims: list[str] = []
    views = [_view(s) for s in states]
    for action, s, t in zip(actions[1:], views, views[1:]):
        if action == "schedule":
            step += 1
            victims = sorted(r for r in s["rstate"] if s["rstate"][r] == "running" and t["rstate"][r] == "preempted")
            reqs, starts = [], []
            for r in sorted(t["held"]):
                new = sorted(t["held"][r] - s["held"][r])
                if not new:
                    continue
                tokens = len(new) * BLOCK_SIZE
                if t["rstate"][r] == "recving":
                    sched.append({"step": step - 1, "event": "get_num_new_matched_tokens", "req": r,
                                  "num_computed_tokens": 0, "matched": tokens, "load_async": True})
                    sched.append({"step": step - 1, "event": "update_state_after_alloc", "req": r, "block_ids": new,
                                  "num_external_tokens": tokens})
                    key = (frozenset({r}), frozenset(new))
                    ids[key] = len(ids) + 1
                    loads.add(key)
                    starts.append({"req": r, "block_ids": new, "task": ids[key]})
                    continue
                before = sorted(s["held"][r])
                if r in loaded:
                    loaded.discard(r)
                    reqs.append({"req": r, "new": True, "resumed": False, "block_ids": before + new,
                                 "num_computed_tokens": len(before) * BLOCK_SIZE, "num_scheduled_tokens": tokens})
                else:
                    reqs.append({"req": r, "new": s["rstate"][r] == "waiting", "resumed": s["rstate"][r] == "preempted",
                                 "block_ids": new, "num_computed_tokens": len(before) * BLOCK_SIZE,
                                 "num_scheduled_tokens": tokens})
            sched.append({"step": step, "event": "build_connector_meta", "block_size": BLOCK_SIZE, "reqs": reqs,
                          "preempted": victims, "finished": sorted(finished)})
            finished = []
            if starts:
                worker.append({"step": step, "event": "start_load_kv", "loads": starts})
        elif action == "execute_model":
            ended = s["xfer"] - t["xfer"] - loads
            flipped = t["overwrote"] and not s["overwrote"]
            flushed = {x for x in ended if x[1] & s["toWrite"] and not flipped}
            started = sorted(t["xfer"] - s["xfer"], key=sorted)
            for x in started:
                ids[x] = len(ids) + 1
            worker.append({"step": step, "event": "handle_preemptions", "preempted": victims,
                           "waited": sorted(store_done + [ids[x] for x in flushed])})
            store_done = []
            worker.append({"step": step, "event": "wait_for_save", "reaped": [], "submit_error": None,
                           "submitted": [{"task": ids[x], "reqs": sorted(x[0]), "blocks": sorted(x[1])}
                                         for x in started]})
            worker.append({"step": step, "event": "get_finished", "finished_req_ids": [], "reported": [],
                           "waited": sorted(ids[x] for x in ended - flushed)})
        elif action == "update_from_output":
            for r in sorted(s["rstate"]):
                if s["rstate"][r] in ("running", "preempted") and t["rstate"][r] in ("delayed", "done"):
                    sched.append({"step": step, "event": "request_finished", "req": r,
                                  "block_ids": sorted(s["held"][r]), "delayed": t["rstate"][r] == "delayed"})
                    finished.append(r)
            sending = {r for r in s["rstate"] if s["rstate"][r] == "delayed" and t["rstate"][r] == "done"}
            recving = {r for r in s["rstate"] if s["rstate"][r] == "recving" and t["rstate"][r] == "running"}
            loaded |= recving
            sending |= t["misSent"] - s["misSent"]
            recving |= t["misRecv"] - s["misRecv"]
            if sending or recving:
                sched.append({"step": step, "event": "update_connector_output", "finished_sending": sorted(sending),
                              "finished_recving": sorted(recving)})
        elif action == "transfer_done":
            store_done += [ids[x] for x in s["xfer"] - t["xfer"] - loads]
        else:
            raise AssertionError(f"an action the contract does not have: {action}")
    return write_run(directory, sched, {0: worker})


def result_to_log(result: TlcResult, directory: Path) -> Path:
    """A TLC result's trace (a counterexample or witness) as a log."""
    assert result.trace, result.message
    return trace_to_log([s.values for s in result.trace], [s.action for s in result.trace], directory)
