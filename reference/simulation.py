"""A miniature vLLM engine around the real connectors, for property tests and soak runs.

It plays vLLM's part exactly where the deferred-dump protocol depends on it (vLLM 0.32's
V1 scheduler, worker step and `KVOutputAggregator`): a block pool that frees a preempted request's blocks at once and reuses the
most recently freed block first; chunked prefill under a token budget; the V1 worker step order
(`handle_preemptions` → bind → loads → per-layer forward writes and `save_kv_layer` → `wait_for_save` →
`get_finished` → load errors → clear); the output aggregator that frees a delayed request once every rank
reported it. The KV caches are real int32 tensors whose every slot encodes (token, position, rank, layer),
and dump copies read their blocks as late as possible (`DeferredCpuDevice`), so a block rewritten while its
dump was incomplete is caught twice: structurally (`check_block_writes`) and in the stored bytes.

Store tasks finish only when the driver says so (`ManualStore`): `complete_task`, `fail_task`,
`inject_submit_failure`, `set_check_failure` are the environment's moves.
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence

import torch

from deferdump.reference.config import ConnectorConfig
from deferdump.reference.connectors import OuterConnector, Role
from deferdump.reference.devices import DeferredCpuDevice
from deferdump.reference.hashing import layer_key, prefix_block_hashes, rank_key
from deferdump.reference.invariants import (
    InvariantViolation,
    PoolState,
    RankState,
    SchedulerState,
    SystemSnapshot,
    check_block_writes,
    check_snapshot,
    rank_state,
)
from deferdump.reference.testing.manual_store import ManualStore
from deferdump.reference.metadata import DeferDumpMetadata
from deferdump.reference.stores.base import BlockPayload, KVStore, StoreStats, StoreTask, TaskNotFound
from deferdump.reference.views import CachedRequestView, NewRequestView, RequestView, StepView

TOKEN_VOCAB = 50


class RecordingPayload:
    """Wraps a dump's payload to see the bytes the store actually consumed (checked against the source)."""

    def __init__(self, inner: BlockPayload, keys: tuple[bytes, ...], sink: "ProtocolSimulation") -> None:
        self._inner = inner
        self._keys = keys
        self._sink = sink
        self._seen = False

    def done(self) -> bool:
        return self._inner.done()

    def result(self) -> torch.Tensor:
        rows = self._inner.result()
        if not self._seen:
            self._seen = True
            self._sink._check_stored_rows(self._keys, rows)
        return rows


