"""The protocol core: UCM's deferred-dump connector (PR #989), on vLLM-free views and real stores/devices.

Classes and method ownership follow UCM exactly (spec/README.md, "Class names", has the table):
`DirectConnector` → `LayerWiseConnector` → `CPConnector`, with `build_connector_meta` defined ONLY in
`DirectConnector` (so CP's tracking comes from the MRO), and `OuterConnector`, a wrapper that *has* an inner
connector and forwards every method, including `request_finished`, `request_finished_all_groups`,
`get_finished`, `handle_preemptions` and `shutdown`.

Two `_async_dump_req_ids` sets exist, one per process: the scheduler's (added in `build_connector_meta` when
a request gets a dump slice, removed by `request_finished`, which then answers True = delay the free) and
each worker rank's (added in `wait_for_save` from the bound metadata *before* the MLA early return, removed by
`get_finished`, which reports exactly `finished ∩ tracked` after waiting every pending task that overlaps it).
`wait_for_save` never waits an unfinished task: it reaps finished ones and submits new ones. Every event
handle is released exactly once: after its task's wait (in `finally`) or at once when the submit fails.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from deferdump.reference.config import ConnectorConfig, make_store
from deferdump.reference.devices import CpuDevice, CudaDevice, Device, checksum_rows
from deferdump.reference.errors import ConfigError, RoleError
from deferdump.reference.events import EventRegistry
from deferdump.reference.groups import NULL_BLOCK, SINGLE_GROUP, GroupPayload, KVGroup, group_key, skipped_blocks
from deferdump.reference.hashing import layer_key, prefix_block_hashes, rank_key
from deferdump.reference.metadata import DeferDumpMetadata, RequestDispatchMeta
from deferdump.reference.metrics import ConnectorMetrics
from deferdump.reference.pending import LoadPart, PendingDumpTask, PendingLoad
from deferdump.reference.stores.base import KVStore, StagedRows, StoreTask
from deferdump.reference.views import RequestView, StepView

logger = logging.getLogger(__name__)

#: How long `get_finished` gives the store's threads in a step without a forward while an asynchronous load
#: is pending: long enough for several blocks' reads, short next to a forward (a new request waits at most
#: this long for its schedule).
IDLE_LOAD_YIELD_S = 0.001


class Role(enum.Enum):
    """Which process a connector instance lives in (vLLM `KVConnectorRole`)."""

    SCHEDULER = 0
    WORKER = 1

    @classmethod
    def coerce(cls, value: "Role | int | str | Any") -> "Role":
        """Accept our Role, vLLM's KVConnectorRole (by name), an int or a name."""
        if isinstance(value, Role):
            return value
        if isinstance(value, str):
            return cls[value.upper()]
        name = getattr(value, "name", None)
        if isinstance(name, str) and name.upper() in cls.__members__:
            return cls[name.upper()]
        return cls(int(value))


@dataclasses.dataclass
class RequestPlan:
    """Scheduler-side state of one admitted request (UCM `RequestMeta`).

    `token_processed` advances by each step's scheduled tokens; a dump slice covers the blocks that became
    full in that step, so only full prompt blocks are dumped, each exactly once per admission.
    """

    hashes: tuple[bytes, ...]  # chained hashes of every full block (× hashes_per_block under CP)
    hbm_hit_blocks: int  # blocks vLLM's own prefix cache already had
    total_hit_blocks: int  # hbm hits + store hits
    num_token_ids: int  # tokens known at lookup time
    token_processed: int
    vllm_block_ids: list[int] = dataclasses.field(default_factory=list)
    load_wanted: bool = False  # vLLM accepted external tokens: load the hit range once
    # hybrid: the other KV-cache groups' block lists (group 1 first); a freed position holds NULL_BLOCK
    group_block_ids: list[list[int]] = dataclasses.field(default_factory=list)
    # load_async: vLLM allocated the blocks and parked the request; the next metadata carries its load
    async_load_pending: bool = False
    async_loaded: bool = False  # its asynchronous load was sent: the next schedule may be a rollback

    def held_blocks(self) -> set[int]:
        """Every block the request holds now, in every group."""
        held = set(self.vllm_block_ids).union(*self.group_block_ids)
        held.discard(NULL_BLOCK)
        return held


