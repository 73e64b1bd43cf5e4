"""The spec's safety invariants, checked on a snapshot of scheduler, worker and block-pool state.

The simulated vLLM engine (`deferdump.tools.engine`, under the property tests and soak runs) builds a
`SystemSnapshot` after every step (from the real connectors plus its block pool) and calls
`check_snapshot`, or `check_block_writes` right before a forward writes blocks. Each violation is one line naming the invariant, so a failure says what broke.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from deferdump.reference.connectors import DirectConnector, OuterConnector
from deferdump.reference.errors import DeferDumpError


#: Checks that are invariants of spec/DeferDump.tla carry the TLA+ name in their messages.
SPEC_INVARIANTS: frozenset[str] = frozenset({
    "NoOverwriteWhileDumpingInv", "NoUnexpectedReportInv", "ReportOnceInv", "EventReleasedOnceInv",
    "NoEventLeakInv", "NoWaitInWaitForSaveInv", "PreemptWaitsOnlyPreemptedInv",
})
#: Checks that exist only in Python (their messages say "(Python-only)"), and what each adds to the spec's.
PYTHON_ONLY_CHECKS: dict[str, str] = {
    "NoFreeUnderRead": "a block a running dump reads is not back in the pool (the cause of an overwrite, seen before it)",
    "ReportedHasNoTask": "a reported request has no pending task left on that rank",
    "RequestFinished": "request_finished delays exactly the requests that had dumps submitted or attempted",
    "DelayedFree": "a delayed request is freed only after every rank reported it",
    "Shutdown": "shutdown leaves no pending task, live handle or leaked task",
    "StoredBytes": "every stored block holds the bytes its block had when the dump was submitted",
    "LoadedBytes": "every loaded block holds the bytes the store has",
    "VerifyDumps": "the connector's own verify_dumps counted no changed block",
    "DumpPlan": "a step's dump slices are exactly the requests with newly full blocks, hashes matching blocks",
    "DumpAttempted": "every rank submitted or attempted the dumps the scheduler planned",
    "NoAsyncLoads": "no rank reports finished_recving (loads are synchronous here)",
    "Liveness": "after a drain every delayed free has happened (the spec's DelayedEventuallyFreedProp, bounded)",
    "HybridLoadErrors": "no rank reports block-level load errors under several KV-cache groups (vLLM 0.32 raises there)",
    "LoadIntoFreedBlock": "an asynchronous load writes only blocks its request still holds (the spec's "
                          "NoLoadIntoFreedBlockInv, on the simulated engine's blocks)",
}


class InvariantViolation(DeferDumpError, AssertionError):
    """One or more invariants failed; `violations` lists them."""

    def __init__(self, violations: list[str]) -> None:
        super().__init__("\n".join(violations))
        self.violations = violations


@dataclasses.dataclass(frozen=True)
class TaskState:
    """One pending dump task on a rank."""

    task_id: int
    request_ids: frozenset[str]
    block_ids: frozenset[int]
    source_read_done: bool  # False: the dump may still read its source blocks
    event_handle: int
    layer_name: str | None = None  # a layer-wise dump reads only this layer's slice of its blocks


@dataclasses.dataclass(frozen=True)
class RankState:
    """A worker rank: its connector's observable state plus what the harness saw it do."""

    rank: int
    tracked: frozenset[str]  # worker `_async_dump_req_ids`
    pending: tuple[TaskState, ...]
    live_handles: frozenset[int]
    bad_releases: int = 0
    leaked: int = 0
    reports: Mapping[str, int] = dataclasses.field(default_factory=dict)  # id -> times in finished_sending
    passed_to_get_finished: frozenset[str] = frozenset()
    incomplete_waits_in_wait_for_save: int = 0
    preemption_waits: tuple[tuple[frozenset[str], frozenset[str]], ...] = ()  # (task's ids, preempted ids)

    def incomplete_blocks(self, layer_name: str | None = None) -> frozenset[int]:
        """Blocks some unfinished dump on this rank may still read (in layer `layer_name`, or in any layer)."""
        return frozenset().union(
            *(
                t.block_ids
                for t in self.pending
                if not t.source_read_done and (layer_name is None or t.layer_name in (None, layer_name))
            )
        )


@dataclasses.dataclass(frozen=True)
class SchedulerState:
    """The scheduler's connector set and what the harness knows about finished requests."""

    tracked: frozenset[str]  # scheduler `_async_dump_req_ids`
    finish_answers: Mapping[str, bool] = dataclasses.field(default_factory=dict)  # request_finished's bool
    had_dumps: frozenset[str] = frozenset()  # oracle: requests whose dumps were submitted or attempted
    freed_after_reports: frozenset[str] = frozenset()  # delayed requests whose blocks vLLM freed


@dataclasses.dataclass(frozen=True)
class PoolState:
    """vLLM's block pool: free blocks, and those among them freed by a preemption (freed at once by vLLM)."""

    free_blocks: frozenset[int]
    freed_by_preemption: frozenset[int] = frozenset()


@dataclasses.dataclass(frozen=True)
class SystemSnapshot:
    scheduler: SchedulerState
    ranks: tuple[RankState, ...]
    pool: PoolState
    shut_down: bool = False


