"""The simulated vLLM 0.32 engine: the scheduler simulation and one connector plus real KV tensors per
worker rank, stepped in vLLM's call order. The property tests, bench and soak all run this loop.

One step, in vLLM 0.32's V1 order (`gpu_model_runner` and `KVConnectorModelRunnerMixin`):

    scheduler  schedule() → build_connector_meta(step)                       [SimScheduler]
    each rank  handle_preemptions(meta) → bind_connector_metadata → start_load_kv
               forward: per layer wait_for_layer_load → compute + KV writes → save_kv_layer
               wait_for_save → get_finished(finished ids) → get_block_ids_with_load_errors → clear
    scheduler  update_from_output: sample/finish (request_finished), free on aggregated finished_sending
               (vLLM's `KVOutputAggregator`: a request counts as sent once every rank reported it)

`defer_finalize` puts `get_finished` before `wait_for_save` (the speculative-decoding order, where the
step's finalize runs after the next step's output is collected).

Modes (bench interleaves them over identical request streams):
- `NO_SAVE`: no connector at all — the baseline;
- `BLOCKING`: the pre-PR behaviour, made by the *loop*, not by connector code: right after
  `wait_for_save` it waits every pending task (via the public `handle_preemptions` with all pending ids),
  so the step pays the whole dump, as UCM's blocking `store.wait` did;
- `DEFERRED`: the connector as it is (this project).

With `check_invariants` the loop feeds `InvariantWatch` (the spec's invariants) at every step; `oracle`
(with the forward's "tokens" content) adds the content oracle (dump plan, stored and loaded bytes) and the
per-rank Python-only checks (DumpAttempted, NoAsyncLoads, VerifyDumps). Every phase is timed with a
`PhaseTimer`; bench reads the timings, soak and the property tests read the watch. The environment's moves
come from the scheduler's `Moves` (seeded, or scripted by a test) and from the store (`ManualStore`,
`FaultyStore`); `abort` is a client abort between steps.

With the connector's `load_async` the loads are asynchronous: the scheduler parks hits (WAITING_FOR_REMOTE_KVS),
each rank's `get_finished` reports finished_recving (and `failed_recving`), counted per rank as vLLM's
aggregator does; under the oracle every reported load is checked when it is reported: its request still
holds the blocks (no load writes a freed block) and they hold the stored bytes.

With `WorkloadConfig.sliding_window` the model is hybrid: the connectors get two KV-cache groups (`kv_groups`,
as the vLLM adapter builds them), the forward writes both groups' blocks into shared KV tensors, and the
scheduler frees sliding-window blocks while requests run (docs/engine.md, "Hybrid models").
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from deferdump.reference.config import ConnectorConfig
from deferdump.reference.connectors import OuterConnector, Role
from deferdump.reference.devices import Device
from deferdump.reference.groups import NULL_BLOCK, SINGLE_GROUP, KVGroup
from deferdump.reference.invariants import InvariantViolation, check_snapshot
from deferdump.reference.metadata import DeferDumpMetadata
from deferdump.reference.stores.base import KVStore

from deferdump.tools.engine.content_oracle import ContentOracle
from deferdump.tools.engine.forward import ForwardPass, ModelShape, group_layer_names
from deferdump.tools.engine.invariant_watch import InvariantWatch
from deferdump.tools.engine.moves import Moves
from deferdump.tools.engine.phase_timer import PhaseTimer
from deferdump.tools.engine.scheduler import SimScheduler, SimulationError, Status, StepOutcome, WorkloadConfig
from deferdump.tools.engine.store_probe import ProbeStore

logger = logging.getLogger(__name__)

# Phases that are connector Python on the scheduler and worker sides (python_ms_per_step_*).
CONNECTOR_PHASES = (
    "sched_connector", "handle_preemptions", "bind", "start_load_kv", "wait_for_layer_load",
    "save_kv_layer", "wait_for_save", "get_finished",
)


class Mode(str, enum.Enum):
    NO_SAVE = "no_save"
    BLOCKING = "blocking"
    DEFERRED = "deferred"


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Everything one step loop needs besides its store."""

    workload: WorkloadConfig
    shape: ModelShape
    connector: ConnectorConfig | None = None  # None only with Mode.NO_SAVE
    mode: Mode = Mode.DEFERRED
    world_size: int = 1  # worker ranks (cp: must equal cp_world_size)
    device: str = "cpu"
    check_invariants: bool = False
    oracle: bool = False  # content oracle and per-rank checks (needs check_invariants, content "tokens")
    defer_finalize: bool = False  # get_finished before wait_for_save (spec-decode order)

    def __post_init__(self) -> None:
        if self.mode is not Mode.NO_SAVE and self.connector is None:
            raise ValueError(f"mode {self.mode.value} needs a connector config")
        if self.oracle and not (self.check_invariants and self.shape.content == "tokens" and self.device == "cpu"):
            raise ValueError("oracle needs check_invariants, a CPU device and shape content 'tokens'")
        if self.shape.block_size != self.workload.block_size:
            raise ValueError("shape.block_size and workload.block_size differ")
        if self.workload.hybrid:
            if self.shape.layers % 2:
                raise ValueError(f"a hybrid model (sliding_window) needs an even number of layers, got {self.shape.layers}")
            if self.connector is not None and self.connector.variant != "direct":
                raise ValueError(f"a hybrid model (sliding_window) needs connector variant 'direct', got {self.connector.variant!r}")
        if self.connector is not None:
            if self.connector.block_size != self.workload.block_size:
                raise ValueError("connector block_size must equal the workload's block_size")
            if self.connector.variant == "cp" and self.world_size != self.connector.cp_world_size:
                raise ValueError("variant cp needs world_size == cp_world_size")
        if self.world_size < 1:
            raise ValueError("world_size must be >= 1")


