"""Explore a class's own schedules: a random vLLM engine that chooses each move after the class's answers.

A model's schedule (a counterexample, or the sampled behaviours of :mod:`.search`) fixes the class's answers
by the reader's labels; a class that answers otherwise (delays where the labels do not, reports on one rank
only, counts its reports with ``get_finished_count``) ends each replay at its first differing answer, and no
hazard is found however many schedules are tried. The explorer plays vLLM 0.32's scheduler itself instead,
around the same engine plumbing (:class:`.replay._Replay` in ``follow`` mode): requests arrive, are scheduled a
block a step, run out of blocks and are preempted (their blocks freed), finish or are aborted
(``request_finished`` with the status vLLM set), and are freed when the class says so: at once when it does
not delay, once KVOutputAggregator has ``get_finished_count() or world_size`` reports when it does. Out-of-window
blocks of sliding-window groups are freed each step (SlidingWindowManager.remove_skipped_blocks, the window
one block). As a MultiConnector child (the ``multi`` path) the class sits beside a sibling that delays every
request and reports it in some later step, and MultiConnector's counting of the two children's delays decides
when a report passes on (multi_connector.py ~357-376, ~549-567). Store tasks end at random, or only when waited
(the slowest store). Each move is one vLLM can
make, so a hazard found is the class's own: the forward writing a block (of a rank's KV cache) a store task
still reads, or a report vLLM asserts on. Random, seeded, a bounded number of schedules: finding nothing
proves nothing (a verdict is never made safe by it).

Abstractions shared with the model (spec/README.md): any free block may be allocated (vLLM's free queue order
is a matter of pool size and history), one block a step per request and group, a preempted request recomputes
its blocks (no prefix-cache hit), no loads.
"""
from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from deferdump.tools.mro.run.replay import ReplayOutcome, _Replay, run_class

logger = logging.getLogger(__name__)

__all__ = ["EXPLORED_SCHEDULES", "explore_class"]

EXPLORED_SCHEDULES = 200
MAX_STEPS = 14


@dataclass
class _Req:
    """One request of an explored schedule, as vLLM's scheduler holds it."""

    name: str
    length: int  # blocks it computes before it stops by itself
    arrival: int  # the step it arrives in
    state: str = "waiting"  # waiting, running, preempted, delayed (finished, free delayed) or done
    progress: int = 0  # blocks of tokens it has produced (kept over a preemption, which recomputes them)
    blocks: set[int] = field(default_factory=set)  # the block ids it holds now (every group)
    sw: list[int] = field(default_factory=list)  # its sliding-window group's blocks, 0 once freed out of window


@dataclass(frozen=True)
class _Plan:
    """The random choices fixed for one schedule (logged with a hazard, so a run can be told apart)."""

    requests: tuple[tuple[int, int], ...]  # (length, arrival) per request
    pool: int
    complete_p: float
    abort_p: float

    @staticmethod
    def draw(rng: random.Random, groups: int) -> "_Plan":
        count = rng.choice((2, 2, 3))
        requests = tuple((rng.randint(1, 4), rng.randint(0, 2)) for _ in range(count))
        return _Plan(requests, pool=rng.randint(2, 5) * groups, complete_p=rng.choice((0.0, 0.3, 0.8)),
                     abort_p=rng.choice((0.0, 0.0, 0.15)))