def rank_state(
    connector: DirectConnector | OuterConnector,
    rank: int,
    *,
    source_read_done: Mapping[int, bool] | None = None,
    **observed: object,
) -> RankState:
    """Read a worker connector's observable state; `source_read_done[task_id]` overrides payload.done()."""
    inner = connector.inner if isinstance(connector, OuterConnector) else connector
    tasks = []
    for pending in inner._pending_dump_tasks:
        if source_read_done is not None and pending.task.task_id in source_read_done:
            done = source_read_done[pending.task.task_id]
        else:
            done = pending.payload is not None and pending.payload.done()
        tasks.append(
            TaskState(
                pending.task.task_id, pending.request_ids, frozenset(pending.block_ids), done, pending.event_handle,
                pending.layer_name,
            )
        )
    return RankState(
        rank=rank,
        tracked=frozenset(inner._async_dump_req_ids),
        pending=tuple(tasks),
        live_handles=inner.events.live_handles(),
        bad_releases=inner.events.bad_releases,
        leaked=inner.events.leaked,
        **observed,  # type: ignore[arg-type]
    )


def check_block_writes(rank: RankState, written_blocks: Iterable[int], layer_name: str | None = None) -> list[str]:
    """A forward on `rank` is about to write `written_blocks` (of layer `layer_name`, or of every layer):
    no unfinished dump may still read them."""
    clash = rank.incomplete_blocks(layer_name) & frozenset(written_blocks)
    if not clash:
        return []
    where = "" if layer_name is None else f" of {layer_name}"
    return [f"NoOverwriteWhileDumpingInv: rank {rank.rank} writes block(s) {sorted(clash)}{where} while a dump still reads them"]


def check_snapshot(snapshot: SystemSnapshot) -> list[str]:
    """Every violated invariant, one line each (empty when all hold)."""
    violations: list[str] = []
    sched = snapshot.scheduler
    for req_id, answer in sorted(sched.finish_answers.items()):
        expected = req_id in sched.had_dumps
        if answer != expected:
            violations.append(
                f"RequestFinished (Python-only): request_finished({req_id}) returned {answer}, "
                f"but dumps submitted/attempted={expected}"
            )
    for rank in snapshot.ranks:
        violations += _check_rank(rank, sched, snapshot.pool)
        if snapshot.shut_down:
            if rank.pending or rank.live_handles or rank.leaked:
                violations.append(
                    f"Shutdown (Python-only): rank {rank.rank} left {len(rank.pending)} pending task(s), "
                    f"{len(rank.live_handles)} live handle(s), {rank.leaked} leaked"
                )
    for req_id in sorted(sched.freed_after_reports):
        missing = [r.rank for r in snapshot.ranks if r.reports.get(req_id, 0) != 1]
        if missing:
            violations.append(f"DelayedFree (Python-only): {req_id} freed before rank(s) {missing} reported it")
    return violations


def _check_rank(rank: RankState, sched: SchedulerState, pool: PoolState) -> list[str]:
    out: list[str] = []
    w = rank.rank
    unsafe = (rank.incomplete_blocks() & pool.free_blocks) - pool.freed_by_preemption
    if unsafe:
        out.append(f"NoFreeUnderRead (Python-only): rank {w}: block(s) {sorted(unsafe)} released to the pool while a dump reads them")
    for req_id, count in sorted(rank.reports.items()):
        if count > 1:
            out.append(f"ReportOnceInv: rank {w} reported {req_id} {count} times")
        if req_id not in rank.passed_to_get_finished:
            out.append(f"ReportOnceInv: rank {w} reported {req_id} before it was passed to get_finished")
        if sched.finish_answers.get(req_id) is not True:
            out.append(f"NoUnexpectedReportInv: rank {w} reported {req_id}, whose request_finished did not return True")
        if any(req_id in task.request_ids for task in rank.pending):
            out.append(f"ReportedHasNoTask (Python-only): rank {w} reported {req_id} while a pending task still covers it")
    if rank.incomplete_waits_in_wait_for_save:
        out.append(
            f"NoWaitInWaitForSaveInv: rank {w} waited {rank.incomplete_waits_in_wait_for_save} unfinished task(s) "
            "in wait_for_save"
        )
    for task_ids, preempted in rank.preemption_waits:
        if task_ids.isdisjoint(preempted):
            out.append(
                f"PreemptWaitsOnlyPreemptedInv: rank {w} waited a task of {sorted(task_ids)} "
                f"for preempted {sorted(preempted)}"
            )
    if rank.bad_releases:
        out.append(f"EventReleasedOnceInv: rank {w} released {rank.bad_releases} handle(s) twice or never acquired")
    held = frozenset(t.event_handle for t in rank.pending if t.event_handle)
    if rank.live_handles != held:
        out.append(
            f"NoEventLeakInv: rank {w} live handles {sorted(rank.live_handles)} != pending tasks' {sorted(held)}"
        )
    return out


def assert_invariants(snapshot: SystemSnapshot) -> None:
    """Raise `InvariantViolation` listing every violated invariant."""
    violations = check_snapshot(snapshot)
    if violations:
        raise InvariantViolation(violations)