def kv_groups(config: LoopConfig) -> tuple[KVGroup, ...]:
    """The connector's KV-cache groups, as the vLLM adapter builds them (`reference/vllm.py` `kv_groups`):
    one group, or for a hybrid model the full-attention group first and the sliding-window group after."""
    window = config.workload.sliding_window
    if window is None:
        return SINGLE_GROUP
    full, sliding = group_layer_names(config.shape, 2)
    return (KVGroup(full), KVGroup(sliding, window))


@dataclasses.dataclass
class ShutdownReport:
    """State after the loop drained and every connector shut down."""

    pending_tasks: int
    live_event_handles: int
    leaked_event_handles: int
    leaked_blocks: int  # blocks not back in the pool although no request is alive
    held_requests: int  # finished requests whose free never came
    tracked_left: int  # ids left in any `_async_dump_req_ids`
    verify_mismatches: int
    submit_failures: int
    wait_failures: int
    steps: int


@dataclasses.dataclass
class _Rank:
    connector: OuterConnector | None
    probe: ProbeStore | None
    forward: ForwardPass
    recving: set[str] = dataclasses.field(default_factory=set)  # this step's finished_recving
    failed_recving: set[str] = dataclasses.field(default_factory=set)  # this step's failed_recving
    async_loads: dict[str, Any] = dataclasses.field(default_factory=dict)  # req -> its async load slice