class RecordingStore(KVStore):
    """One rank's view of the shared `ManualStore`: records each wait's phase and whether its task had finished."""

    def __init__(self, inner: ManualStore, sink: "ProtocolSimulation") -> None:
        self.inner = inner
        self.phase = "idle"
        self.waits: list[tuple[str, int, bool]] = []  # (phase, task id, finished before the wait)
        self._sink = sink

    def lookup_prefix(self, block_hashes: Sequence[bytes]) -> int:
        return self.inner.lookup_prefix(block_hashes)

    def dump(self, block_hashes: Sequence[bytes], payload: BlockPayload) -> StoreTask:
        return self.inner.dump(block_hashes, RecordingPayload(payload, tuple(block_hashes), self._sink))

    def load(self, block_hashes: Sequence[bytes]) -> StoreTask:
        return self.inner.load(block_hashes)

    def check(self, task: StoreTask) -> bool:
        return self.inner.check(task)

    def wait(self, task: StoreTask, timeout: float | None = None) -> torch.Tensor | None:
        try:
            finished = self.inner.finished(task)
        except TaskNotFound:
            finished = True  # the inner wait raises TaskNotFound itself
        self.waits.append((self.phase, task.task_id, finished))
        return self.inner.wait(task, timeout)

    def stats(self) -> StoreStats:
        return self.inner.stats()


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Shape of one simulated deployment."""

    variant: str = "direct"  # direct | layerwise | cp
    use_layerwise: bool = False  # cp only
    is_mla: bool = False
    world_size: int = 2
    block_size: int = 2
    num_blocks: int = 8
    num_layers: int = 2
    token_budget: int = 6
    verify_dumps: bool = False
    defer_finalize: bool = False  # spec-decode order: get_finished runs before this step's wait_for_save

    def connector_config(self) -> ConnectorConfig:
        return ConnectorConfig(
            variant=self.variant,
            block_size=self.block_size,
            cp_world_size=self.world_size if self.variant == "cp" else 1,
            use_layerwise=self.use_layerwise,
            is_mla=self.is_mla,
            verify_dumps=self.verify_dumps,
        )


@dataclasses.dataclass
class SimRequest:
    req_id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    output: list[int] = dataclasses.field(default_factory=list)
    state: str = "waiting"  # waiting | running | finished
    blocks: list[int] = dataclasses.field(default_factory=list)
    num_computed: int = 0
    resumed: bool = False
    oracle_processed: int = 0  # the test's own model of the plan's token_processed
    oracle_tokens: int = 0

    @property
    def all_tokens(self) -> tuple[int, ...]:
        return self.prompt + tuple(self.output)


@dataclasses.dataclass
class _Schedule:
    view: StepView
    scheduled: dict[str, int]  # req id -> tokens this step
    start: dict[str, int]  # req id -> num_computed at schedule time
    dump_ids: frozenset[str]  # oracle: requests this step must give a dump slice


class ProtocolSimulation:
    """Scheduler + `world_size` worker ranks on one shared `ManualStore`; see the module docstring."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.store = ManualStore(auto_complete_on_wait=True)
        connector_config = config.connector_config()
        self.scheduler = OuterConnector(connector_config, Role.SCHEDULER, store=self.store)
        self.layers = [f"layer.{i}" for i in range(config.num_layers)]
        self.recorders = [RecordingStore(self.store, self) for _ in range(config.world_size)]
        self.kv = [
            {name: torch.zeros(config.num_blocks, 1, config.block_size, 2, dtype=torch.int32) for name in self.layers}
            for _ in range(config.world_size)
        ]
        self.workers = []
        for rank in range(config.world_size):
            worker = OuterConnector(
                connector_config, Role.WORKER, store=self.recorders[rank], device=DeferredCpuDevice(),
                rank=rank, world_size=config.world_size,
            )
            worker.register_kv_caches(self.kv[rank], config.num_blocks)
            self.workers.append(worker)
        self.free_blocks: list[int] = list(range(config.num_blocks))  # the end is reused first
        self.freed_by_preemption: set[int] = set()
        self.requests: dict[str, SimRequest] = {}
        self.waiting: list[str] = []
        self.running: list[str] = []
        self.delayed: dict[str, list[int]] = {}
        self.finished_since_schedule: set[str] = set()
        self.finish_answers: dict[str, bool] = {}
        self.had_dumps: set[str] = set()
        self.freed_after_reports: set[str] = set()
        self.report_counts: Counter[str] = Counter()
        self.reports: list[Counter[str]] = [Counter() for _ in range(config.world_size)]
        self.passed: list[set[str]] = [set() for _ in range(config.world_size)]
        self.incomplete_save_waits = [0] * config.world_size
        self.preemption_waits: list[list[tuple[frozenset[str], frozenset[str]]]] = [
            [] for _ in range(config.world_size)
        ]
        self.expected_rows: dict[bytes, torch.Tensor] = {}
        self.violations: list[str] = []
        self.steps = 0
        self.shut_down = False
        self._next_id = 0

    # ------------------------------------------------------------ environment
    def add_request(self, base: int, length: int, max_new_tokens: int) -> str:
        """A request whose prompt is a prefix of base sequence `base` (shared prefixes give store hits)."""
        req_id = f"r{self._next_id}"
        self._next_id += 1
        prompt = tuple((base * 17 + i * 5 + (i * i) % 7) % TOKEN_VOCAB for i in range(length))
        self.requests[req_id] = SimRequest(req_id, prompt, max_new_tokens)
        self.waiting.append(req_id)
        return req_id

    def unfinished(self) -> list[str]:
        return [r for r in self.requests if self.requests[r].state != "finished"]

    def abort(self, req_id: str) -> None:
        self._finish(req_id)

    def dump_tasks(self) -> list[StoreTask]:
        return [task for task in self.store.pending_tasks() if task.kind == "dump"]

    def complete_task(self, task: StoreTask) -> None:
        self.store.complete(task)

    def fail_task(self, task: StoreTask) -> None:
        self.store.fail(task)

    def inject_submit_failure(self) -> None:
        self.store.submit_fail_next += 1

    def set_check_failure(self, failing: bool) -> None:
        self.store.check_fail = failing

    # ------------------------------------------------------------------ steps
    def step(self) -> DeferDumpMetadata:
        """One engine step: schedule, build metadata, run every rank, aggregate, process outputs."""
        self.steps += 1
        schedule = self._schedule()
        meta = self.scheduler.build_connector_meta(schedule.view)
        if meta.dump_req_ids() != schedule.dump_ids:
            self.violations.append(
                f"DumpPlan (Python-only): step {self.steps} gave dump slices to {sorted(meta.dump_req_ids())}, "
                f"expected {sorted(schedule.dump_ids)}"
            )
        for rid, dispatch in meta.request_meta.items():
            if len(dispatch.dump_block_ids) * self._hashes_per_block != len(dispatch.dump_hashes):
                self.violations.append(f"DumpPlan (Python-only): {rid}'s dump hashes and blocks disagree")
        reported: list[set[str]] = []
        for rank in range(self.config.world_size):
            reported.append(self._run_worker(rank, meta, schedule))
        self._aggregate(reported)
        self._process_outputs(schedule)
        return meta

    @property
    def _hashes_per_block(self) -> int:
        return self.config.world_size if self.config.variant == "cp" else 1

    def _schedule(self) -> _Schedule:
        bs = self.config.block_size
        budget = self.config.token_budget
        scheduled: dict[str, int] = {}
        start: dict[str, int] = {}
        new_views: list[NewRequestView] = []
        cached_views: list[CachedRequestView] = []
        preempted: set[str] = set()
        i = 0
        while i < len(self.running) and budget > 0:
            rid = self.running[i]
            req = self.requests[rid]
            n = min(budget, len(req.all_tokens) - req.num_computed)
            need = math.ceil((req.num_computed + n) / bs) - len(req.blocks)
            preempted_self = False
            while need > len(self.free_blocks):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.add(victim)
                if victim == rid:
                    preempted_self = True
                    break
            if preempted_self:
                break
            allocated = self._allocate(need)
            req.blocks.extend(allocated)
            scheduled[rid], start[rid] = n, req.num_computed
            cached_views.append(CachedRequestView(rid, tuple(allocated), False, req.num_computed, n))
            budget -= n
            i += 1
        while not preempted and self.waiting and budget > 0:
            rid = self.waiting[0]
            req = self.requests[rid]
            view = self._view(req)
            external, load_async = self.scheduler.get_num_new_matched_tokens(view, 0)
            assert not load_async
            n = min(budget, len(req.all_tokens) - external)
            need = math.ceil((external + n) / bs)
            if need > len(self.free_blocks):
                break
            allocated = self._allocate(need)
            self.scheduler.update_state_after_alloc(view, allocated, external)
            self.waiting.pop(0)
            self.running.append(rid)
            req.state, req.blocks, req.num_computed = "running", list(allocated), external
            req.oracle_processed = math.ceil(external / bs) * bs
            req.oracle_tokens = len(req.all_tokens)
            self._expect_blocks_of(req)
            if req.resumed:
                cached_views.append(CachedRequestView(rid, tuple(allocated), True, external, n))
            else:
                new_views.append(NewRequestView(rid, req.all_tokens, len(req.prompt), tuple(allocated), external, n))
            req.resumed = False
            scheduled[rid], start[rid] = n, external
            budget -= n
        dump_ids = set()
        for rid, n in scheduled.items():
            req = self.requests[rid]
            if req.oracle_processed < req.oracle_tokens:
                first = req.oracle_processed // bs
                last = min((req.oracle_processed + n) // bs, req.oracle_tokens // bs)
                if last > first:
                    dump_ids.add(rid)
                req.oracle_processed += n
        self.had_dumps |= dump_ids
        finished, self.finished_since_schedule = frozenset(self.finished_since_schedule), set()
        view = StepView(tuple(new_views), tuple(cached_views), finished, frozenset(preempted))
        return _Schedule(view, scheduled, start, frozenset(dump_ids))

    def _run_worker(self, rank: int, meta: DeferDumpMetadata, schedule: _Schedule) -> set[str]:
        """vLLM's V1 worker step order on one rank."""
        conn, recorder = self.workers[rank], self.recorders[rank]
        inner = conn.inner
        tasks_before = {p.task.task_id: p.request_ids for p in inner._pending_dump_tasks}
        recorder.phase, mark = "preempt", len(recorder.waits)
        conn.handle_preemptions(meta)
        for _, task_id, _ in recorder.waits[mark:]:
            self.preemption_waits[rank].append((tasks_before.get(task_id, frozenset()), meta.preempted_req_ids))
        conn.bind_connector_metadata(meta)
        recorder.phase = "load"
        conn.start_load_kv()
        tasks_before_save = {p.task.task_id for p in inner._pending_dump_tasks}
        failures_before = inner.submit_failures
        for layer_index, layer in enumerate(self.layers):
            conn.wait_for_layer_load(layer)
            writes = self._forward_writes(rank, layer_index, schedule)
            self._write(rank, layer, writes)
            conn.save_kv_layer(layer)
        if self.config.defer_finalize:
            sending = self._report_finished(rank, schedule)
            self._save(rank, meta, tasks_before_save, failures_before)
        else:
            self._save(rank, meta, tasks_before_save, failures_before)
            sending = self._report_finished(rank, schedule)
        errors = conn.get_block_ids_with_load_errors()
        self._check_loads(rank, meta, errors)
        conn.clear_connector_metadata()
        recorder.phase = "idle"
        if inner.verify_mismatches:
            self.violations.append(f"VerifyDumps (Python-only): rank {rank} counted {inner.verify_mismatches} changed block(s)")
        return sending

    def _save(self, rank: int, meta: DeferDumpMetadata, tasks_before: set[int], failures_before: int) -> None:
        """`wait_for_save`, checking it waited no unfinished task and submitted (or tried) every dump slice."""
        conn, recorder = self.workers[rank], self.recorders[rank]
        inner = conn.inner
        recorder.phase, mark = "save", len(recorder.waits)
        conn.wait_for_save()
        self.incomplete_save_waits[rank] += sum(1 for _, _, finished in recorder.waits[mark:] if not finished)
        if not (self.config.is_mla and rank != 0) and inner.submit_failures == failures_before:
            covered: frozenset[str] = frozenset().union(
                *(p.request_ids for p in inner._pending_dump_tasks if p.task.task_id not in tasks_before)
            )
            missing = meta.dump_req_ids() - covered
            if missing:
                self.violations.append(
                    f"DumpAttempted (Python-only): rank {rank} neither submitted nor attempted dumps of {sorted(missing)}"
                )

    def _report_finished(self, rank: int, schedule: _Schedule) -> set[str]:
        """`get_finished` with this step's finished ids; records what the rank reported."""
        conn, recorder = self.workers[rank], self.recorders[rank]
        recorder.phase = "finished"
        finished = schedule.view.finished_req_ids
        self.passed[rank] |= finished
        sending, receiving = conn.get_finished(set(finished))
        if receiving:
            self.violations.append(f"NoAsyncLoads (Python-only): rank {rank} reported finished_recving {sorted(receiving)}")
        for rid in sending or ():
            self.reports[rank][rid] += 1
        return set(sending or ())

    def _aggregate(self, reported: list[set[str]]) -> None:
        """vLLM's KVOutputAggregator: a request is freed once every rank reported it."""
        for ids in reported:
            self.report_counts.update(ids)
        for rid, count in list(self.report_counts.items()):
            if count < self.config.world_size:
                continue
            del self.report_counts[rid]
            if rid not in self.delayed:
                self.violations.append(f"NoUnexpectedReportInv: {rid} reported by every rank but its free was not delayed")
                continue
            self._free(self.delayed.pop(rid), by_preemption=False)
            self.freed_after_reports.add(rid)

    def _process_outputs(self, schedule: _Schedule) -> None:
        for rid, n in schedule.scheduled.items():
            req = self.requests[rid]
            if req.state != "running":
                continue
            req.num_computed += n
            if req.num_computed == len(req.all_tokens):
                req.output.append((sum(req.all_tokens) * 31 + len(req.all_tokens)) % TOKEN_VOCAB)
                if len(req.output) >= req.max_new_tokens:
                    self._finish(rid)

    # ------------------------------------------------------------- block pool
    def _allocate(self, count: int) -> list[int]:
        blocks = [self.free_blocks.pop() for _ in range(count)]
        self.freed_by_preemption.difference_update(blocks)
        return blocks

    def _free(self, blocks: Sequence[int], *, by_preemption: bool) -> None:
        for block in blocks:
            self.free_blocks.append(block)
            if by_preemption:
                self.freed_by_preemption.add(block)
            else:
                self.freed_by_preemption.discard(block)

    def _preempt(self, rid: str) -> None:
        """vLLM `_preempt_request`: blocks freed at once, no request_finished, back to the front of waiting."""
        req = self.requests[rid]
        self._free(req.blocks, by_preemption=True)
        req.blocks, req.num_computed, req.state, req.resumed = [], 0, "waiting", True
        self.waiting.insert(0, rid)

    def _finish(self, rid: str) -> None:
        """vLLM `_free_request` (stop or abort): ask the connector, then free now or hold for its reports."""
        req = self.requests[rid]
        delay, params = self.scheduler.request_finished(self._view(req), tuple(req.blocks))
        if params is not None:
            self.violations.append(f"RequestFinished (Python-only): {rid} returned kv_transfer_params {params!r}")
        self.finish_answers[rid] = delay
        if rid in self.running:
            self.running.remove(rid)
        if rid in self.waiting:
            self.waiting.remove(rid)
        if delay:
            self.delayed[rid] = req.blocks
        else:
            self._free(req.blocks, by_preemption=False)
        req.blocks, req.state = [], "finished"
        self.finished_since_schedule.add(rid)

    @staticmethod
    def _view(req: SimRequest) -> RequestView:
        return RequestView(req.req_id, req.all_tokens, len(req.prompt))

    # ---------------------------------------------------------------- KV bytes
    def _slot_value(self, token: int, position: int, rank: int, layer_index: int) -> int:
        owner = 0 if self.config.is_mla else rank  # MLA: every rank holds the same KV
        return ((token * 64 + position) * 4 + owner) * 4 + layer_index + 1

    def _forward_writes(self, rank: int, layer_index: int, schedule: _Schedule) -> list[tuple[int, int, int]]:
        writes = []
        bs = self.config.block_size
        for rid, n in schedule.scheduled.items():
            req = self.requests[rid]
            tokens = req.all_tokens
            for position in range(schedule.start[rid], schedule.start[rid] + n):
                value = self._slot_value(tokens[position], position, rank, layer_index)
                writes.append((req.blocks[position // bs], position % bs, value))
        return writes

    def _write(self, rank: int, layer: str, writes: list[tuple[int, int, int]]) -> None:
        if not writes:
            return
        self.violations += check_block_writes(self._rank_state(rank), {block for block, _, _ in writes}, layer)
        tensor = self.kv[rank][layer]
        for block, slot, value in writes:
            tensor[block, 0, slot, :] = value

    def _block_rows(self, tokens: Sequence[int], block: int, rank: int, layer_indices: Sequence[int]) -> torch.Tensor:
        """The bytes block `block` of `tokens` holds on `rank` for the given layers, concatenated."""
        bs = self.config.block_size
        parts = []
        for layer_index in layer_indices:
            values = [self._slot_value(tokens[p], p, rank, layer_index) for p in range(block * bs, (block + 1) * bs)]
            slots = torch.tensor(values, dtype=torch.int32).reshape(1, bs, 1).expand(1, bs, 2).contiguous()
            parts.append(slots.view(torch.uint8).flatten())
        return torch.cat(parts)

    def _store_keys(self, hashes: Sequence[bytes], block: int, rank: int) -> list[tuple[bytes, list[int]]]:
        """(key, layer indices) under which `rank` stores block `block` — derived independently of the connector."""
        per_block = self._hashes_per_block
        key = hashes[block * per_block + (rank if per_block > 1 else 0)]
        if self.config.variant != "cp" and not self.config.is_mla and rank != 0:
            key = rank_key(key, rank)
        if self.config.variant == "layerwise" or (self.config.variant == "cp" and self.config.use_layerwise):
            return [(layer_key(key, i), [i]) for i in range(len(self.layers))]
        return [(key, list(range(len(self.layers))))]

    def _expect_blocks_of(self, req: SimRequest) -> None:
        tokens = req.all_tokens
        hashes = prefix_block_hashes(tokens, self.config.block_size, self._hashes_per_block)
        for block in range(len(tokens) // self.config.block_size):
            for rank in range(self.config.world_size):
                for key, layer_indices in self._store_keys(hashes, block, rank):
                    if key not in self.expected_rows:
                        self.expected_rows[key] = self._block_rows(tokens, block, rank, layer_indices)

    def _check_stored_rows(self, keys: Sequence[bytes], rows: torch.Tensor) -> None:
        for key, row in zip(keys, rows):
            expected = self.expected_rows.get(key)
            if expected is None:
                self.violations.append(f"StoredBytes (Python-only): a dump stored unexpected key {key.hex()[:12]}")
            elif not torch.equal(row, expected):
                self.violations.append(
                    f"StoredBytes (Python-only): key {key.hex()[:12]} stored bytes that differ from its block "
                    "(the block was rewritten while its dump read it)"
                )

    def _check_loads(self, rank: int, meta: DeferDumpMetadata, errors: set[int]) -> None:
        """Loaded blocks hold exactly the stored prefix; a block with a load error is recomputed."""
        for rid, dispatch in meta.request_meta.items():
            if not dispatch.load_block_ids:
                continue
            tokens = self.requests[rid].all_tokens
            for block, block_id in enumerate(dispatch.load_block_ids):
                expected = self._block_rows(tokens, block, rank, range(len(self.layers)))
                if block_id in errors:
                    self._recompute(rank, block_id, expected)
                    continue
                actual = torch.cat(
                    [self.kv[rank][layer][block_id].view(torch.uint8).flatten() for layer in self.layers]
                )
                if not torch.equal(actual, expected):
                    self.violations.append(f"LoadedBytes (Python-only): rank {rank} block {block_id} of {rid} differs from the store")

    def _recompute(self, rank: int, block_id: int, rows: torch.Tensor) -> None:
        self.violations += check_block_writes(self._rank_state(rank), {block_id})
        per_layer = rows.numel() // len(self.layers)
        for index, layer in enumerate(self.layers):
            tensor = self.kv[rank][layer]
            tensor[block_id].view(torch.uint8).view(-1).copy_(rows[index * per_layer : (index + 1) * per_layer])

    # ------------------------------------------------------------- invariants
    def _rank_state(self, rank: int) -> RankState:
        return rank_state(
            self.workers[rank],
            rank,
            reports=dict(self.reports[rank]),
            passed_to_get_finished=frozenset(self.passed[rank]),
            incomplete_waits_in_wait_for_save=self.incomplete_save_waits[rank],
            preemption_waits=tuple(self.preemption_waits[rank]),
        )

    def snapshot(self) -> SystemSnapshot:
        free = frozenset(self.free_blocks)
        return SystemSnapshot(
            scheduler=SchedulerState(
                tracked=frozenset(self.scheduler._async_dump_req_ids),
                finish_answers=dict(self.finish_answers),
                had_dumps=frozenset(self.had_dumps),
                freed_after_reports=frozenset(self.freed_after_reports),
            ),
            ranks=tuple(self._rank_state(rank) for rank in range(self.config.world_size)),
            pool=PoolState(free, frozenset(self.freed_by_preemption) & free),
            shut_down=self.shut_down,
        )

    def check(self) -> None:
        """Raise `InvariantViolation` listing every violation seen in steps so far or in the current state."""
        violations = self.violations + check_snapshot(self.snapshot())
        if violations:
            raise InvariantViolation(violations)

    def drain_and_shutdown(self, max_steps: int = 8) -> None:
        """Abort everything, step until every delayed free happened (liveness), then shut every connector down."""
        for rid in self.unfinished():
            self._finish(rid)
        self.set_check_failure(False)
        for _ in range(max_steps):
            if not self.delayed and not self.finished_since_schedule:
                break
            self.step()
        if self.delayed:
            self.violations.append(f"Liveness (Python-only): delayed frees never completed for {sorted(self.delayed)}")
        for worker in self.workers:
            worker.shutdown()
        self.scheduler.shutdown()
        self.shut_down = True
        leftover = [task for task in self.store.outstanding_tasks() if task.kind == "dump"]
        if leftover:
            self.violations.append(f"Shutdown (Python-only): {len(leftover)} dump task(s) never waited")