class _Explorer:
    def __init__(self, replay: _Replay, plan: _Plan, rng: random.Random) -> None:
        self.replay = replay
        self.plan = plan
        self.rng = rng
        self.sliding = replay.hybrid
        self.two_groups = replay.hybrid and replay.path == "hma"  # a full and a sliding-window group
        self.free: list[int] = list(range(1, plan.pool + 1))
        self.reqs = [_Req(f"r{i + 1}", length, arrival) for i, (length, arrival) in enumerate(plan.requests)]
        self.finished_ids: list[str] = []  # finished since the last schedule (Scheduler.finished_req_ids)
        self.handed: list[str] = []  # the finished ids this step's schedule handed to the workers

    # -- blocks ----------------------------------------------------------------------------------------------
    def _available(self) -> list[int]:
        """The free blocks vLLM may hand out: not those the class holds a reference on (BlockPool.touch keeps
        a block out of the free queue until the class frees it, block_pool.py ~752-806)."""
        pool = self.replay.block_pool
        return [b for b in self.free if pool is None or not pool.pinned(b)]

    def _take(self) -> int:
        block = self.rng.choice(self._available())
        self.free.remove(block)
        return block

    def _release(self, req: _Req) -> None:
        self.free += sorted(req.blocks)
        req.blocks = set()
        req.sw = []

    def _per_block(self) -> int:
        return 2 if self.two_groups else 1

    # -- one engine step ------------------------------------------------------------------------------------
    def step(self, index: int) -> None:
        self.replay.step = index
        self._aborts()
        self._store_completions()
        if not self._has_work(index):  # EngineCore steps only while the scheduler has requests
            return
        scheduled = self._schedule(index)
        self._execute(scheduled)
        self._update(scheduled)

    def _has_work(self, index: int) -> bool:
        """Scheduler.has_requests (scheduler.py ~2803-2825): unfinished requests, finished ids not yet handed to
        the workers, or finished requests whose free the connector delays."""
        return bool(self.finished_ids) or any(
            r.state in ("running", "preempted", "delayed") or (r.state == "waiting" and r.arrival <= index)
            for r in self.reqs) or self.replay.scheduler_asks("has_pending_push_work")

    def _aborts(self) -> None:
        """Scheduler.finish_requests between steps: an abort of a request the connector has seen."""
        for req in self.reqs:
            if req.state in ("waiting", "running", "preempted") and req.name in self.replay.seen \
                    and self.rng.random() < self.plan.abort_p:
                self._sliding_finish(req)
                self.replay._request_finished({"reqs": [req.name]}, self.replay.stubs.RequestStatus.FINISHED_ABORTED)
                self._finished(req)

    def _store_completions(self) -> None:
        for task in self.replay.store.running():
            if self.rng.random() < self.plan.complete_p:
                task.running = False

    def _sliding_out(self, req: _Req) -> list[int]:
        """remove_skipped_blocks with a one-block window: every sliding-window block but the last is freed."""
        freed = [b for b in req.sw[:-1] if b]
        if freed:
            req.sw = [0] * (len(req.sw) - 1) + req.sw[-1:]
            req.blocks -= set(freed)
            self.free += freed
        return freed

    def _sliding_finish(self, req: _Req) -> None:
        if self.sliding and req.sw:
            self.replay.null_out(self._sliding_out(req))

    def _schedule(self, index: int) -> list[tuple[_Req, list[tuple[int, int | None]]]]:
        preempted: list[str] = []
        sw_freed: list[int] = []
        running = [r for r in self.reqs if r.state == "running"]
        scheduled: list[tuple[_Req, list[tuple[int, int | None]]]] = []
        for req in running:
            if req.state != "running":  # preempted for an earlier request's blocks
                continue
            # KVCacheManager.allocate_slots: the out-of-window blocks are freed first, then the new ones taken;
            # short of blocks, Scheduler.schedule preempts a running request not scheduled yet (the last one,
            # or the lowest priority: any of them), the request itself when there is no other
            if self.sliding:
                sw_freed += self._sliding_out(req)
            blocked = False
            while len(self._available()) < self._per_block():
                if self.replay.scheduler_asks("has_pending_block_frees"):
                    blocked = True  # the class's transfers will free blocks: vLLM preempts nothing and schedules
                    break  # no more running requests this step (scheduler.py ~787-791, ~845-847)
                victims = [r for r in self.reqs if r.state == "running" and r is not req
                           and all(r is not s for s, _ in scheduled)]
                self._preempt(self.rng.choice(victims) if victims else req, preempted)
                if not victims:
                    break
            if blocked:
                break
            if req.state == "running":
                scheduled.append((req, [self._allocate(req)]))
        for req in self.reqs:  # waiting and preempted requests, in arrival order, as room allows
            if preempted:
                # vLLM 0.32 admits nothing in a schedule that preempted (scheduler.py ~899-900: "if not
                # preempted_reqs"): a victim is not resumed in the step that preempted it. Admitting here once
                # resumed a victim at once, so it was in num_scheduled_tokens beside its freed blocks, and a class
                # taking "admitted but not scheduled" as its victims (AdmittedMirrorConnector, thirtieth blind
                # round, keyed safe) was reported unsafe by running
                break
            if req.state not in ("waiting", "preempted") or req.arrival > index:
                continue
            need = (req.progress + 1) * self._per_block()  # a preempted request recomputes what it had
            if len(self._available()) < need:
                break
            req.state = "running"
            scheduled.append((req, [self._allocate(req) for _ in range(req.progress + 1)]))
        allocated = []
        for req, blocks in scheduled:
            for i, (block, sw) in enumerate(blocks):
                allocated.append({"req": req.name, "block": f"b{block}", "idx": i + 1, "hit": False,
                                  **({"sw": f"b{sw}"} if sw is not None else {})})
        phase = {"preempted": preempted, "sw_freed": [f"b{b}" for b in sw_freed], "allocated": allocated,
                 "calls": [{"name": "build_connector_meta", "finished_req_ids": list(self.finished_ids),
                            "preempted_req_ids": preempted}]}
        self.handed, self.finished_ids = self.finished_ids, []
        self.replay.schedule(phase)
        return scheduled

    def _allocate(self, req: _Req) -> tuple[int, int | None]:
        """One block in each group: (full-attention block, sliding-window block or None). Off the HMA path a
        sliding-window model's one group is the sliding-window group: the same block stands for both."""
        block = self._take()
        req.blocks.add(block)
        if not self.sliding:
            return block, None
        sw = self._take() if self.two_groups else block
        req.blocks.add(sw)
        req.sw.append(sw)
        return block, sw

    def _preempt(self, req: _Req, preempted: list[str]) -> None:
        """vLLM frees a preempted request's blocks at once (Scheduler._preempt_request) and recomputes it."""
        self._release(req)
        req.state = "preempted"
        preempted.append(req.name)

    def _execute(self, scheduled: Sequence[tuple[_Req, list[tuple[int, int | None]]]]) -> None:
        writes, sw_writes = [], []
        for req, blocks in scheduled:
            for block, sw in blocks:
                if not self.sliding or self.two_groups:
                    writes.append([f"b{block}", req.name])
                if sw is not None:
                    sw_writes.append([f"b{sw}", req.name])
        # a step with nothing scheduled runs no forward (gpu_model_runner.py ~3968-4005: handle_preemptions,
        # then kv_connector_no_forward: bind, start_load_kv, wait_for_save, get_transfer_results, clear)
        forward = [{"name": "forward", "writes": writes, "sw_writes": sw_writes}] if scheduled else []
        # As a MultiConnector child, the sibling reports each id it delayed in some later step, at random (drawn in
        # sorted order: a set of strings iterates in a per-process order, and the schedule must repeat by seed)
        sibling = [r for r in sorted(self.replay.sibling_owed) if self.rng.random() < 0.5]
        records = [{"name": "handle_preemptions"}, *forward, {"name": "wait_for_save"},
                   {"name": "get_finished", "finished_req_ids": sorted(self.handed), "sibling_sending": sibling}]
        self.replay.execute_model({"ranks": {rank: records for rank in self.replay.ranks}})

    def _update(self, scheduled: Sequence[tuple[_Req, list[tuple[int, int | None]]]]) -> None:
        stopping = []
        for req, _ in scheduled:
            req.progress += 1
            if req.progress >= req.length:
                stopping.append(req)
        for req in stopping:
            self._sliding_finish(req)
        self.replay.update_from_output({"calls": [
            {"name": "request_finished", "reqs": [r.name for r in stopping]},
            {"name": "_update_from_kv_xfer_finished", "finished_sending": sorted(self.replay.step_emitted)}]})
        emitted = set(self.replay.step_emitted)  # what vLLM frees: after the class's update_connector_output
        for req in stopping:
            self._finished(req)
        for req in self.reqs:  # _update_from_kv_xfer_finished: the delayed requests every report freed
            if req.name in emitted and req.state == "delayed":
                self._release(req)
                req.state = "done"

    def _finished(self, req: _Req) -> None:
        self.finished_ids.append(req.name)
        if req.name in self.replay.delayed:
            req.state = "delayed"
        else:
            self._release(req)
            req.state = "done"

    def idle(self) -> bool:
        return (all(r.state == "done" for r in self.reqs) and not self.finished_ids
                and not self.replay.store.running())