class StepLoop:
    """Scheduler simulation + one connector and KV tensors per worker rank, stepped in vLLM's order."""

    def __init__(
        self,
        config: LoopConfig,
        store: KVStore | None = None,
        *,
        timer: PhaseTimer | None = None,
        device_factory: Callable[[int], Device] | None = None,
        moves: Moves | None = None,
    ) -> None:
        """`device_factory(rank)` gives each worker its copy device (closed by `shutdown`); default: the
        connector picks `CpuDevice`/`CudaDevice` from the KV tensors and owns it. `moves`: the environment's
        choices (default: seeded from the workload)."""
        if config.mode is not Mode.NO_SAVE and store is None:
            raise ValueError("a saving mode needs a store")
        self.config = config
        self.timer = timer if timer is not None else PhaseTimer()
        self.store = store
        device = torch.device(config.device)
        connector_config = config.connector if config.mode is not Mode.NO_SAVE else None
        self.scheduler_connector: OuterConnector | None = None
        self.groups = kv_groups(config)
        if connector_config is not None:
            assert store is not None
            self.scheduler_connector = OuterConnector(
                connector_config, Role.SCHEDULER, store=store, world_size=config.world_size, groups=self.groups,
                num_layers=config.shape.layers,
            )
        self.scheduler = SimScheduler(
            config.workload, self.scheduler_connector, world_size=config.world_size, timed=self.timer.measure,
            moves=moves,
        )
        self.oracle: ContentOracle | None = None
        if config.oracle and connector_config is not None:
            self.oracle = ContentOracle(connector_config, config.shape, config.world_size, groups=len(self.groups))
        self.ranks: list[_Rank] = []
        self._devices: list[Device] = []
        for rank in range(config.world_size):
            owner = 0 if connector_config is not None and connector_config.is_mla else rank
            forward = ForwardPass(
                config.shape, config.workload.num_blocks, device, seed=config.workload.seed + rank, owner=owner,
                groups=len(self.groups),
            )
            connector = probe = None
            if connector_config is not None:
                assert store is not None
                probe = ProbeStore(store, self.oracle.wrap if self.oracle is not None else None)
                copy_device = device_factory(rank) if device_factory is not None else None
                if copy_device is not None:
                    self._devices.append(copy_device)
                connector = OuterConnector(
                    connector_config, Role.WORKER, store=probe, device=copy_device, rank=rank,
                    world_size=config.world_size, groups=self.groups,
                )
                connector.register_kv_caches(forward.kv_caches, config.workload.num_blocks)
            self.ranks.append(_Rank(connector, probe, forward))
        self.watch = InvariantWatch(config.world_size) if config.check_invariants and connector_config else None
        self.steps = 0
        self.shut_down = False

    # -------------------------------------------------------------------- run
    def run(
        self,
        *,
        steps: int | None = None,
        requests: int | None = None,
        on_step: Callable[["StepLoop"], None] | None = None,
    ) -> None:
        """Run `steps` steps, or until `requests` requests were created and all of them are freed."""
        if (steps is None) == (requests is None):
            raise ValueError("give exactly one of steps or requests")
        if steps is not None:
            for _ in range(steps):
                self.step()
                if on_step is not None:
                    on_step(self)
            return
        assert requests is not None
        self.scheduler.request_limit = requests
        stalled = 0
        while not (not self.scheduler.stream_open and self.scheduler.idle()):
            freed_before = self.scheduler.freed_total
            self.step()
            if on_step is not None:
                on_step(self)
            stalled = 0 if self.scheduler.freed_total != freed_before or self.scheduler.running else stalled + 1
            if stalled > 10_000:
                raise SimulationError(
                    f"no progress for {stalled} steps: {len(self.scheduler.requests)} request(s) alive or held"
                )

    def drain(self, max_steps: int = 10_000) -> None:
        """Close the request stream and step until every request finished and was freed."""
        self.scheduler.stream_open = False
        for _ in range(max_steps):
            if self.scheduler.idle():
                return
            self.step()
        raise SimulationError(f"did not drain within {max_steps} steps: {len(self.scheduler.requests)} left")

    # ------------------------------------------------------------------- step
    def step(self) -> StepOutcome:
        timer, sched = self.timer, self.scheduler
        started = time.perf_counter()
        sched.top_up()
        with timer.measure("schedule"):
            scheduled, meta = sched.schedule()
        if self.watch is not None:
            self.watch.on_meta(meta)
        if self.oracle is not None:
            self.oracle.on_schedule(scheduled, sched.requests, meta)
        batch = self.ranks[0].forward.slots(scheduled.chunks)
        written = set(batch.written_blocks)
        if meta is not None:
            for request_meta in meta.request_meta.values():
                written.update(request_meta.load_block_ids)
                for group_ids in request_meta.load_group_block_ids:
                    written.update(block for block in group_ids if block != NULL_BLOCK)
        finished_ids = set(scheduled.view.finished_req_ids)
        reports: collections.Counter[str] = collections.Counter()
        recv_reports: collections.Counter[str] = collections.Counter()
        failed_blocks: set[int] = set()
        failed_recving: set[str] = set()
        for rank_index, rank in enumerate(self.ranks):
            sending, errors = self._worker_step(rank_index, rank, meta, batch, written, finished_ids, scheduled)
            reports.update(sending)
            failed_blocks |= errors
            if rank.connector is not None:
                recv_reports.update(rank.recving)
                failed_recving |= rank.failed_recving
        with timer.measure("update"):
            outcome = sched.update(scheduled, reports, failed_blocks, recv_reports, failed_recving)
        if self.watch is not None:
            assert self.scheduler_connector is not None
            self.watch.record(outcome.violations)
            self.watch.on_finished(outcome.finished, outcome.freed_after_reports)
            self._take_oracle_violations()
            with timer.measure("invariants"):
                self.watch.end_step(
                    self.scheduler_connector, self._connectors(), sched.pool.free_blocks(),
                    freed_by_preemption=sched.pool.freed_at_once(),
                )
        timer.add("step", time.perf_counter() - started)
        timer.end_step()
        self.steps += 1
        return outcome

    def _worker_step(
        self, rank_index: int, rank: _Rank, meta: Any, batch: Any, written: set[int], finished_ids: set[str], scheduled: Any
    ) -> tuple[set[str], set[int]]:
        """One rank's half of the step, in the V1 runner's order."""
        timer, connector, probe, forward = self.timer, rank.connector, rank.probe, rank.forward
        layer_names = forward.layer_names
        if connector is None or probe is None:
            with timer.measure("compute"):
                forward.begin(batch)
                for index in range(len(layer_names)):
                    forward.layer(index, batch)
                forward.finish()
            return set(), set()
        watch = self.watch
        task_requests = {}
        task_blocks = {}
        if watch is not None:
            task_requests = {p.task.task_id: p.request_ids for p in connector._pending_dump_tasks}
            task_blocks = {p.task.task_id: frozenset(p.block_ids) for p in connector._pending_dump_tasks}
        probe.phase = "handle_preemptions"
        with timer.measure("handle_preemptions"):
            connector.handle_preemptions(meta)
        if watch is not None:
            watch.before_writes(rank_index, connector, written)
        probe.phase = "load"
        with timer.measure("bind"):
            connector.bind_connector_metadata(meta)
        with timer.measure("start_load_kv"):
            connector.start_load_kv()
        tasks_before_save = {p.task.task_id for p in connector._pending_dump_tasks} if self.oracle is not None else set()
        failures_before = connector.inner.submit_failures
        with timer.measure("compute"):
            forward.begin(batch)
        for index, name in enumerate(layer_names):
            with timer.measure("wait_for_layer_load"):
                connector.wait_for_layer_load(name)
            with timer.measure("compute"):
                forward.layer(index, batch)
            with timer.measure("save_kv_layer"):
                connector.save_kv_layer(name, forward.kv_caches[name])
        with timer.measure("compute"):
            forward.finish()
        if self.config.defer_finalize:
            sending, recving = self._get_finished(probe, connector, finished_ids)
            self._wait_for_save(rank_index, probe, connector, meta, tasks_before_save, failures_before)
        else:
            self._wait_for_save(rank_index, probe, connector, meta, tasks_before_save, failures_before)
            sending, recving = self._get_finished(probe, connector, finished_ids)
        with timer.measure("get_finished"):
            errors = connector.get_block_ids_with_load_errors()
            rank.failed_recving = connector.take_failed_recving()
        rank.recving = set(recving or ())
        if meta is not None:
            rank.async_loads.update((r, m) for r, m in meta.request_meta.items() if m.load_async)
        if self.oracle is not None:
            assert watch is not None
            async_loads = self.config.connector is not None and self.config.connector.load_async
            if recving and not async_loads:
                watch.record([f"NoAsyncLoads (Python-only): rank {rank_index} reported finished_recving {sorted(recving)}"])
            sync_meta = dataclasses.replace(
                meta, request_meta={r: m for r, m in meta.request_meta.items() if not m.load_async}
            ) if meta is not None else meta
            self.oracle.check_loads(rank_index, sync_meta, set(errors), self.scheduler.requests, forward.kv_caches)
            self._check_received(rank_index, rank, set(errors))
            if connector.inner.verify_mismatches:
                watch.record([
                    f"VerifyDumps (Python-only): rank {rank_index} counted {connector.inner.verify_mismatches} changed block(s)"
                ])
        with timer.measure("bind"):
            connector.clear_connector_metadata()
        probe.phase = ""
        waits = probe.take_waits()
        if watch is not None:
            freed = meta.freed_block_ids if meta is not None else frozenset()
            watch.on_waits(
                rank_index, waits, task_requests, scheduled.view.preempted_req_ids, task_blocks=task_blocks, freed=freed
            )
            watch.on_get_finished(rank_index, finished_ids, sending)
        return set(sending or ()), set(errors)

    def _check_received(self, rank_index: int, rank: _Rank, errors: set[int]) -> None:
        """Every load this rank reported received: its request still holds the blocks the load wrote (vLLM
        frees them only after every rank's report), and they hold the stored bytes (failed blocks excepted)."""
        assert self.oracle is not None and self.watch is not None
        for req_id in sorted(rank.recving):
            dispatch = rank.async_loads.pop(req_id, None)
            request = self.scheduler.requests.get(req_id)
            if dispatch is None:
                self.watch.record([f"NoUnexpectedReportInv: rank {rank_index} reported {req_id} received, no load sent"])
                continue
            loaded = set(dispatch.load_block_ids).union(*dispatch.load_group_block_ids) - {NULL_BLOCK}
            if request is None or not loaded <= set(request.held_blocks()):
                self.watch.record([
                    f"LoadIntoFreedBlock (Python-only): rank {rank_index} wrote {req_id}'s load into blocks it no "
                    "longer holds"
                ])
                continue
            if req_id not in rank.failed_recving:
                meta = DeferDumpMetadata({req_id: dispatch})
                self.oracle.check_loads(rank_index, meta, errors, self.scheduler.requests, rank.forward.kv_caches)

    def _wait_for_save(
        self, rank_index: int, probe: ProbeStore, connector: OuterConnector, meta: DeferDumpMetadata,
        tasks_before: set[int], failures_before: int,
    ) -> None:
        """`wait_for_save`; under the oracle, check it submitted (or tried) every dump slice it was given but
        those of requests whose load failed on this rank in this step (computed over the failed blocks and
        rolled back by vLLM: a correct connector leaves them out)."""
        probe.phase = "wait_for_save"
        with self.timer.measure("wait_for_save"):
            connector.wait_for_save()
            if self.config.mode is Mode.BLOCKING:
                probe.phase = "blocking_drain"  # pre-PR: the step pays for the whole dump here
                connector.handle_preemptions(set(connector.inner.pending_request_ids()))
        inner = connector.inner
        if self.oracle is None or (self.config.connector is not None and self.config.connector.is_mla and rank_index != 0) or inner.submit_failures != failures_before:
            return
        covered: frozenset[str] = frozenset().union(
            *(p.request_ids for p in inner._pending_dump_tasks if p.task.task_id not in tasks_before)
        )
        load_errors = inner._load_error_block_ids  # this step's, not yet collected by the engine
        failed_loads = {
            req_id for req_id, m in meta.request_meta.items() if not load_errors.isdisjoint(m.load_block_ids)
        }
        missing = meta.dump_req_ids() - covered - failed_loads
        if missing:
            assert self.watch is not None
            self.watch.record([
                f"DumpAttempted (Python-only): rank {rank_index} neither submitted nor attempted dumps of {sorted(missing)}"
            ])

    def _get_finished(
        self, probe: ProbeStore, connector: OuterConnector, finished_ids: set[str]
    ) -> tuple[set[str] | None, set[str] | None]:
        probe.phase = "get_finished"
        with self.timer.measure("get_finished"):
            return connector.get_finished(finished_ids)

    # ------------------------------------------------------- environment moves
    def abort(self, req_id: str) -> bool:
        """A client aborts `req_id` between steps; returns `request_finished`'s answer (delay the free)."""
        outcome = self.scheduler.abort(req_id)
        if self.watch is not None:
            self.watch.record(outcome.violations)
            self.watch.on_finished(outcome.finished, ())
        return outcome.finished[req_id]

    def check(self) -> None:
        """Raise `InvariantViolation` with every violation seen so far and those of the state now."""
        if self.watch is None or self.scheduler_connector is None:
            raise ValueError("check needs a loop built with check_invariants")
        self._take_oracle_violations()
        pool = self.scheduler.pool
        now = check_snapshot(self.watch.snapshot(
            self.scheduler_connector, self._connectors(), pool.free_blocks(), pool.freed_at_once(), self.shut_down
        ))
        if self.watch.violation_count or now:
            raise InvariantViolation(self.watch.messages + now)

    def _take_oracle_violations(self) -> None:
        if self.oracle is not None and self.watch is not None and self.oracle.violations:
            self.watch.record(self.oracle.violations)
            self.oracle.violations = []

    def drain_and_shutdown(self, max_steps: int = 8) -> ShutdownReport:
        """Abort every live request, step until every delayed free happened or `max_steps` passed (bounded
        liveness), then shut every connector down; what is left is recorded as violations."""
        for request in self.scheduler.unfinished():
            self.abort(request.req_id)
        for _ in range(max_steps):
            if self.scheduler.idle():
                break
            self.step()
        held = sorted(r.req_id for r in self.scheduler.requests.values() if r.status in (Status.HELD, Status.HELD_RECV))
        report = self.shutdown()
        if self.watch is not None:
            if held:
                self.watch.record([f"Liveness (Python-only): delayed frees never completed for {held}"])
            if report.pending_tasks or (self.store is not None and self.store.stats().pending):
                self.watch.record([
                    f"Shutdown (Python-only): {report.pending_tasks} dump task(s) pending, store has "
                    f"{self.store.stats().pending if self.store is not None else 0} never waited"
                ])
        return report

    # --------------------------------------------------------------- shutdown
    def _connectors(self) -> list[OuterConnector]:
        return [rank.connector for rank in self.ranks if rank.connector is not None]

    def shutdown(self) -> ShutdownReport:
        """Shut every worker connector down (draining its tasks) and report what is left anywhere."""
        if self.shut_down:
            raise RuntimeError("StepLoop.shutdown called twice")
        self.shut_down = True
        connectors = self._connectors()
        for connector in connectors:
            connector.shutdown()
        for copy_device in self._devices:
            copy_device.close()
        if self.watch is not None and self.scheduler_connector is not None:
            self._take_oracle_violations()
            self.watch.end_step(
                self.scheduler_connector, connectors, self.scheduler.pool.free_blocks(),
                freed_by_preemption=self.scheduler.pool.freed_at_once(), shut_down=True,
            )
        sched = self.scheduler
        alive = sum(len(r.held_blocks()) for r in sched.requests.values())
        tracked = sum(len(c._async_dump_req_ids) for c in connectors)
        if self.scheduler_connector is not None:
            tracked += len(self.scheduler_connector._async_dump_req_ids)
        inner = [c.inner for c in connectors]
        return ShutdownReport(
            pending_tasks=sum(len(c._pending_dump_tasks) for c in connectors),
            live_event_handles=sum(c.events.live() for c in connectors),
            leaked_event_handles=sum(c.events.leaked for c in connectors),
            leaked_blocks=sched.pool.num_usable - sched.pool.num_free - alive,
            held_requests=sum(1 for r in sched.requests.values() if r.status in (Status.HELD, Status.HELD_RECV)),
            tracked_left=tracked if sched.idle() else 0,
            verify_mismatches=sum(c.verify_mismatches for c in inner),
            submit_failures=sum(c.submit_failures for c in inner),
            wait_failures=sum(c.wait_failures for c in inner),
            steps=self.steps,
        )
