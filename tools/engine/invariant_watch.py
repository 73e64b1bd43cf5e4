"""Feeds the step loop's observations to `deferdump.reference.invariants` at every step.

The checker wants the harness's knowledge (who finished, what request_finished answered, who reported
what, which blocks vLLM freed). Kept for every request ever seen, that knowledge grows with the run and a
100,000-request soak would check O(N) state per step (and look like a memory leak). So the watch keeps a
*window*: a request's entries live from its first dump slice until its free was checked (delayed
requests) or until every rank was told it finished (the others), then they retire. A report for a
retired or unknown id is still seen: it enters the next snapshot as a report nobody asked for.
"""
from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence

from deferdump.reference.connectors import OuterConnector
from deferdump.reference.invariants import (
    PoolState,
    SchedulerState,
    SystemSnapshot,
    check_block_writes,
    check_snapshot,
    rank_state,
)
from deferdump.reference.metadata import DeferDumpMetadata

MAX_KEPT_MESSAGES = 50


class InvariantWatch:
    """Windowed harness state plus every violation found (messages capped, count exact)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.had_dumps: set[str] = set()
        self.finish_answers: dict[str, bool] = {}
        self.reports: list[collections.Counter[str]] = [collections.Counter() for _ in range(world_size)]
        self.passed: list[set[str]] = [set() for _ in range(world_size)]
        self._incomplete_waits = [0] * world_size
        self._preemption_waits: list[list[tuple[frozenset[str], frozenset[str]]]] = [[] for _ in range(world_size)]
        self._freed_now: list[str] = []
        self.violation_count = 0
        self.counts: collections.Counter[str] = collections.Counter()  # violations per check name
        self.messages: list[str] = []
        self.steps_checked = 0

    # ------------------------------------------------------------- observations
    def record(self, violations: Iterable[str]) -> None:
        for line in violations:
            self.violation_count += 1
            self.counts[line.split(":", 1)[0].removesuffix(" (Python-only)")] += 1
            if len(self.messages) < MAX_KEPT_MESSAGES:
                self.messages.append(line)

    def on_meta(self, meta: DeferDumpMetadata | None) -> None:
        if meta is not None:
            self.had_dumps |= meta.dump_req_ids()
            # an asynchronous load is the request's only transfer from then on: its earlier dumps were waited at
            # its preemption, and a finish during the load is delayed by vLLM, not by request_finished
            self.had_dumps -= {req_id for req_id, m in meta.request_meta.items() if m.load_async}

    def before_writes(self, rank: int, connector: OuterConnector, written_blocks: Iterable[int]) -> None:
        """The forward (or a load) is about to write `written_blocks` on `rank`."""
        self.record(check_block_writes(rank_state(connector, rank), written_blocks))

    def on_waits(
        self,
        rank: int,
        waits: Sequence[tuple[str, int, bool]],
        task_requests: Mapping[int, frozenset[str]],
        preempted: frozenset[str],
        *,
        task_blocks: Mapping[int, frozenset[int]] | None = None,
        freed: frozenset[int] = frozenset(),
    ) -> None:
        """Store waits of one step on `rank`: (phase, task id, whether `check` had said finished).

        A hybrid model's fence also waits, in `handle_preemptions`, the tasks that read a block freed since
        the last schedule (`freed`, the metadata's `freed_block_ids`): such a wait is no over-wait (the
        spec's `handle_preemptions`: over == a waited task with no preempted request that reads no freed
        block), so it is not handed to `PreemptWaitsOnlyPreemptedInv`."""
        blocks = task_blocks or {}
        for phase, task_id, checked_finished in waits:
            if phase == "wait_for_save" and not checked_finished:
                self._incomplete_waits[rank] += 1
            elif phase == "handle_preemptions" and task_id in task_requests:
                if freed and not freed.isdisjoint(blocks.get(task_id, frozenset())):
                    continue
                self._preemption_waits[rank].append((task_requests[task_id], preempted))

    def on_get_finished(self, rank: int, passed: Iterable[str], reported: Iterable[str] | None) -> None:
        self.passed[rank].update(passed)
        for req_id in reported or ():
            self.reports[rank][req_id] += 1

    def on_finished(self, answers: Mapping[str, bool], freed_after_reports: Iterable[str]) -> None:
        self.finish_answers.update(answers)
        self._freed_now.extend(freed_after_reports)

    # ------------------------------------------------------------------ checks
    def end_step(
        self,
        scheduler: OuterConnector,
        workers: Sequence[OuterConnector],
        free_blocks: frozenset[int],
        *,
        freed_by_preemption: frozenset[int] = frozenset(),
        shut_down: bool = False,
    ) -> list[str]:
        """Check the snapshot of this step; retire what is settled; return this step's violations."""
        violations = check_snapshot(self.snapshot(scheduler, workers, free_blocks, freed_by_preemption, shut_down))
        self.record(violations)
        self.steps_checked += 1
        self._retire()
        return violations

    def snapshot(
        self,
        scheduler: OuterConnector,
        workers: Sequence[OuterConnector],
        free_blocks: frozenset[int],
        freed_by_preemption: frozenset[int] = frozenset(),
        shut_down: bool = False,
    ) -> SystemSnapshot:
        """The system state now, with what the watch remembers (nothing is recorded or retired)."""
        ranks = tuple(
            rank_state(
                connector, rank,
                reports=dict(self.reports[rank]),
                passed_to_get_finished=frozenset(self.passed[rank]),
                incomplete_waits_in_wait_for_save=self._incomplete_waits[rank],
                preemption_waits=tuple(self._preemption_waits[rank]),
            )
            for rank, connector in enumerate(workers)
        )
        return SystemSnapshot(
            scheduler=SchedulerState(
                tracked=frozenset(scheduler._async_dump_req_ids),
                finish_answers=dict(self.finish_answers),
                had_dumps=frozenset(self.had_dumps),
                freed_after_reports=frozenset(self._freed_now),
            ),
            ranks=ranks,
            pool=PoolState(free_blocks, freed_by_preemption & free_blocks),
            shut_down=shut_down,
        )

    def _retire(self) -> None:
        settled = set(self._freed_now)
        settled.update(
            req_id for req_id, answer in self.finish_answers.items()
            if not answer and all(req_id in passed for passed in self.passed)
        )
        settled.update(req_id for counts in self.reports for req_id in counts if req_id not in self.finish_answers)
        for req_id in settled:
            self.finish_answers.pop(req_id, None)
            self.had_dumps.discard(req_id)
            for rank in range(self.world_size):
                self.reports[rank].pop(req_id, None)
                self.passed[rank].discard(req_id)
        self._freed_now.clear()
        self._incomplete_waits = [0] * self.world_size
        self._preemption_waits = [[] for _ in range(self.world_size)]
