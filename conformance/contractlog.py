"""Checking any connector's boundary log against the connector contract (spec/ConnectorContract.tla).

`check_contract_log(paths)` reads one run's logs through `tracelog.load_events` and walks the merged
events with the contract's state at the block-lifetime level: which blocks vLLM holds for which request,
which requests had their free delayed (`request_finished` answered True) or wait for remote KV (an async
load), which of the connector's transfers still read or write which blocks (only where the log shows
them: the reference connector's `submitted`/`waited`/`reaped` task ids, `start_load_kv` loads). The
property names are the TLA+ contract's; `tests/conformance/test_contractlog_agrees.py` shows that the
checker and the TLA+ contract agree on logs made from the contract's own traces.

A clause the log cannot decide is never reported as holding: it is listed in `ContractVerdict.unchecked`
(the transfer clause when no transfer is logged, the liveness clause unless the run is known drained).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deferdump.conformance.tracelog import LogEvent, load_events

logger = logging.getLogger(__name__)

NULL_BLOCK = 0  # vLLM's null block: a sliding-window position out of the window, never a real block

SENDING_ONLY_DELAYED = "SendingOnlyDelayedInv"
RECVING_ONLY_WAITING = "RecvingOnlyWaitingInv"
NO_REUSE_BEFORE_REPORT = "NoReuseBeforeReportInv"
NO_WRITE_WHILE_TRANSFER = "NoWriteWhileTransferInv"
DELAYED_EVENTUALLY_REPORTED = "DelayedEventuallyReportedProp"
#: Every clause of the contract the checker decides, in the TLA+ module's names.
PROPERTIES = (SENDING_ONLY_DELAYED, RECVING_ONLY_WAITING, NO_REUSE_BEFORE_REPORT, NO_WRITE_WHILE_TRANSFER,
              DELAYED_EVENTUALLY_REPORTED)


@dataclass(frozen=True)
class ContractVerdict:
    """The verdict on one run's log.

    ok: no clause the log can decide is broken. property: the broken clause (a name in `PROPERTIES`).
    detail: the first bad event as `file:line: event ..., request R, block B: why`. events: the merged
    events read. unchecked: clauses the log cannot decide (never counted as holding).
    """

    ok: bool
    property: str | None
    detail: str | None
    events: int
    unchecked: tuple[str, ...] = field(default=())


class _Violation(Exception):
    """Internal: the first event that breaks a clause."""

    def __init__(self, prop: str, event: LogEvent, why: str, req: str | None = None,
                 block: int | None = None) -> None:
        super().__init__(why)
        self.prop = prop
        parts = [f"{event.file}:{event.line}: event {event.event}"]
        if req is not None:
            parts.append(f"request {req}")
        if block is not None:
            parts.append(f"block {block}")
        self.detail = ", ".join(parts) + f": {why}"


@dataclass
class _Life:
    """One life of a request (from its admission until its blocks are freed), as the scheduler saw it."""

    blocks: list[int] = field(default_factory=list)  # full-attention group, by position
    groups: list[list[int]] = field(default_factory=list)  # the other groups' lists, by position
    state: str = "live"  # live | delayed | done
    delayed_at: LogEvent | None = None  # the request_finished that delayed the free
    awaiting_recv: bool = False  # an async load into its blocks is not yet reported (finished_recving)
    recv_at: LogEvent | None = None
    async_asked: bool = False  # get_num_new_matched_tokens answered an async load
    computed_at_ask: int = 0
    held: set[int] = field(default_factory=set)  # blocks vLLM keeps for a delayed or recving request


@dataclass
class _Transfer:
    """A transfer of the connector on one rank, reading (save) or writing (load) blocks until it ends."""

    key: tuple[str, int]  # ("task", id) for a save task, ("load", id) for a load
    reqs: frozenset[str]
    blocks: frozenset[int]
    since: LogEvent


def _real(blocks: Iterable[int]) -> set[int]:
    return {b for b in blocks if b != NULL_BLOCK}


class _Checker:
    """The walk over the merged events; raises `_Violation` at the first bad one."""

    def __init__(self) -> None:
        self.lives: dict[str, _Life] = {}
        self.block_size: int | None = None
        self.transfers: dict[int, dict[tuple[str, int], _Transfer]] = {}  # rank -> running transfers
        self.writes: dict[int, list[tuple[int, str, LogEvent]]] = {}  # step -> (block, writer, event)
        self.checked: set[tuple[int, int]] = set()  # (rank, step) whose forward writes were checked
        self.transfers_logged = False

    # ------------------------------------------------------------------ helpers
    def life(self, req: str) -> _Life:
        if req not in self.lives:
            self.lives[req] = _Life()
        return self.lives[req]

    def protectors(self, block: int, writer: str) -> list[tuple[str, _Life]]:
        """Other requests whose delayed free or pending async load still keeps `block`."""
        return [(r, x) for r, x in self.lives.items()
                if r != writer and (x.state == "delayed" or x.awaiting_recv) and block in x.held]

    def written(self, life: _Life, computed: int, scheduled: int) -> set[int]:
        """The blocks a forward writes: those holding positions [computed, computed + scheduled)."""
        if scheduled <= 0:
            return set()
        size = self.block_size or 1
        first, last = computed // size, (computed + scheduled - 1) // size
        out: set[int] = set()
        for seq in (life.blocks, *life.groups):
            out |= _real(seq[i] for i in range(first, min(last + 1, len(seq))))
        return out

    def hand_out(self, event: LogEvent, step: int, req: str, blocks: set[int]) -> None:
        """`blocks` will be written for `req` in `step`: none may be kept for another request."""
        for block in sorted(blocks):
            for other, life in self.protectors(block, req):
                why = (f"written for {req} while {other}'s free is delayed and not yet reported"
                       if life.state == "delayed" else
                       f"written for {req} while {other} still waits for its async load (no finished_recving)")
                raise _Violation(NO_REUSE_BEFORE_REPORT, event, why, other, block)
            self.writes.setdefault(step, []).append((block, req, event))

    def check_writes(self, event: LogEvent, rank: int, step: int) -> None:
        """The forward of `step` on `rank` has run: no running transfer of the rank may touch its writes."""
        if (rank, step) in self.checked:
            return
        self.checked.add((rank, step))
        self.check_blocks(event, rank, [(b, w) for b, w, _ in self.writes.get(step, [])], "the forward")

    def check_blocks(self, event: LogEvent, rank: int, writes: Sequence[tuple[int, str]], who: str) -> None:
        running = self.transfers.get(rank, {})
        for block, writer in writes:
            for transfer in running.values():
                if block in transfer.blocks and not (transfer.key[0] == "load" and writer in transfer.reqs):
                    kind = "save task" if transfer.key[0] == "task" else "load"
                    raise _Violation(
                        NO_WRITE_WHILE_TRANSFER, event,
                        f"{who} wrote it (for {writer}) while {kind} {transfer.key[1]} of "
                        f"{', '.join(sorted(transfer.reqs))} (since {transfer.since.file}:{transfer.since.line}) "
                        f"still {'reads' if transfer.key[0] == 'task' else 'writes'} it",
                        writer, block)

    def end_tasks(self, rank: int, ids: Iterable[int]) -> None:
        running = self.transfers.get(rank, {})
        for task in ids:
            running.pop(("task", task), None)

    def end_loads(self, reqs: Iterable[str], rank: int | None = None) -> None:
        done = set(reqs)
        for r, running in self.transfers.items():
            if rank is not None and r != rank:
                continue
            for key in [k for k, t in running.items() if k[0] == "load" and t.reqs & done]:
                running.pop(key)

    # ------------------------------------------------------------------ events
    def apply(self, event: LogEvent) -> None:
        r = event.record
        handler = getattr(self, f"on_{r['event']}", None)
        if handler is not None:
            handler(event, r)

    def on_build_connector_meta(self, event: LogEvent, r: dict[str, Any]) -> None:
        self.block_size = self.block_size or r["block_size"]
        step = r["step"]
        for req in r["preempted"]:
            life = self.life(req)
            life.blocks, life.groups = [], []  # a preemption frees the blocks (never delayed)
        for x in r["reqs"]:
            req = x["req"]
            life = self.lives.get(req)
            if x["new"] and life is not None and life.state == "done":
                life = None  # the id comes back: a new life
            if life is None:
                life = self.lives[req] = _Life()
            groups = x.get("group_block_ids") or []
            if x["new"] or x["resumed"]:
                life.blocks = list(x["block_ids"])
                life.groups = [list(g) for g in groups]
            else:
                life.blocks.extend(x["block_ids"])
                while len(life.groups) < len(groups):
                    life.groups.append([])
                for mine, added in zip(life.groups, groups):
                    mine.extend(added)
            written = self.written(life, x["num_computed_tokens"], x["num_scheduled_tokens"])
            self.hand_out(event, step, req, written)

    def on_get_num_new_matched_tokens(self, event: LogEvent, r: dict[str, Any]) -> None:
        life = self.life(r["req"])
        if life.state == "done":
            life = self.lives[r["req"]] = _Life()
        life.async_asked = bool(r.get("load_async")) and bool(r.get("matched"))
        life.computed_at_ask = int(r.get("num_computed_tokens", 0))

    def on_update_state_after_alloc(self, event: LogEvent, r: dict[str, Any]) -> None:
        life = self.life(r["req"])
        if not life.async_asked or not r.get("num_external_tokens"):
            return
        life.async_asked = False
        life.awaiting_recv, life.recv_at = True, event
        size = self.block_size or 1
        first = life.computed_at_ask // size
        last = (life.computed_at_ask + r["num_external_tokens"] - 1) // size
        loaded: set[int] = set()
        for seq in (r["block_ids"], *(r.get("group_block_ids") or [])):
            loaded |= _real(seq[i] for i in range(first, min(last + 1, len(seq))))
        # the load writes these blocks; vLLM keeps them for the request until finished_recving
        self.hand_out(event, r["step"] + 1, r["req"], loaded)
        life.held = _real(r["block_ids"]).union(*(_real(g) for g in r.get("group_block_ids") or []))

    def on_request_finished(self, event: LogEvent, r: dict[str, Any]) -> None:
        life = self.life(r["req"])
        if r["delayed"]:
            life.state, life.delayed_at = "delayed", event
            life.held = _real(r["block_ids"]).union(*(_real(g) for g in r.get("group_block_ids") or []))
        else:
            life.state = "done"
            if not life.awaiting_recv:
                life.held = set()

    def on_update_connector_output(self, event: LogEvent, r: dict[str, Any]) -> None:
        for req in r["finished_sending"]:
            life = self.lives.get(req)
            if life is None or life.state != "delayed":
                why = ("finished_sending for a request vLLM never saw" if life is None else
                       "finished_sending for a request already reported (once per life)"
                       if life.delayed_at is not None and life.state == "done" else
                       "finished_sending for a request whose free was not delayed (request_finished answered "
                       "False)" if life.state == "done" else
                       "finished_sending for a request that has not finished")
                raise _Violation(SENDING_ONLY_DELAYED, event, why, req)
            life.state = "done"
            life.delayed_at = event  # keeps "already reported" distinguishable
            if not life.awaiting_recv:
                life.held = set()
        for req in r["finished_recving"]:
            life = self.lives.get(req)
            if life is None or not life.awaiting_recv:
                raise _Violation(RECVING_ONLY_WAITING, event,
                                 "finished_recving for a request that waits for no async load (never, or "
                                 "already reported)", req)
            life.awaiting_recv = False
            if life.state != "delayed":
                life.held = set()
            self.end_loads([req])

    def on_handle_preemptions(self, event: LogEvent, r: dict[str, Any]) -> None:
        self.end_tasks(r["rank"], r.get("waited", []))

    def on_scribble(self, event: LogEvent, r: dict[str, Any]) -> None:
        self.check_blocks(event, r["rank"], [(b, "the scribble adversary") for b in _real(r["block_ids"])],
                          "the scribble adversary")

    def on_start_load_kv(self, event: LogEvent, r: dict[str, Any]) -> None:
        running = self.transfers.setdefault(r["rank"], {})
        for load in r.get("loads") or []:
            self.transfers_logged = True
            key = ("load", int(load["task"]))
            running[key] = _Transfer(key, frozenset({load["req"]}), frozenset(_real(load["block_ids"])), event)

    def on_wait_for_save(self, event: LogEvent, r: dict[str, Any]) -> None:
        rank = r["rank"]
        self.check_writes(event, rank, r["step"])
        self.end_tasks(rank, r.get("reaped", []))
        if "submitted" in r:
            self.transfers_logged = True
        running = self.transfers.setdefault(rank, {})
        for sub in r.get("submitted") or []:
            key = ("task", int(sub["task"]))
            running[key] = _Transfer(key, frozenset(sub["reqs"]), frozenset(_real(sub["blocks"])), event)

    def on_get_finished(self, event: LogEvent, r: dict[str, Any]) -> None:
        rank = r["rank"]
        self.check_writes(event, rank, r["step"])
        self.end_tasks(rank, r.get("waited", []))
        self.end_loads(r.get("reported_recving") or [], rank)

    def on_get_block_ids_with_load_errors(self, event: LogEvent, r: dict[str, Any]) -> None:
        self.check_writes(event, r["rank"], r["step"])

    def on_shutdown(self, event: LogEvent, r: dict[str, Any]) -> None:
        if r["role"] == "worker":
            self.end_tasks(r["rank"], r.get("waited", []))
            self.transfers.pop(r["rank"], None)  # shutdown drains every transfer of the rank

    # ------------------------------------------------------------------ the end
    def unreported(self) -> list[tuple[str, _Life]]:
        return [(req, life) for req, life in sorted(self.lives.items())
                if life.state == "delayed" or life.awaiting_recv]


def check_events(events: Sequence[LogEvent], *, drained: bool = False) -> ContractVerdict:
    """The verdict on merged events (`tracelog.load_events`); `drained`: the run ended with nothing in
    flight, so every delayed free must have been reported (the liveness clause)."""
    checker = _Checker()
    try:
        for event in events:
            checker.apply(event)
        if drained:
            for req, life in checker.unreported():
                since = life.delayed_at if life.state == "delayed" else life.recv_at
                assert since is not None
                what = ("its free was delayed here and no finished_sending came" if life.state == "delayed"
                        else "it waits for an async load from here and no finished_recving came")
                raise _Violation(DELAYED_EVENTUALLY_REPORTED, since, f"the run drained, but {what}", req)
    except _Violation as violation:
        logger.info("contract violation: %s %s", violation.prop, violation.detail)
        return ContractVerdict(False, violation.prop, violation.detail, len(events), _unchecked(checker, drained))
    return ContractVerdict(True, None, None, len(events), _unchecked(checker, drained))


def _unchecked(checker: _Checker, drained: bool) -> tuple[str, ...]:
    out: list[str] = []
    if not checker.transfers_logged:
        out.append(NO_WRITE_WHILE_TRANSFER)
    if not drained:
        out.append(DELAYED_EVENTUALLY_REPORTED)
    return tuple(out)


def check_contract_log(paths: Sequence[Path], *, drained: bool = False) -> ContractVerdict:
    """Check one run's boundary logs (files, or a directory of them) against the connector contract.

    Bad input (unreadable file, schema break, logs of two runs) raises `TraceLogError` (a `UserError`).
    `drained=True` says the run ended with nothing left to report (the caller drained the engine), so a
    delayed free never reported is a `DelayedEventuallyReportedProp` violation; otherwise that clause is
    listed in `unchecked`.
    """
    return check_events(load_events(paths), drained=drained)