class DirectConnector:
    """One dump task per step covering every dumping request (UCM `UCMDirectConnector`)."""

    # Whether dumps and loads go one layer at a time (store keys per layer).
    _per_layer: bool = False

    def __init__(
        self,
        config: ConnectorConfig,
        role: Role | int | str,
        *,
        store: KVStore,
        device: Device | None = None,
        rank: int = 0,
        world_size: int = 1,
        events: EventRegistry | None = None,
        metrics: ConnectorMetrics | None = None,
        owns_store: bool = False,
        groups: Sequence[KVGroup] | None = None,
        num_layers: int | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        if num_layers is not None and (isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1):
            raise ValueError(f"num_layers must be a positive integer or None, got {num_layers!r}")
        # the model's KV layers: per-layer lookups ask every layer's key (None: unknown, layer 0's only)
        self.num_layers = num_layers
        self.groups: tuple[KVGroup, ...] = tuple(groups) if groups else SINGLE_GROUP
        if self.groups[0].sliding_window is not None:
            # the first group keys the blocks and its window frees are not tracked (only the other groups'
            # are): a sliding-window first group would be dumped unfenced
            raise ConfigError("groups", "the first KV-cache group must be full attention (sliding-window groups "
                              "are supported only beside one)")
        if self.hybrid and config.variant != "direct":
            raise ConfigError("variant", f"{len(self.groups)} KV-cache groups (a hybrid model) need variant 'direct'")
        self.config = config
        self.role = Role.coerce(role)
        self.rank = rank
        self.world_size = world_size
        self.events = events if events is not None else EventRegistry()
        self.metrics = metrics if metrics is not None else ConnectorMetrics()
        # Gauges read when collected: the dump path (the forward's thread) never pays for setting them.
        self.metrics.pending_tasks.set_function(lambda: len(self._pending_dump_tasks))
        self.metrics.live_handles.set_function(self.events.live)
        self._store = store
        self._owns_store = owns_store
        self._device = device
        self._owns_device = False
        self._hashes_per_block = config.cp_world_size if config.variant == "cp" else 1
        # scheduler role
        self._request_plans: dict[str, RequestPlan] = {}
        self._freed_since: set[int] = set()  # hybrid: blocks freed since the last schedule
        self._async_dump_req_ids: set[str] = set()  # both roles: one set per process (see module doc)
        self._recving_req_ids: set[str] = set()  # scheduler: async loads sent, finished_recving not yet seen
        # worker role
        self._pending_dump_tasks: list[PendingDumpTask] = []
        self._meta: DeferDumpMetadata | None = None
        self._load_error_block_ids: set[int] = set()
        # blocks whose load failed in the bound step: kept until the next bind, because vLLM drains
        # get_block_ids_with_load_errors before a deferred wait_for_save runs
        self._step_load_error_block_ids: set[int] = set()
        self._pending_loads: dict[str, PendingLoad] = {}  # async loads submitted, not yet reported
        self._failed_recving: set[str] = set()  # hybrid: reported in finished_recving with a failed load
        self.skipped_failed_loads: frozenset[str] = frozenset()  # of the bound step (logs read it)
        self.reported_total = 0  # ids this rank reported in finished_sending
        self.submit_failures = 0
        self.wait_failures = 0
        self.verify_mismatches = 0  # blocks whose stored bytes differed from the source at submit
        self._shut_down = False
        self._store_stages = False  # the store offered rows to gather a dump into (`_stage_dump`)

    # ------------------------------------------------------------------ accessors
    @property
    def store(self) -> KVStore:
        return self._store

    @property
    def hybrid(self) -> bool:
        """Several KV-cache groups (vLLM's hybrid manager): blocks may be freed while a request runs."""
        return len(self.groups) > 1

    @property
    def device(self) -> Device | None:
        return self._device

    def pending_request_ids(self) -> frozenset[str]:
        """Requests that some pending dump task still covers on this rank."""
        return frozenset().union(*(p.request_ids for p in self._pending_dump_tasks))

    def receiving_request_ids(self) -> frozenset[str]:
        """Worker: requests whose asynchronous load is submitted and not yet reported in finished_recving.
        Scheduler: requests whose asynchronous load was sent and whose finished_recving was not yet seen."""
        return frozenset(self._pending_loads) if self.role is Role.WORKER else frozenset(self._recving_req_ids)

    def _require(self, role: Role, method: str) -> None:
        if self.role is not role:
            raise RoleError(f"{method} is a {role.name.lower()}-side method; this connector is {self.role.name}")

    def _block_size(self) -> int:
        if self.config.block_size is None:
            raise ConfigError("block_size", "is required on the scheduler side (the vLLM adapter fills it in)")
        return self.config.block_size

    # ============================================================ scheduler side
    def get_num_new_matched_tokens(self, request: RequestView, num_computed_tokens: int) -> tuple[int, bool]:
        """External tokens the store holds beyond vLLM's own prefix hit, and whether their load is asynchronous
        (config `load_async`, and only for a non-zero hit: vLLM asserts external tokens behind an async load).

        Recomputes the request's plan from scratch each call (idempotent); it never touches tracking.
        """
        self._require(Role.SCHEDULER, "get_num_new_matched_tokens")
        block_size = self._block_size()
        per_block = self._hashes_per_block
        hashes = prefix_block_hashes(request.token_ids, block_size, per_block)
        full_blocks = len(hashes) // per_block
        hbm_hit_blocks = num_computed_tokens // block_size
        if full_blocks <= hbm_hit_blocks:  # nothing beyond the HBM hit: never dumps, never tracked
            self._request_plans.pop(request.req_id, None)
            return 0, False
        shards = self._shard_ranks()
        try:
            found = self._store.lookup_prefix(self._lookup_keys(hashes[hbm_hit_blocks * per_block :]))
        except Exception as exc:  # a failed lookup is a miss (UCM)
            logger.warning("lookup for %s failed, counted as a miss: %s", request.req_id, exc)
            found = 0
        store_hits = found // (len(shards) * self._lookup_layers())  # hashes stored on every rank and layer
        total_hit_blocks = hbm_hit_blocks + store_hits // per_block
        external = max(0, total_hit_blocks * block_size - num_computed_tokens)
        if external and total_hit_blocks * block_size >= len(request.token_ids):
            external -= 1  # full hit: vLLM must compute at least the last token
        self._request_plans[request.req_id] = RequestPlan(
            hashes=tuple(hashes),
            hbm_hit_blocks=hbm_hit_blocks,
            total_hit_blocks=total_hit_blocks,
            num_token_ids=len(request.token_ids),
            token_processed=total_hit_blocks * block_size,
        )
        return external, bool(self.config.load_async and external)

    def _shard_ranks(self) -> tuple[int, ...]:
        """The ranks whose store keys differ (`_store_keys`): every TP rank stores its own shard under its
        own key; under MLA every rank loads rank 0's keys, and under CP the hashes are already per rank."""
        if self.world_size == 1 or self.config.is_mla or self.config.variant == "cp":
            return (0,)
        return tuple(range(self.world_size))

    def _lookup_layers(self) -> int:
        """How many layer keys each rank key stands for in a lookup: every layer's with per-layer dumps where
        the layer count is known, else one (the plain key, or layer 0's)."""
        return self.num_layers if self._per_layer and self.num_layers is not None else 1

    def _lookup_keys(self, hashes: Sequence[bytes]) -> list[bytes]:
        """Store keys the scheduler looks up, hash by hash: each rank's shard key (`_shard_ranks`), and for
        per-layer dumps each layer's key of it (layer 0's only where `num_layers` is unknown). A block is a
        hit only once every one of them is stored: each rank dumps its shard, and each layer, in a task of its
        own, so one key can be stored while another's dump still runs, and the load of that one would miss (a
        request failed under policy "fail"; vLLM 0.32 raises on any block-level load error under two
        KV-cache groups, scheduler.py 3365-3374). The model's lookup sees a prompt only once no dump of it
        runs, on any rank (spec/DeferDump.tla, `Visible`)."""
        keys = [rank_key(h, rank) for h in hashes for rank in self._shard_ranks()]
        if self._per_layer:
            return [layer_key(k, layer) for k in keys for layer in range(self._lookup_layers())]
        return keys

    def update_state_after_alloc(
        self, request: RequestView, block_ids: Sequence[int], num_external_tokens: int,
        group_block_ids: Sequence[Sequence[int]] = (),
    ) -> None:
        """Decide from `num_external_tokens` (not `block_ids`) whether the hit range is loaded.

        With `load_async` vLLM has parked the request without scheduling it: `block_ids` (and, hybrid, the
        other groups' `group_block_ids`) are where its load goes, sent in the next metadata."""
        plan = self._request_plans.get(request.req_id)
        if plan is None:
            return
        if num_external_tokens > 0:
            plan.load_wanted = True
            self.metrics.external_hit_tokens.inc(num_external_tokens)
            if self.config.load_async:
                plan.async_load_pending = True
                plan.vllm_block_ids[:] = block_ids
                extra = len(self.groups) - 1
                plan.group_block_ids = [list(ids) for ids in group_block_ids][:extra]
                plan.group_block_ids += [[] for _ in range(extra - len(plan.group_block_ids))]
        else:
            plan.load_wanted = False
            plan.async_load_pending = False
            plan.total_hit_blocks = plan.hbm_hit_blocks

    def _generate_dispatch_meta(
        self,
        plan: RequestPlan,
        new_tokens: int,
        new_block_ids: Sequence[int],
        need_load: bool,
        new_group_block_ids: Sequence[Sequence[int]] = (),
    ) -> RequestDispatchMeta:
        """This step's load range and dump slice for one request (UCM `_generate_dispatch_meta`).

        `need_load`: the request is new or resumed from preemption, so `new_block_ids` is its whole block
        list (vLLM resends every block of a resumed request) and its hit range may be loaded; otherwise
        they are the blocks added this step.
        """
        block_size = self._block_size()
        per_block = self._hashes_per_block
        extra_groups = len(self.groups) - 1
        new_groups = [list(ids) for ids in new_group_block_ids][:extra_groups]
        new_groups += [[] for _ in range(extra_groups - len(new_groups))]
        if need_load:  # a resumed request's old blocks are gone, even if vLLM skipped the fresh lookup
            plan.vllm_block_ids[:] = new_block_ids
            plan.group_block_ids = new_groups
        else:
            plan.vllm_block_ids.extend(new_block_ids)
            if len(plan.group_block_ids) != extra_groups:
                plan.group_block_ids = [[] for _ in range(extra_groups)]
            for held, new in zip(plan.group_block_ids, new_groups):
                held.extend(new)
        load_hashes: tuple[bytes, ...] = ()
        load_block_ids: tuple[int, ...] = ()
        load_groups: tuple[tuple[int, ...], ...] = ()
        if need_load and plan.load_wanted and plan.total_hit_blocks > plan.hbm_hit_blocks:
            hbm, total = plan.hbm_hit_blocks, plan.total_hit_blocks
            load_hashes = plan.hashes[hbm * per_block : total * per_block]
            load_block_ids = tuple(plan.vllm_block_ids[hbm:total])
            load_groups = self._group_slices(plan, hbm, total)
            plan.load_wanted = False
            if len(load_block_ids) != total - hbm:
                logger.error(
                    "load range of %d blocks has only %d vLLM blocks: not loaded", total - hbm, len(load_block_ids)
                )
                load_hashes, load_block_ids, load_groups = (), (), ()
        dump_hashes: tuple[bytes, ...] = ()
        dump_block_ids: tuple[int, ...] = ()
        dump_groups: tuple[tuple[int, ...], ...] = ()
        if plan.token_processed < plan.num_token_ids:
            start = plan.token_processed // block_size
            end = min((plan.token_processed + new_tokens) // block_size, len(plan.hashes) // per_block)
            end = min(end, len(plan.vllm_block_ids))
            if end > start:
                dump_hashes = plan.hashes[start * per_block : end * per_block]
                dump_block_ids = tuple(plan.vllm_block_ids[start:end])
                dump_groups = self._group_slices(plan, start, end)
            plan.token_processed += new_tokens
        return RequestDispatchMeta(load_hashes, load_block_ids, dump_hashes, dump_block_ids, load_groups, dump_groups)

    def _rewind_rolled_back(self, plan: RequestPlan, num_computed_tokens: int) -> None:
        """A running request whose prompt vLLM computed fewer tokens of than the plan processed was rolled
        back after a failed load (kv_load_failure_policy "recompute" truncates num_computed_tokens at the
        first failed block): the blocks it recomputes from there are dumped again, as new ones."""
        if num_computed_tokens < min(plan.token_processed, plan.num_token_ids):
            logger.info("request rolled back from %d to %d tokens: its recomputed blocks are dumped again",
                        plan.token_processed, num_computed_tokens)
            plan.token_processed = num_computed_tokens

    @staticmethod
    def _group_slices(plan: RequestPlan, start: int, end: int) -> tuple[tuple[int, ...], ...]:
        """The other groups' blocks of prompt blocks [start, end), parallel to the hashes (null where
        a group holds no block there: out of its window, or a list shorter than the full group's)."""
        return tuple(
            tuple(ids[i] if i < len(ids) else NULL_BLOCK for i in range(start, end)) for ids in plan.group_block_ids
        )

    def _record_schedule_frees(self, step: StepView) -> None:
        """The blocks vLLM frees in this schedule before allocating: every block of a preempted request,
        and the sliding-window blocks of each scheduled running request that left the window."""
        for req_id in step.preempted_req_ids:
            plan = self._request_plans.get(req_id)
            if plan is not None:
                self._freed_since |= plan.held_blocks()
        for cached in step.cached_requests:
            plan = self._request_plans.get(cached.req_id)
            if plan is not None and not cached.resumed_from_preemption:
                self._free_out_of_window(plan, cached.num_computed_tokens)

    def _free_out_of_window(self, plan: RequestPlan, num_computed_tokens: int) -> None:
        """Record the sliding-window blocks vLLM frees before allocating this step (`allocate_slots` ->
        `remove_skipped_blocks`, on the tokens computed before the step) and null them in the plan."""
        block_size = self._block_size()
        for group, held in zip(self.groups[1:], plan.group_block_ids):
            if group.sliding_window is None:
                continue
            for index in range(min(skipped_blocks(num_computed_tokens, group.sliding_window, block_size), len(held))):
                if held[index] != NULL_BLOCK:
                    self._freed_since.add(held[index])
                    held[index] = NULL_BLOCK

    def build_connector_meta(self, step: StepView) -> DeferDumpMetadata:
        """Once per schedule: each scheduled request's load/dump ranges; track requests given a dump slice.

        Defined only here: LayerWise and CP inherit it by the MRO, and with it the tracking.
        """
        self._require(Role.SCHEDULER, "build_connector_meta")
        dispatch: dict[str, RequestDispatchMeta] = {}
        if self.hybrid:  # frees of this schedule, before its allocations (vLLM's order)
            self._record_schedule_frees(step)
        for new in step.new_requests:
            plan = self._request_plans.get(new.req_id)
            if plan is not None:
                self._scheduled_after_alloc(plan, new.num_computed_tokens)
                dispatch[new.req_id] = self._generate_dispatch_meta(
                    plan, new.num_scheduled_tokens, new.block_ids, True, new.group_block_ids
                )
        for cached in step.cached_requests:
            plan = self._request_plans.get(cached.req_id)
            if plan is None:
                continue
            if cached.resumed_from_preemption:
                self._scheduled_after_alloc(plan, cached.num_computed_tokens)
            else:
                self._rewind_rolled_back(plan, cached.num_computed_tokens)
            dispatch[cached.req_id] = self._generate_dispatch_meta(
                plan, cached.num_scheduled_tokens, cached.new_block_ids, cached.resumed_from_preemption,
                cached.new_group_block_ids,
            )
        for req_id, plan in self._request_plans.items():
            if plan.async_load_pending and req_id not in dispatch:  # parked by vLLM: load it beside the forward
                dispatch[req_id] = self._async_load_meta(req_id, plan)
        for req_id in step.finished_req_ids:
            self._request_plans.pop(req_id, None)
        dispatch = {req_id: meta for req_id, meta in dispatch.items() if meta.has_load() or meta.has_dump()}
        freed, self._freed_since = frozenset(self._freed_since), set()
        metadata = DeferDumpMetadata(dispatch, frozenset(step.preempted_req_ids), freed_block_ids=freed,
                                     forward=bool(step.new_requests or step.cached_requests))
        self._track_async_dump_requests(metadata)
        return metadata

    def _scheduled_after_alloc(self, plan: RequestPlan, num_computed_tokens: int) -> None:
        """A new or resumed request is scheduled. Parked for an asynchronous load that was never sent, vLLM
        scheduled it at once after all: the load goes synchronously, before this forward (`load_wanted`
        stays). After a sent asynchronous load, `num_computed_tokens` a block or more below the loaded range
        means the load failed and vLLM rolled it back (`_update_requests_with_invalid_blocks` truncates at the
        first failed block; a failed receive restarts at 0): the blocks it computes from there are dumped."""
        plan.async_load_pending = False
        if plan.async_loaded:
            plan.async_loaded = False
            if num_computed_tokens + self._block_size() <= plan.token_processed:
                logger.info("asynchronous load rolled back from %d to %d tokens: the recomputed blocks are dumped",
                            plan.token_processed, num_computed_tokens)
                plan.token_processed = num_computed_tokens

    def _async_load_meta(self, req_id: str, plan: RequestPlan) -> RequestDispatchMeta:
        """The load of a request vLLM parked in WAITING_FOR_REMOTE_KVS, into the blocks it allocated.

        From here the load is the request's only transfer until vLLM sees its finished_recving: any dump
        tracked from before a preemption was waited at that preemption, so the request leaves the dump
        tracking (the worker's too, when it submits the load), and a finish meanwhile is delayed by vLLM
        itself, never by `request_finished` (a delayed free answered twice would free twice)."""
        plan.async_load_pending = False
        plan.load_wanted = False
        hbm, total, per_block = plan.hbm_hit_blocks, plan.total_hit_blocks, self._hashes_per_block
        block_ids = tuple(plan.vllm_block_ids[hbm:total])
        if total <= hbm or len(block_ids) != total - hbm:
            logger.error("async load range of %d blocks has %d vLLM blocks: not loaded", total - hbm, len(block_ids))
            return RequestDispatchMeta()
        plan.async_loaded = True
        self._recving_req_ids.add(req_id)
        self._async_dump_req_ids.discard(req_id)
        return RequestDispatchMeta(
            load_hashes=plan.hashes[hbm * per_block : total * per_block],
            load_block_ids=block_ids,
            load_group_block_ids=self._group_slices(plan, hbm, total),
            load_async=True,
        )

    def _track_async_dump_requests(self, metadata: DeferDumpMetadata) -> None:
        self._async_dump_req_ids |= metadata.dump_req_ids()

    def update_connector_output(self, finished_recving: Iterable[str] = ()) -> None:
        """vLLM's aggregated worker output: a request reported in finished_recving is no longer receiving
        (vLLM schedules it, or, finished meanwhile, frees its blocks now)."""
        self._recving_req_ids.difference_update(finished_recving)

    def request_finished(self, request: RequestView, block_ids: Sequence[int]) -> tuple[bool, dict[str, Any] | None]:
        """True (delay the free) iff the request was given a dump slice; `block_ids` is ignored.

        A request whose asynchronous load is still running answers False: vLLM delays that free itself until
        finished_recving (scheduler.py `finish_requests`: `delay_free_blocks` for WAITING_FOR_REMOTE_KVS)."""
        if request.req_id in self._recving_req_ids:
            self._async_dump_req_ids.discard(request.req_id)
            return False, None
        if request.req_id in self._async_dump_req_ids:
            self._async_dump_req_ids.discard(request.req_id)
            return True, None
        return False, None

    def request_finished_all_groups(
        self, request: RequestView, block_ids: tuple[Sequence[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """vLLM's HMA path (`SupportsHMA`): one block list per KV-cache group.

        Under a hybrid model vLLM has just freed the sliding-window blocks that left the window (they
        show as the null block here); without a delay it frees every other block right after this call.
        Both are recorded for the next metadata's `freed_block_ids`.
        """
        delay, params = self.request_finished(request, block_ids[0] if block_ids else [])
        if self.hybrid:
            self._record_finish_frees(request.req_id, block_ids[1:], delay)
        return delay, params

    def _record_finish_frees(self, req_id: str, group_block_ids: Sequence[Sequence[int]], delay: bool) -> None:
        """The blocks vLLM frees at a finish: the window's (already null in `group_block_ids`), and, unless
        the free is delayed, every other block right after `request_finished_all_groups` returns."""
        plan = self._request_plans.get(req_id)
        if plan is None:
            return
        for held, now in zip(plan.group_block_ids, group_block_ids):
            for index, block in enumerate(held):
                if block != NULL_BLOCK and index < len(now) and now[index] == NULL_BLOCK:
                    self._freed_since.add(block)
                    held[index] = NULL_BLOCK
        if not delay:
            self._freed_since |= plan.held_blocks()

    # =============================================================== worker side
    def register_kv_caches(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int | None = None) -> None:
        """Describe the KV tensors (finding each one's block dimension) and pick a device if none was given."""
        self._require(Role.WORKER, "register_kv_caches")
        if self._device is None:
            self._device = self._make_device(kv_caches)
            self._owns_device = True
        layout = self._device.register(kv_caches, num_blocks)
        if self.hybrid:  # one dump task holds rows of every group: their blocks must be the same size
            widths = {sum(layer.block_nbytes for layer in layout.select(group.layer_names)) for group in self.groups}
            if len(widths) > 1:
                raise ConfigError("kv_cache_groups", f"the groups' blocks differ in size ({sorted(widths)} bytes)")
        logger.info(
            "registered %d KV layers: %d blocks of %d bytes (block dims %s)",
            len(layout.layers), layout.num_blocks, layout.block_nbytes,
            sorted({layer.block_dim for layer in layout.layers}),
        )

    def _make_device(self, kv_caches: Mapping[str, torch.Tensor]) -> Device:
        """The device the KV tensors need (CUDA copy stream or CPU copy threads), or, when the config asks
        (`test_late_copy: "hold"`, TEST-ONLY), the adversarial late-copy test double on CPU tensors."""
        if self.config.test_late_copy == "hold":
            from deferdump.reference.testing.late_copy import DEFAULT_HOLD_TIMEOUT_S, LateCopyDevice

            timeout = self.config.test_late_copy_timeout_s
            logger.warning("test_late_copy=hold: every dump copy is held until the connector waits (TEST-ONLY)")
            return LateCopyDevice(hold=True, hold_timeout_s=DEFAULT_HOLD_TIMEOUT_S if timeout is None else timeout)
        if any(t.device.type == "cuda" for t in kv_caches.values()):
            return CudaDevice(next(iter(kv_caches.values())).device)
        return CpuDevice(self.config.copy_threads)

    def bind_connector_metadata(self, meta: DeferDumpMetadata) -> None:
        self._meta = meta
        self._step_load_error_block_ids = set()
        self.skipped_failed_loads = frozenset()

    def clear_connector_metadata(self) -> None:
        self._meta = None

    def has_connector_metadata(self) -> bool:
        return self._meta is not None

    @property
    def bound_metadata(self) -> DeferDumpMetadata:
        """This step's metadata. vLLM binds it before every worker call that reads it; with none bound
        (a harness, a clear) the step has nothing to load, dump or track, exactly like empty metadata."""
        return self._meta if self._meta is not None else DeferDumpMetadata()

    def _store_keys(self, hashes: Sequence[bytes]) -> list[bytes]:
        """This rank's store keys: TP ranks hold different shards, so ranks other than 0 re-key.

        Under MLA every rank holds the same KV (rank 0's keys); under CP the hashes are already per rank
        (`_shard_ranks`, which the scheduler's lookup asks).
        """
        if self.rank not in self._shard_ranks()[1:]:
            return list(hashes)
        return [rank_key(h, self.rank) for h in hashes]

    def _failed_load_requests(self) -> frozenset[str]:
        """Requests of the bound step with a block whose load failed in this step."""
        errors = self._step_load_error_block_ids
        if not errors:
            return frozenset()
        failed = set()
        for req_id, meta in self.bound_metadata.request_meta.items():
            loaded = set(meta.load_block_ids).union(*meta.load_group_block_ids)
            if not errors.isdisjoint(loaded):
                failed.add(req_id)
        return frozenset(failed)

    def _dumping_requests(self) -> tuple[list[str], list[bytes], list[int]]:
        """Request ids, hashes and vLLM block ids of the dump slices to submit in the bound step.

        A request whose load failed in this step is left out: its new blocks were computed over the failed
        ones (wrong KV for their keys), and under kv_load_failure_policy "recompute" vLLM rolls it back to
        the first failed block and rewrites them in place in the next step, while a dump would still read
        them. It stays tracked (every slice is), so it is still reported; the recompute dumps the blocks.
        """
        skipped = self._failed_load_requests()
        self.skipped_failed_loads = skipped
        if skipped:
            logger.info("no dump for %d request(s) whose load failed in this step", len(skipped))
        req_ids: list[str] = []
        hashes: list[bytes] = []
        block_ids: list[int] = []
        for req_id, meta in self.bound_metadata.request_meta.items():
            if meta.has_dump() and req_id not in skipped:
                req_ids.append(req_id)
                hashes.extend(meta.dump_hashes)
                block_ids.extend(meta.dump_block_ids)
        return req_ids, hashes, block_ids

    def _group_rows(
        self, keys: Sequence[bytes], block_ids: Sequence[int], group_block_ids: Sequence[Sequence[int]]
    ) -> list[tuple[int, list[bytes], list[int]]]:
        """Per group: (group, store keys, block ids) of a slice, null positions dropped; group 0 first."""
        rows = [(0, list(keys), list(block_ids))]
        for group, ids in enumerate(group_block_ids, start=1):
            pairs = [(group_key(key, group), b) for key, b in zip(keys, ids) if b != NULL_BLOCK]
            if pairs:
                rows.append((group, [k for k, _ in pairs], [b for _, b in pairs]))
        return rows

    def _group_layers(self, group: int) -> tuple[str, ...] | None:
        return self.groups[group].layer_names if self.hybrid else None

    def _track_bound_dump_requests(self) -> None:
        self._async_dump_req_ids |= self.bound_metadata.dump_req_ids()

    def _dumps_on_this_rank(self) -> bool:
        """MLA: only rank 0 dumps (every rank still tracks and reports)."""
        return not (self.config.is_mla and self.rank != 0)

    # ---------------------------------------------------------------- preemption
    def handle_preemptions(self, meta_or_ids: DeferDumpMetadata | set[str] | frozenset[str] | Any) -> None:
        """Before the forward: wait only the pending tasks containing preempted requests (their blocks may
        already be reallocated and about to be written). Accepts the metadata or, older API, a set; anything
        without preempted ids (None included) waits nothing."""
        freed: frozenset[int] = frozenset()
        if isinstance(meta_or_ids, (set, frozenset)):
            preempted = frozenset(meta_or_ids)
        else:
            preempted = frozenset(getattr(meta_or_ids, "preempted_req_ids", None) or ())
            freed = frozenset(getattr(meta_or_ids, "freed_block_ids", None) or ())
        fence = self.config.hybrid_fence
        if not preempted and (fence == "none" or not freed):
            return
        started = time.perf_counter()
        if fence == "all_on_free":  # UCM's coarse fence: drain everything whenever a block was freed
            self._flush_pending_dump_tasks(None)
        elif fence == "freed" and freed:  # the fine fence: the dumps that read a block that may be rewritten
            self._flush_matching(lambda p: p.overlaps(preempted) or not freed.isdisjoint(p.block_ids))
        else:
            self._flush_pending_dump_tasks(preempted)
        self.metrics.preemption_wait.observe(time.perf_counter() - started)

    # --------------------------------------------------------------------- loads
    def start_load_kv(self, **kwargs: Any) -> None:
        """Load every request's hit range synchronously before the forward (UCM Direct); an asynchronous
        load (`load_async`) is only submitted to the store threads, and finished in `get_finished`."""
        for req_id, meta in self.bound_metadata.request_meta.items():
            if not meta.has_load():
                continue
            if meta.load_async:
                self._submit_async_load(req_id, meta)
                continue
            keys = self._store_keys(meta.load_hashes)
            for group, group_keys, block_ids in self._group_rows(keys, meta.load_block_ids, meta.load_group_block_ids):
                self._load_blocks(group_keys, block_ids, self._group_layers(group))

    def _load_blocks(self, keys: Sequence[bytes], block_ids: Sequence[int], layer_names: Sequence[str] | None) -> None:
        """Load and write blocks; on any failure nothing is written and every block is a load error."""
        try:
            task = self._store.load(keys)
        except Exception as exc:
            self._record_load_error(block_ids, exc)
            return
        self._finish_load(task, block_ids, layer_names)

    def _finish_load(self, task: StoreTask, block_ids: Sequence[int], layer_names: Sequence[str] | None) -> None:
        try:
            data = self._store.wait(task, self.config.wait_timeout_s)
            if data is None:
                raise RuntimeError(f"load task {task.task_id} returned no data")
            self._require_device().write_blocks(block_ids, data, layer_names=layer_names)
        except Exception as exc:
            self._record_load_error(block_ids, exc)
            return
        self.metrics.loads_completed.inc()

    def _record_load_error(self, block_ids: Sequence[int], exc: BaseException) -> None:
        logger.warning("load of %d block(s) failed, vLLM will recompute them: %s", len(block_ids), exc)
        self._load_error_block_ids.update(int(b) for b in block_ids)
        self._step_load_error_block_ids.update(int(b) for b in block_ids)
        self.metrics.load_errors.inc(len(block_ids))

    def _submit_async_load(self, req_id: str, meta: RequestDispatchMeta) -> None:
        """Submit one store load per KV-cache group; nothing is waited or written here.

        A dump of this request still pending from before a preemption is waited first and the request leaves
        the dump tracking, as it does on the scheduler side (`_async_load_meta`)."""
        if req_id in self._async_dump_req_ids:
            self._flush_pending_dump_tasks(frozenset({req_id}))
            self._async_dump_req_ids.discard(req_id)
        parts: list[LoadPart] = []
        keys = self._store_keys(meta.load_hashes)
        for group, group_keys, block_ids in self._group_rows(keys, meta.load_block_ids, meta.load_group_block_ids):
            layers = self._group_layers(group)
            try:
                task: StoreTask | None = self._store.load(group_keys)
            except Exception as exc:
                logger.warning("async load submit of %d block(s) for %s failed: %s", len(block_ids), req_id, exc)
                task = None
            parts.append(LoadPart(task, tuple(block_ids), None if layers is None else tuple(layers)))
        previous = self._pending_loads.get(req_id)
        if previous is not None:  # vLLM sends one load per admission: keep both rather than lose a task
            logger.error("a second asynchronous load for %s before the first was reported", req_id)
            parts = previous.parts + parts
        self._pending_loads[req_id] = PendingLoad(req_id, parts)

    def _load_part_done(self, part: LoadPart) -> bool:
        if part.task is None:
            return True
        try:
            return self._store.check(part.task)
        except Exception as exc:
            logger.warning("check of load task %d failed, kept: %s", part.task.task_id, exc)
            return False

    def _finish_async_load(self, pending: PendingLoad, *, write: bool = True) -> bool:
        """Wait every task of a finished load and write its blocks; True when every part succeeded."""
        ok = True
        for part in pending.parts:
            try:
                if part.task is None:
                    raise RuntimeError("its submit failed")
                data = self._store.wait(part.task, self.config.wait_timeout_s)
                if data is None:
                    raise RuntimeError(f"load task {part.task.task_id} returned no data")
                if write:
                    self._require_device().write_blocks(part.block_ids, data, layer_names=part.layer_names)
            except Exception as exc:
                ok = False
                if write:
                    self._record_async_load_error(pending.req_id, part.block_ids, exc)
        if ok and write:
            self.metrics.loads_completed.inc()
        return ok

    def _record_async_load_error(self, req_id: str, block_ids: Sequence[int], exc: BaseException) -> None:
        """One request-level failure under several KV-cache groups (vLLM 0.32 raises on block-level errors
        there and takes `failed_recving` instead); block-level errors otherwise (vLLM keeps the valid prefix)."""
        if self.hybrid:
            logger.warning("async load of %s failed, reported as a failed receive (vLLM recomputes): %s", req_id, exc)
            self._failed_recving.add(req_id)
            self.metrics.load_errors.inc(len(block_ids))
        else:
            self._record_load_error(block_ids, exc)

    def _poll_async_loads(self, finished_req_ids: frozenset[str]) -> set[str]:
        """Finish every asynchronous load whose tasks all ended (no blocking wait): its blocks are written,
        then it is reported in finished_recving, whether it succeeded or not, aborted or not."""
        for req_id in finished_req_ids & self._pending_loads.keys():
            if self.config.test_drop_aborted_recving:  # TEST-ONLY broken mode: real bug P8
                self._finish_async_load(self._pending_loads.pop(req_id), write=False)
                logger.warning("test_drop_aborted_recving: %s dropped from the receive set (TEST-ONLY)", req_id)
                continue
            self._pending_loads[req_id].finished = True
        recving: set[str] = set()
        for req_id, pending in list(self._pending_loads.items()):
            if all(self._load_part_done(part) for part in pending.parts):
                del self._pending_loads[req_id]
                self._finish_async_load(pending)
                recving.add(req_id)
        return recving

    def take_failed_recving(self) -> set[str]:
        """Requests reported in finished_recving whose load failed, since the last call (hybrid models: vLLM's
        `KVConnectorTransferResults.failed_recving`)."""
        failed, self._failed_recving = self._failed_recving, set()
        return failed

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Direct loads everything in `start_load_kv`."""

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose load failed since the last call (each reported once)."""
        errors, self._load_error_block_ids = self._load_error_block_ids, set()
        return errors

    # --------------------------------------------------------------------- dumps
    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor | None = None, attn_metadata: Any = None, **kwargs: Any
    ) -> None:
        """Direct dumps once per step, in `wait_for_save`."""

    def wait_for_save(self) -> None:
        """Reap finished tasks, track this step's dump requests (all ranks), submit one task; never wait."""
        self._require(Role.WORKER, "wait_for_save")
        self._poll_pending_dump_tasks()
        self._track_bound_dump_requests()  # before the MLA return: every rank must report
        if not self._dumps_on_this_rank():
            return
        req_ids, hashes, block_ids = self._dumping_requests()
        if not hashes:
            return
        if not self.hybrid:
            self._submit_dump(self._store_keys(hashes), block_ids, req_ids, None)
            return
        rows: list[tuple[int, list[bytes], list[int]]] = []
        for req_id in req_ids:  # the dumping requests, in the order of their hashes
            meta = self.bound_metadata.request_meta[req_id]
            rows += self._group_rows(self._store_keys(meta.dump_hashes), meta.dump_block_ids, meta.dump_group_block_ids)
        self._submit_group_dump(rows, req_ids)

    def _get_dump_event_handle(self) -> int:
        """A handle to an event after this step's KV writes; 0 (after a synchronize) when sync is off."""
        device = self._require_device()
        if not self.config.enable_event_sync:
            device.synchronize()
            return 0
        event = device.record_event()
        if event is None:
            device.synchronize()
            return 0
        return self.events.acquire(event)

    def _submit_dump(
        self,
        keys: Sequence[bytes],
        block_ids: Sequence[int],
        req_ids: Iterable[str],
        layer_name: str | None,
        *,
        read: Callable[[Any], Any] | None = None,
        checksum: Callable[[], tuple[int, ...]] | None = None,
    ) -> PendingDumpTask | None:
        """Start the device copy and the store task; on failure release the handle, keep no pending task.

        `read`/`checksum` replace the single-group device read (hybrid models read each group's layers).
        """
        device = self._require_device()
        layer_names = None if layer_name is None else (layer_name,)
        handle = 0
        payload = None
        staged = None
        try:
            handle = self._get_dump_event_handle()
            event = self.events.get(handle) if handle else None
            checksums = None
            if self.config.verify_dumps:
                checksums = checksum() if checksum else device.checksum_blocks(block_ids, layer_names=layer_names)
            if read is not None:
                payload = read(event)  # hybrid: one read per group, no store staging
            else:
                payload, staged = self._read_dump_payload(device, block_ids, event, layer_names)
            task = self._store.dump(keys, payload)
        except Exception as exc:
            logger.warning("dump submit of %d block(s) failed (requests stay tracked): %s", len(block_ids), exc)
            self.submit_failures += 1
            self.metrics.dumps_failed.labels(stage="submit").inc()
            if payload is not None:
                self._settle(payload)  # the copy must stop reading blocks nothing will wait for
            _release_staging(staged)  # after settle: the copy no longer writes the store's rows
            if handle:
                self.events.release(handle)
            return None
        pending = PendingDumpTask(
            task=task,
            request_ids=frozenset(req_ids),
            event_handle=handle,
            block_ids=tuple(block_ids),
            layer_name=layer_name,
            payload=payload,
            checksums=checksums,
            nbytes=len(block_ids) * device.layout.row_nbytes(layer_names),
            submitted_at=time.monotonic(),
        )
        self._pending_dump_tasks.append(pending)
        self.metrics.dumps_submitted.inc()
        return pending

    def _settle(self, payload: Any) -> None:
        """Make sure a payload's device copies no longer read their source blocks (each group's part)."""
        device = self._require_device()
        for part in payload.parts if isinstance(payload, GroupPayload) else (payload,):
            device.settle(part)

    def _submit_group_dump(self, rows: Sequence[tuple[int, Sequence[bytes], Sequence[int]]], req_ids: Iterable[str]) -> None:
        """One task dumping several groups' blocks, each read from its own group's layers (hybrid models)."""
        device = self._require_device()
        keys = [key for _, group_keys, _ in rows for key in group_keys]
        block_ids = [b for _, _, ids in rows for b in ids]
        def read(after: Any) -> GroupPayload:
            parts: list[Any] = []
            try:
                for group, _, ids in rows:
                    parts.append(device.read_blocks(ids, after=after, layer_names=self._group_layers(group)))
            except BaseException:
                for part in parts:
                    device.settle(part)
                raise
            return GroupPayload(parts)

        def checksum() -> tuple[int, ...]:
            return tuple(
                c for group, _, ids in rows for c in device.checksum_blocks(ids, layer_names=self._group_layers(group))
            )

        self._submit_dump(keys, block_ids, req_ids, None, read=read, checksum=checksum)

    def _read_dump_payload(
        self, device: Device, block_ids: Sequence[int], event: Any, layer_names: Sequence[str] | None
    ) -> tuple[Any, StagedRows | None]:
        """The device copy of one dump, gathered straight into the store's rows when both sides can.

        Data path only: which tasks and handles exist does not depend on it, so the protocol core's coverage
        (conformance) leaves it out; tests/reference/stores/test_stores_staging.py and real vLLM drive it."""
        staged = self._stage_dump(device, len(block_ids), layer_names)
        if staged is None:
            return device.read_blocks(block_ids, after=event, layer_names=layer_names), None
        try:
            return device.read_blocks(block_ids, after=event, layer_names=layer_names, into=staged), staged
        except BaseException:
            staged.release()  # no copy started: the rows go back to the store's pool
            raise

    def _stage_dump(self, device: Device, num_blocks: int, layer_names: Sequence[str] | None) -> StagedRows | None:
        """The store's own rows for the device to gather this dump into (one copy per byte), when both can.

        Once the store has offered rows, later dumps' rows are staged by the device's copy thread when it
        first uses them (`StagedRows.taken_on_first_use`), not here on the forward's thread."""
        if self.config.verify_dumps or not getattr(device, "gathers_into_staging", False):
            return None  # verify_dumps re-reads the payload after the task; a store row may be reused by then
        store, width = self._store, device.layout.row_nbytes(layer_names)
        if self._store_stages:
            return StagedRows.taken_on_first_use(num_blocks, width, lambda: store.staging(num_blocks, width))
        staged = store.staging(num_blocks, width)
        self._store_stages = staged is not None  # a store without rows of its own: the device allocates
        return staged

    def _release_dump_event_handle(self, pending: PendingDumpTask) -> None:
        if pending.event_handle:
            handle, pending.event_handle = pending.event_handle, 0
            self.events.release(handle)

    def _wait_pending_dump_task(self, pending: PendingDumpTask) -> None:
        """Wait one task; whatever happens, its source read has stopped and its handle is released after.

        A failed wait re-raises (the callers log it and drop the task); only a success reaches the end.
        """
        try:
            self._store.wait(pending.task, self.config.wait_timeout_s)
        except Exception:
            self.wait_failures += 1
            self.metrics.dumps_failed.labels(stage="wait").inc()
            raise
        finally:
            self._settle(pending.payload)  # a pending task was submitted through the device
            self._release_dump_event_handle(pending)
        self.metrics.dumps_completed.inc()
        self.metrics.dump_bytes.inc(pending.nbytes)
        if pending.checksums is not None:
            self._verify(pending)

    def _verify(self, pending: PendingDumpTask) -> None:
        """Compare the bytes the task stored with the source blocks' checksums taken at submit."""
        assert pending.checksums is not None
        try:
            stored = checksum_rows(pending.payload.result())
        except Exception as exc:
            logger.warning("verify_dumps: cannot read task %d's bytes: %s", pending.task.task_id, exc)
            return
        mismatches = [b for b, s, c in zip(pending.block_ids, stored, pending.checksums) if s != c]
        if mismatches:
            logger.error(
                "verify_dumps: task %d stored %d block(s) that changed after submit: %s",
                pending.task.task_id, len(mismatches), mismatches[:8],
            )
            self.verify_mismatches += len(mismatches)
            self.metrics.verify_mismatches.inc(len(mismatches))

    def _poll_pending_dump_tasks(self) -> None:
        """Wait (without blocking) every task `check` says finished; keep the rest, and any `check` error."""
        remaining: list[PendingDumpTask] = []
        for pending in list(self._pending_dump_tasks):
            try:
                finished = self._store.check(pending.task)
            except Exception as exc:
                logger.warning("check of dump task %d failed, kept: %s", pending.task.task_id, exc)
                remaining.append(pending)
                continue
            if not finished:
                remaining.append(pending)
                continue
            try:
                self._wait_pending_dump_task(pending)
            except Exception as exc:
                logger.warning("dump task %d failed: %s", pending.task.task_id, exc)
        self._pending_dump_tasks[:] = remaining

    def _flush_pending_dump_tasks(self, request_ids: frozenset[str] | None = None) -> None:
        """Wait (blocking) every pending task overlapping `request_ids` (all when None); drop it even on error."""
        self._flush_matching(None if request_ids is None else (lambda p: p.overlaps(request_ids)))

    def _flush_matching(self, wanted: Callable[[PendingDumpTask], bool] | None) -> None:
        """Wait (blocking) every pending task `wanted` selects (all when None); drop it even on error.

        The one place the connector blocks on dump tasks (`get_finished`, `handle_preemptions` and its
        fence, `shutdown`): the device hears of it first (`Device.before_dump_wait`)."""
        selected: list[PendingDumpTask] = []
        remaining: list[PendingDumpTask] = []
        for pending in self._pending_dump_tasks:
            (selected if wanted is None or wanted(pending) else remaining).append(pending)
        if selected:
            self._require_device().before_dump_wait()  # a pending task was submitted through the device
        for pending in selected:
            try:
                self._wait_pending_dump_task(pending)
            except Exception as exc:
                logger.warning("dump task %d failed: %s", pending.task.task_id, exc)
        self._pending_dump_tasks[:] = remaining

    def get_finished(self, finished_req_ids: set[str] | frozenset[str]) -> tuple[set[str] | None, set[str] | None]:
        """Report exactly `finished ∩ tracked`, after waiting every pending task that overlaps it; and, in
        finished_recving, every asynchronous load that ended, its blocks written."""
        recving = self._poll_async_loads(frozenset(finished_req_ids)) if self._pending_loads else set()
        if self._pending_loads and not recving and not self.bound_metadata.forward:
            self._yield_to_loads()
        return self._finished_sending(finished_req_ids), (recving or None)

    def _yield_to_loads(self) -> None:
        """Let the store's threads run a pending load: called in a step that ran no forward, where vLLM's engine
        loop steps again at once, holding the GIL but for an instant. A store thread needs the GIL once per
        block it reads and decodes and waits up to the switch interval (5 ms) for each, so a 2k-token load
        from files took 389 ms instead of 27 ms (docs/benchmarks.md, "Inside vLLM"). Sleeping releases it."""
        time.sleep(IDLE_LOAD_YIELD_S)

    def _finished_sending(self, finished_req_ids: set[str] | frozenset[str]) -> set[str] | None:
        async_finished = set(finished_req_ids) & self._async_dump_req_ids
        if not async_finished:
            return None
        started = time.perf_counter()
        self._flush_pending_dump_tasks(frozenset(async_finished))
        self.metrics.get_finished_wait.observe(time.perf_counter() - started)
        self._async_dump_req_ids -= async_finished
        self.reported_total += len(async_finished)
        self.metrics.finished_sending.inc(len(async_finished))
        return async_finished

    def shutdown(self) -> None:
        """Drain every pending task (each handle released), then stop what this connector owns."""
        if self._shut_down:
            return
        self._shut_down = True
        self._flush_pending_dump_tasks(None)
        for pending in self._pending_loads.values():  # stop every load task; nothing reads the blocks any more
            self._finish_async_load(pending, write=False)
        self._pending_loads.clear()
        if self.events.live():
            logger.warning("shutdown: %d event handle(s) still live without a pending task", self.events.live())
        if self._owns_device and self._device is not None:
            self._device.close()
        if self._owns_store:
            self._store.close()

    # ------------------------------------------------------------------- helpers
    def _require_device(self) -> Device:
        if self._device is None:
            raise RoleError("no device: register_kv_caches was not called on this worker connector")
        return self._device


@dataclasses.dataclass
class _LayerLoad:
    task: StoreTask
    block_ids: tuple[int, ...]


class LayerWiseConnector(DirectConnector):
    """One dump task per layer per step (UCM `UCMLayerWiseConnector`); per-layer loads."""

    _per_layer = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dumped_layers: set[str] = set()  # layers submitted this step (a revisited layer dumps once)
        self._layer_loads: dict[str, list[_LayerLoad]] = {}

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor | None = None, attn_metadata: Any = None, **kwargs: Any
    ) -> None:
        """Submit this layer's dump of every dumping request; never wait."""
        if self._meta is None or not self._dumps_on_this_rank() or layer_name in self._dumped_layers:
            return
        req_ids, hashes, block_ids = self._dumping_requests()
        if not hashes:
            return
        self._dumped_layers.add(layer_name)
        index = self._require_device().layout.layer(layer_name).index
        keys = [layer_key(key, index) for key in self._store_keys(hashes)]
        self._submit_dump(keys, block_ids, req_ids, layer_name)

    def wait_for_save(self) -> None:
        """Reap finished tasks and track this step's dump requests (all ranks); never wait."""
        self._require(Role.WORKER, "wait_for_save")
        self._poll_pending_dump_tasks()
        self._track_bound_dump_requests()
        self._dumped_layers.clear()

    def start_load_kv(self, **kwargs: Any) -> None:
        """Submit one load task per layer per request; each is waited in `wait_for_layer_load`."""
        for meta in self.bound_metadata.request_meta.values():
            if not meta.has_load():
                continue
            keys = self._store_keys(meta.load_hashes)
            for layer in self._require_device().layout.layers:
                try:
                    task = self._store.load([layer_key(key, layer.index) for key in keys])
                except Exception as exc:
                    self._record_load_error(meta.load_block_ids, exc)
                    continue
                self._layer_loads.setdefault(layer.name, []).append(_LayerLoad(task, meta.load_block_ids))

    def wait_for_layer_load(self, layer_name: str) -> None:
        for load in self._layer_loads.pop(layer_name, []):
            self._finish_load(load.task, load.block_ids, (layer_name,))

    def clear_connector_metadata(self) -> None:
        """Finish loads of layers the forward never reached, so no store task is left behind."""
        for layer_name in list(self._layer_loads):
            self.wait_for_layer_load(layer_name)
        self._dumped_layers.clear()
        super().clear_connector_metadata()


class CPConnector(LayerWiseConnector):
    """Context parallelism (UCM `UCMCPConnector`): per-rank hash slices, then Direct or LayerWise paths.

    It defines no `build_connector_meta` (nor tracking): both come from `DirectConnector` by the MRO.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._per_layer = self.config.use_layerwise

    def rank_hashes(self, hashes: Sequence[bytes]) -> tuple[bytes, ...]:
        """This rank's sub-keys `[rank::cp_world_size]` of a request's per-block CP hashes."""
        return tuple(hashes[self.rank :: self.config.cp_world_size])

    def bind_connector_metadata(self, meta: DeferDumpMetadata) -> None:
        """Keep this rank's hashes; non-empty stays non-empty (lengths are multiples of the CP size)."""
        sliced = {
            req_id: RequestDispatchMeta(
                self.rank_hashes(m.load_hashes), m.load_block_ids, self.rank_hashes(m.dump_hashes), m.dump_block_ids
            )
            for req_id, m in meta.request_meta.items()
        }
        super().bind_connector_metadata(dataclasses.replace(meta, request_meta=sliced))

    def start_load_kv(self, **kwargs: Any) -> None:
        if self._per_layer:
            super().start_load_kv(**kwargs)
        else:
            super(LayerWiseConnector, self).start_load_kv(**kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._per_layer:
            super().wait_for_layer_load(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor | None = None, attn_metadata: Any = None, **kwargs: Any
    ) -> None:
        if self._per_layer:
            super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        if self._per_layer:
            super().wait_for_save()
        else:
            super(LayerWiseConnector, self).wait_for_save()


def _release_staging(staged: StagedRows | None) -> None:
    """Give unused staging rows back to the store (a refused or failed submit)."""
    if staged is not None:
        staged.release()


VARIANT_CLASSES: dict[str, type[DirectConnector]] = {
    "direct": DirectConnector,
    "layerwise": LayerWiseConnector,
    "cp": CPConnector,
}


class OuterConnector:
    """The wrapper vLLM talks to (UCM `UCMConnector`): chooses the inner class, forwards every method."""

    def __init__(
        self,
        config: ConnectorConfig,
        role: Role | int | str,
        *,
        store: KVStore | None = None,
        device: Device | None = None,
        rank: int = 0,
        world_size: int = 1,
        events: EventRegistry | None = None,
        metrics: ConnectorMetrics | None = None,
        groups: Sequence[KVGroup] | None = None,
        num_layers: int | None = None,
    ) -> None:
        owns_store = store is None
        self.inner: DirectConnector = self.inner_class(config)(
            config,
            role,
            store=store if store is not None else make_store(config),
            device=device,
            rank=rank,
            world_size=world_size,
            events=events,
            metrics=metrics,
            owns_store=owns_store,
            groups=groups,
            num_layers=num_layers,
        )

    @staticmethod
    def inner_class(config: ConnectorConfig) -> type[DirectConnector]:
        return VARIANT_CLASSES[config.variant]

    # observable state (conformance reads these names)
    @property
    def config(self) -> ConnectorConfig:
        return self.inner.config

    @property
    def role(self) -> Role:
        return self.inner.role

    @property
    def events(self) -> EventRegistry:
        return self.inner.events

    @property
    def metrics(self) -> ConnectorMetrics:
        return self.inner.metrics

    @property
    def store(self) -> KVStore:
        return self.inner.store

    @property
    def _async_dump_req_ids(self) -> set[str]:
        return self.inner._async_dump_req_ids

    @property
    def _pending_dump_tasks(self) -> list[PendingDumpTask]:
        return self.inner._pending_dump_tasks

    def pending_request_ids(self) -> frozenset[str]:
        return self.inner.pending_request_ids()

    # scheduler side
    def get_num_new_matched_tokens(self, request: RequestView, num_computed_tokens: int) -> tuple[int, bool]:
        return self.inner.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: RequestView, block_ids: Sequence[int], num_external_tokens: int,
        group_block_ids: Sequence[Sequence[int]] = (),
    ) -> None:
        self.inner.update_state_after_alloc(request, block_ids, num_external_tokens, group_block_ids)

    def update_connector_output(self, finished_recving: Iterable[str] = ()) -> None:
        self.inner.update_connector_output(finished_recving)

    def build_connector_meta(self, step: StepView) -> DeferDumpMetadata:
        return self.inner.build_connector_meta(step)

    def request_finished(self, request: RequestView, block_ids: Sequence[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.inner.request_finished(request, block_ids)

    def request_finished_all_groups(
        self, request: RequestView, block_ids: tuple[Sequence[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.inner.request_finished_all_groups(request, block_ids)

    # worker side
    def register_kv_caches(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int | None = None) -> None:
        self.inner.register_kv_caches(kv_caches, num_blocks)

    def bind_connector_metadata(self, meta: DeferDumpMetadata) -> None:
        self.inner.bind_connector_metadata(meta)

    def clear_connector_metadata(self) -> None:
        self.inner.clear_connector_metadata()

    def has_connector_metadata(self) -> bool:
        return self.inner.has_connector_metadata()

    def handle_preemptions(self, meta_or_ids: DeferDumpMetadata | set[str] | frozenset[str] | Any) -> None:
        self.inner.handle_preemptions(meta_or_ids)

    def start_load_kv(self, **kwargs: Any) -> None:
        self.inner.start_load_kv(**kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.inner.wait_for_layer_load(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor | None = None, attn_metadata: Any = None, **kwargs: Any
    ) -> None:
        self.inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        self.inner.wait_for_save()

    def get_finished(self, finished_req_ids: set[str] | frozenset[str]) -> tuple[set[str] | None, set[str] | None]:
        return self.inner.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.inner.get_block_ids_with_load_errors()

    def take_failed_recving(self) -> set[str]:
        return self.inner.take_failed_recving()

    def receiving_request_ids(self) -> frozenset[str]:
        return self.inner.receiving_request_ids()

    def shutdown(self) -> None:
        self.inner.shutdown()