def _one_schedule(paths: Sequence[str], cls_name: str, path: str, case: str, store_modules: Sequence[str],
                  plan: _Plan, rng: random.Random, layers: int) -> ReplayOutcome:
    def drive(replay: _Replay) -> ReplayOutcome:
        explorer = _Explorer(replay, plan, rng)
        for index in range(MAX_STEPS):
            explorer.step(index)
            if explorer.idle():
                break
        return ReplayOutcome("diverged", "no hazard", step=replay.step)

    return run_class(paths, cls_name, path, case, store_modules, drive, layers=layers, follow=True)


def explore_class(paths: Sequence[str], cls_name: str, path: str, case: str, store_modules: Sequence[str],
                  schedules: int = EXPLORED_SCHEDULES, seed: int = 1) -> ReplayOutcome:
    """Run ``cls_name`` through ``schedules`` explored schedules of the case (``path``, ``case``): the first
    hazard, or what was explored without one."""
    rng = random.Random(seed)
    layers = 2 if case == "layerwise" else 1
    groups = 2 if case == "hybrid" and path == "hma" else 1
    crashes: list[str] = []
    for index in range(schedules):
        plan = _Plan.draw(rng, groups)
        outcome = _one_schedule(paths, cls_name, path, case, store_modules, plan, random.Random(rng.random()), layers)
        if outcome.status == "reproduced":
            outcome.detail = f"{outcome.detail} (explored schedule {index + 1} of {schedules}, seed {seed})"
            return outcome
        if outcome.status == "not_runnable":
            return outcome
        if outcome.detail != "no hazard":
            crashes.append(outcome.detail)
    detail = f"no hazard in {schedules} explored schedules"
    if crashes:
        detail += f" ({len(crashes)} ended by the class raising; first: {crashes[0]})"
    return ReplayOutcome("diverged", detail)
