"""The replay driver of the DeferDump model: model actions -> calls on the reference connector.

The driver plays vLLM, reading vLLM's own state (request states, block lists, finished ids) from the
model's state *before* each step, and makes exactly the connector calls vLLM would make:

=====================  =======================================================================
model action           calls on the reference connector
=====================  =======================================================================
``schedule``           ``get_num_new_matched_tokens`` + ``update_state_after_alloc`` for admitted
                       requests, then ``build_connector_meta(StepView)``; the metadata is queued
``execute_model``      per rank, in the order of ``action.ranks[w]``: ``handle_preemptions(meta)``,
                       ``bind_connector_metadata`` + ``start_load_kv`` (``forward``),
                       ``save_kv_layer`` per layer, ``wait_for_save``, ``get_finished``, then
                       ``clear_connector_metadata``; store faults are injected exactly where the
                       call record says (``submit_error``, ``check_error``)
``update_from_output`` ``request_finished`` (``request_finished_all_groups`` on the HMA path, with
                       the record's per-group lists under ``Hybrid``) per finished request
``engine_step``        the three phases above in order (sync scheduling fused into one step)
``task_complete``      the rank's :class:`ManualStore` completes or fails the task (under Lockstep:
                       every running task of the listed ranks)
``finish_requests``    an abort: ``request_finished`` of a request waiting for remote KV (its answer
                       compared)
``load_complete``      the rank's store completes or fails the request's asynchronous load task
=====================  =======================================================================

Asynchronous loads (move ``async_loads``; the connector runs with ``load_async``): ``schedule`` first plays
``_update_waiting_for_remote_kv`` (received requests are scheduled on their loaded block, failed ones wait
again), keeps the parked requests (``get_num_new_matched_tokens`` answering ``load_async``) out of the
StepView, and checks that ``build_connector_meta`` sends their loads; the rank step's ``start_load_kv``
record is replayed on its own (the loads submitted are compared); ``get_finished``'s ``finished_recving``
is compared, and ``failed_recving`` with ``get_block_ids_with_load_errors``; ``update_from_output`` hands
the aggregated receives to ``update_connector_output``. ``loadTasks[w]`` <- rank w's ``_pending_loads``
(one ``[req, block, status]`` per block), ``workerRecv[w]`` <- the requests in it.

Each rank has its own ManualStore (``auto_complete_on_wait``: a wait on a running task drains it, as a
blocking wait does). The scheduler's store answers each lookup as the schedule record says: a miss, or
(``StoreHits``) a hit of the whole prompt (``allocated[].hit``); with ``StoreHits`` every rank's store is
seeded with every request's prompt blocks under that rank's keys, so the load of a hit reads real bytes.
vLLM's attention layers call ``wait_for_layer_load`` before computing, so ``forward`` calls it for every
layer after ``start_load_kv``. Requests in ``ShortReqs`` have a one-token prompt (no full block).

Refinement mapping ``abstract_state()`` (model variable <- implementation):

- ``schedAsync``  <- scheduler connector ``_async_dump_req_ids``
- ``workerAsync[w]`` <- rank w's ``_async_dump_req_ids``
- ``pending[w]``  <- rank w's ``_pending_dump_tasks``, each as ``[id, reqs, blocks, layer, status,
  event]``: ``id`` is the model id the task got when its submit matched the call record's
  ``submitted``; ``status`` is the store's (running until completed or failed); ``event`` is the id
  while the task holds a non-zero handle. The model's ``snap`` (KV contents at submit) is not compared.
- ``live[w]``     <- rank w's ``events.live_handles()``, each as the id of the task it was acquired for
- ``reported[w][r]`` <- how often rank w's ``get_finished`` returned r (capped at 2); only without
  MultiConnector, whose emission logic is vLLM's, not the connector's.

``Hybrid`` (full attention + sliding window): block ``b_i`` is implementation block ``i`` (0 is vLLM's null
block); the connector gets two KV-cache groups, ``layer.i`` (full attention) and ``sw.layer.i`` (a sliding
window of ``HYBRID_WINDOW`` tokens, blocks of ``HYBRID_BLOCK_SIZE``), each schedule's per-group block ids,
and the computed-token counts vLLM frees the window on; it works out the frees itself. Checked at each
schedule: the dump slices with their sliding-window block, and the metadata's freed set against the model's
``freed_blocks``: it holds every block of the schedule's ``sw_freed`` and nothing the model did not free
(the model's set also holds blocks of delayed frees completed since the last schedule, which the connector is
not told of and which no pending task reads: ``get_finished`` waited them before reporting). The fence's
waits are checked as every other wait. Hybrid traces use neither the set-form ``handle_preemptions`` (it
carries no freed blocks) nor CP's Direct paths (several groups need variant ``direct``).

Each trace runs under an implementation profile (:mod:`.profiles`: ``verify_dumps``, event sync off,
the older set-form ``handle_preemptions``, CP's Direct paths for Direct traces). Without event sync the
connector synchronizes at submit and holds no handle: ``live`` and the tasks' ``event`` are then not
compared (the model's handles have no image); everything else is.

Call results are checked where they happen (a :class:`StepMismatch`): the dump slices of
``build_connector_meta``, ``request_finished``'s answer, ``get_finished``'s ``finished_sending``, which
tasks each call waited, and whether a submit happened.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from deferdump.reference.config import ConnectorConfig
from deferdump.reference.connectors import VARIANT_CLASSES, CPConnector, DirectConnector, OuterConnector, Role
from deferdump.reference.hashing import layer_key, prefix_block_hashes
from deferdump.reference.testing.late_copy import LateCopyDevice
from deferdump.reference.groups import NULL_BLOCK, KVGroup, group_key
from deferdump.reference.testing.manual_store import ManualStore
from deferdump.reference.metadata import DeferDumpMetadata
from deferdump.reference.metrics import ConnectorMetrics
from deferdump.reference.pending import PendingDumpTask
from deferdump.reference.stores.base import StoreTask
from deferdump.reference.views import CachedRequestView, NewRequestView, RequestView, StepView
from deferdump.tools.tlc.values import ModelValue, Record, TlaFunction, TlaSet, Value

from deferdump.conformance.driver import StepMismatch
from deferdump.conformance.deferdump_schema import (
    ACTIONS,
    DEFERDUMP_VARS,
    ModelConstants,
    model_name as _name,
    observed_variables,
)
from deferdump.conformance.profiles import DEFAULT_PROFILE, ImplProfile

__all__ = ["DeferDumpDriver", "ModelConstants", "DEFERDUMP_VARS"]

log = logging.getLogger(__name__)

BLOCK_SIZE = 2  # tokens per block: the model counts blocks, any size works
# Hybrid: a window below the block size that keeps the block of the last computed token (>= 2 tokens),
# so vLLM's `computed - window + 1` frees every earlier block, as the model's SwOut does.
HYBRID_BLOCK_SIZE = 4
HYBRID_WINDOW = 2
_TASK_FIELDS = ("id", "reqs", "blocks", "layer", "status", "event")
_TASK_FIELD_SET = frozenset(_TASK_FIELDS)


class ScriptedLookupStore(ManualStore):
    """The scheduler's store: a lookup hits the whole key list iff ``hit`` is set (the driver sets it
    from the schedule record just around each lookup), else misses. Nothing is dumped to it."""

    def __init__(self) -> None:
        super().__init__()
        self.hit = False

    def lookup_prefix(self, block_hashes: Sequence[bytes]) -> int:
        return len(block_hashes) if self.hit else 0


_SHARED_METRICS: ConnectorMetrics | None = None


def _replay_metrics() -> ConnectorMetrics:
    """One metrics object for every replayed connector: metrics are not compared, and building a
    prometheus registry per connector per trace would dominate the replay time."""
    global _SHARED_METRICS
    if _SHARED_METRICS is None:
        _SHARED_METRICS = ConnectorMetrics()
    return _SHARED_METRICS


_REQ_SETS: dict[frozenset[str], TlaSet] = {}


def _names(values: Iterable[Value]) -> set[str]:
    return {_name(v) for v in values}


def _reqs(names: Iterable[str]) -> TlaSet:
    """The model's set of requests (interned: its canonical key is then computed once)."""
    key = frozenset(names)
    cached = _REQ_SETS.get(key)
    if cached is None:
        cached = _REQ_SETS[key] = TlaSet(ModelValue(n) for n in sorted(key))
    return cached


class DeferDumpDriver:
    """Replays DeferDump traces on the reference connector (see the module docstring)."""

    actions = ACTIONS

    def __init__(self, constants: ModelConstants, profile: ImplProfile = DEFAULT_PROFILE) -> None:
        self.constants = constants
        if constants.hybrid:  # see the module docstring
            profile = dataclasses.replace(profile, set_preemption_api=False, cp_direct=False)
        if constants.async_loads:  # `load_async` needs variant direct: CP's Direct paths cannot load asynchronously
            profile = dataclasses.replace(profile, cp_direct=False)
        self.profile = profile
        self.block_size = HYBRID_BLOCK_SIZE if constants.hybrid else BLOCK_SIZE
        block_size = self.block_size
        self.observed = observed_variables(constants, profile)
        first = 1 if constants.hybrid else 0  # 0 is vLLM's null block in a sliding-window list
        self.block_ids = {name: index for index, name in enumerate(constants.blocks, start=first)}
        self.block_names = {index: name for name, index in self.block_ids.items()}
        def prompt_len(name: str) -> int:
            return 1 if name in constants.short_reqs else constants.prompt_blocks * block_size

        self.requests = {
            name: RequestView(name, tuple(range(1000 * (i + 1), 1000 * (i + 1) + prompt_len(name))), prompt_len(name))
            for i, name in enumerate(constants.requests)
        }
        # CP's Direct paths: a CP world of one rank (more ranks would each keep a slice of the hashes)
        cp_direct = profile.cp_direct and constants.variant == "direct" and constants.num_ranks == 1
        self.config = ConnectorConfig(
            variant="cp" if cp_direct else constants.variant, block_size=block_size, is_mla=constants.mla,
            copy_threads=1, cp_world_size=constants.num_ranks if constants.variant == "cp" else 1,
            use_layerwise=constants.variant == "cp", verify_dumps=profile.verify_dumps,
            enable_event_sync=profile.event_sync, hybrid_fence=constants.hybrid_fence,
            load_async=constants.async_loads,
        )
        self.scheduler: Any = None
        self.workers: list[Any] = []
        self.stores: list[ManualStore] = []
        self.devices: list[LateCopyDevice] = []
        self._records: dict[tuple[Any, ...], Record] = {}  # interned task records (see _task_record)
        self.groups: tuple[KVGroup, ...] | None = None
        if constants.hybrid:
            self.groups = (KVGroup(tuple(f"layer.{i}" for i in range(constants.layers))),
                           KVGroup(tuple(f"sw.layer.{i}" for i in range(constants.layers)), HYBRID_WINDOW))

    # ------------------------------------------------------------------ lifecycle
    def _connector(self, role: Role, store: ManualStore, rank: int = 0) -> Any:
        kwargs: dict[str, Any] = {"store": store, "rank": rank, "world_size": self.constants.num_ranks,
                                  "metrics": _replay_metrics(), "groups": self.groups}
        if role is Role.WORKER:
            device = LateCopyDevice()
            self.devices.append(device)
            kwargs["device"] = device
        if self.constants.wrapper:
            return OuterConnector(self.config, role, **kwargs)
        cls: type[DirectConnector] = VARIANT_CLASSES[self.config.variant]
        return cls(self.config, role, **kwargs)

    def reset(self, initial: Mapping[str, Value]) -> None:
        self.close()
        n = self.constants.num_ranks
        self.lookup_store = ScriptedLookupStore()
        self.scheduler = self._connector(Role.SCHEDULER, self.lookup_store)
        self.stores = [ManualStore(auto_complete_on_wait=True) for _ in range(n)]
        self.workers = [self._connector(Role.WORKER, self.stores[w], w) for w in range(n)]
        num_blocks = len(self.constants.blocks) + (1 if self.constants.hybrid else 0)
        names = [f"layer.{i}" for i in range(self.constants.layers)]
        if self.constants.hybrid:
            names += [f"sw.layer.{i}" for i in range(self.constants.layers)]
        caches = {name: torch.zeros(num_blocks, 1, self.block_size, 2) for name in names}
        for worker in self.workers:
            worker.register_kv_caches(caches)
        if self.constants.store_hits:
            for w in range(n):
                self.stores[w].seed(self._warm_blocks(w))
        self.inflight: collections.deque[DeferDumpMetadata] = collections.deque()
        self.executed = 0
        self.model_ids: list[dict[int, int]] = [{} for _ in range(n)]  # id(PendingDumpTask) -> model id
        self.by_model_id: list[dict[int, PendingDumpTask]] = [{} for _ in range(n)]
        self.store_task_ids: list[dict[int, int]] = [{} for _ in range(n)]  # StoreTask.task_id -> model id
        self.handle_ids: list[dict[int, int]] = [{} for _ in range(n)]  # event handle -> model id
        self.outcomes: list[dict[int, str]] = [{} for _ in range(n)]
        self.reports: list[collections.Counter[str]] = [collections.Counter() for _ in range(n)]
        self.load_outcomes: list[dict[int, str]] = [{} for _ in range(n)]  # load StoreTask.task_id -> outcome
        self.async_matched: dict[str, int] = {}  # parked request -> the external tokens its lookup answered
        self.resumed: set[str] = set()  # requests admitted from "preempted" (vLLM resumes them after a load)

    def _warm_blocks(self, w: int) -> dict[bytes, torch.Tensor]:
        """Every full prompt block of every request under rank w's store keys, as an earlier identical
        prompt would have dumped them: per layer for per-layer dumps, and only rank w's CP hash slice."""
        worker = self.workers[w]
        inner = worker.inner if self.constants.wrapper else worker
        layout = inner.device.layout
        per_block = inner._hashes_per_block
        blocks: dict[bytes, torch.Tensor] = {}
        for index, view in enumerate(self.requests.values()):
            hashes = prefix_block_hashes(view.token_ids, self.block_size, per_block)
            if isinstance(inner, CPConnector):
                hashes = inner.rank_hashes(hashes)
            for key in inner._store_keys(hashes):
                if inner._per_layer:
                    for layer in layout.layers:
                        blocks[layer_key(key, layer.index)] = torch.full((layer.block_nbytes,), index + 1, dtype=torch.uint8)
                elif self.groups is not None:  # hybrid: one row per KV-cache group, over the group's layers
                    for group, kv_group in enumerate(self.groups):
                        nbytes = layout.row_nbytes(kv_group.layer_names)
                        blocks[group_key(key, group)] = torch.full((nbytes,), index + 1, dtype=torch.uint8)
                else:
                    blocks[key] = torch.full((layout.block_nbytes,), index + 1, dtype=torch.uint8)
        return blocks

    def close(self) -> None:
        for device in self.devices:
            device.close()
        self.devices = []

    # ------------------------------------------------------------------ steps
    def step(self, before: Mapping[str, Value], after: Mapping[str, Value]) -> None:
        action = after["action"]
        name = action["name"]
        if name == "schedule":
            self._schedule(before, action)
        elif name == "execute_model":
            self._execute_model(action)
        elif name == "update_from_output":
            self._update_from_output(before, action)
        elif name == "engine_step":  # sync scheduling fused: the three phases in order
            schedule, execute, update = action["phases"]
            self._schedule(before, schedule)
            self._execute_model(execute)
            self._update_from_output(before, update)
        elif name == "task_complete":
            self._task_complete(action)
        elif name == "shutdown":
            self._shutdown(action)
        elif name == "finish_requests":
            self._finish_requests(before, action)
        elif name == "load_complete":
            self._load_complete(action)
        else:
            raise StepMismatch(f"action {name!r} is not a step the driver can take")

    def _schedule(self, before: Mapping[str, Value], action: Record) -> None:
        req_state: dict[Value, Any] = dict(before["reqState"])
        blocks_of = before["blocksOf"]
        calls = {c["name"]: c for c in action["calls"]}
        new: list[NewRequestView] = []
        cached: list[CachedRequestView] = []
        scheduled: set[str] = set()
        hybrid = self.constants.hybrid
        block_size = self.block_size
        parked: set[str] = set()
        if self.constants.async_loads:
            new, cached, scheduled = self._promote(req_state, blocks_of, before["swBlocksOf"],
                                                   calls["_update_waiting_for_remote_kv"])
            parked = _names(calls["get_num_new_matched_tokens"]["load_async"])
        by_req: dict[Value, list[Record]] = collections.defaultdict(list)
        for alloc in action["allocated"]:
            by_req[alloc["req"]].append(alloc)
        for req in sorted(by_req, key=_name):
            # one block per allocation, except a hybrid hit of a two-block prompt: both full-attention
            # blocks, and in the sliding-window group the null block (out of the window) then the last one
            allocs = sorted(by_req[req], key=lambda a: int(a["idx"]))
            alloc = allocs[0]
            rid = _name(req)
            blocks = tuple(self.block_ids[_name(a["block"])] for a in allocs)
            block = blocks[0]
            sw_ids = tuple(self._sw_id(a["sw"]) for a in allocs) if hybrid else ()
            groups = (sw_ids,) if hybrid else ()
            view = self.requests[rid]
            scheduled.add(rid)
            if req_state[req] in ("waiting", "preempted"):
                self.lookup_store.hit = bool(alloc.get("hit", False))
                try:
                    matched, load_async = self.scheduler.get_num_new_matched_tokens(view, 0)
                finally:
                    self.lookup_store.hit = False
                if load_async != (rid in parked):
                    raise StepMismatch(f"get_num_new_matched_tokens({rid}): model load_async={rid in parked}, "
                                       f"implementation ({matched}, {load_async})")
                self.scheduler.update_state_after_alloc(view, list(blocks), matched, [list(g) for g in groups])
                if rid in parked:  # WAITING_FOR_REMOTE_KVS: allocated, not scheduled; its load goes in the metadata
                    self.async_matched[rid] = matched
                    if req_state[req] == "preempted":
                        self.resumed.add(rid)
                    else:
                        self.resumed.discard(rid)
                    continue
                chunk = min(block_size * len(blocks), view.num_prompt_tokens) - matched  # a hit computes the last token only
                if req_state[req] == "waiting":
                    new.append(NewRequestView(rid, view.token_ids, view.num_prompt_tokens, blocks, matched, chunk,
                                              groups))
                else:
                    cached.append(CachedRequestView(rid, blocks, True, matched, chunk, groups))
            else:
                computed = (int(alloc["idx"]) - 1) * block_size
                cached.append(CachedRequestView(rid, (block,), False, computed, block_size, groups))
        preempted = _names(action["preempted"])
        for req, state in req_state.items():
            rid = _name(req)
            if (state == "running" and rid not in scheduled and rid not in preempted
                    and len(blocks_of[req]) == self.constants.need_blocks(rid)):
                prompt = self.requests[rid].num_prompt_tokens
                cached.append(CachedRequestView(rid, (), False, prompt, 1, ((),) if hybrid else ()))  # a decode: never dumped
        step = StepView(tuple(new), tuple(cached), frozenset(_names(before["finishedIds"])), frozenset(preempted))
        meta = self.scheduler.build_connector_meta(step)
        self.inflight.append(meta)
        call = calls["build_connector_meta"]
        if hybrid:
            self._check_hybrid_schedule(meta, action)
        got = {(rid, b) for rid, m in meta.request_meta.items() for b in m.dump_block_ids}
        want = {(_name(d["req"]), self.block_ids[_name(d["block"])]) for d in call["dump"]}
        if got != want:
            raise StepMismatch(f"build_connector_meta dump slices: model {self._slices(want)}, "
                               f"implementation {self._slices(got)}")
        got = {(rid, b) for rid, m in meta.request_meta.items() for b in m.load_block_ids}
        want = {(_name(d["req"]), self.block_ids[_name(d["block"])]) for d in call.get("load", ())}
        if got != want:
            raise StepMismatch(f"build_connector_meta load slices: model {self._slices(want)}, "
                               f"implementation {self._slices(got)}")
        got_async = {rid for rid, m in meta.request_meta.items() if m.load_async}
        if got_async != parked:
            raise StepMismatch(f"build_connector_meta asynchronous loads: model {sorted(parked)}, "
                               f"implementation {sorted(got_async)}")

    def _promote(self, req_state: dict[Value, Any], blocks_of: Mapping[Value, Any], sw_of: Mapping[Value, Any],
                 call: Record) -> tuple[list[NewRequestView], list[CachedRequestView], set[str]]:
        """vLLM's `_update_waiting_for_remote_kv` at the start of a schedule (updates ``req_state``): a request
        whose receive succeeded is scheduled on its loaded block without a second lookup, as new (or resumed,
        after a preemption: `_handle_blocked_waiting_request`); one whose receive failed has its block freed and
        waits to be admitted afresh (in this same schedule, if the record allocates it)."""
        new: list[NewRequestView] = []
        cached: list[CachedRequestView] = []
        failed = _names(call["failed"])
        for req in sorted(call["reqs"], key=_name):
            rid = _name(req)
            if rid in failed:
                req_state[req] = "waiting"
                continue
            req_state[req] = "promoted"
            view = self.requests[rid]
            blocks = tuple(self.block_ids[_name(b)] for b in blocks_of[req])
            groups = (tuple(self._sw_id(b) for b in sw_of[req]),) if self.constants.hybrid else ()
            matched = self.async_matched.pop(rid)
            chunk = view.num_prompt_tokens - matched
            if rid in self.resumed:
                cached.append(CachedRequestView(rid, blocks, True, matched, chunk, groups))
            else:
                new.append(NewRequestView(rid, view.token_ids, view.num_prompt_tokens, blocks, matched, chunk, groups))
        return new, cached, {_name(r) for r in call["reqs"]} - failed

    def _show_block(self, block: int) -> str:
        """A block id as the model names it (vLLM's null block has no model name)."""
        return "null block" if block == NULL_BLOCK and self.constants.hybrid else self.block_names.get(block, str(block))

    def _model_block(self, block: int) -> Value:
        """An implementation block id as a model value: the model's null block is the integer 0."""
        return 0 if block == NULL_BLOCK and self.constants.hybrid else ModelValue(self.block_names[block])

    def _sw_id(self, block: Value) -> int:
        """A sliding-window list entry: a block, or (the integer 0) vLLM's null block."""
        return NULL_BLOCK if block == 0 else self.block_ids[_name(block)]

    def _check_hybrid_schedule(self, meta: DeferDumpMetadata, action: Record) -> None:
        """The sliding-window block of each dump slice, and the freed set (see the module docstring)."""
        call = next(c for c in action["calls"] if c["name"] == "build_connector_meta")
        got = {(rid, b) for rid, m in meta.request_meta.items() for ids in m.dump_group_block_ids for b in ids}
        want = {(_name(d["req"]), self.block_ids[_name(d["sw"])]) for d in call["dump"]}
        if got != want:
            raise StepMismatch(f"build_connector_meta sliding-window dump slices: model {self._slices(want)}, "
                               f"implementation {self._slices(got)}")
        freed = set(meta.freed_block_ids)
        model_freed = {self.block_ids[_name(b)] for b in call["freed_blocks"]}
        window = {self.block_ids[_name(b)] for b in action["sw_freed"]}
        if not window <= freed or not freed <= model_freed:
            names = lambda ids: sorted(self._show_block(b) for b in ids)  # noqa: E731
            raise StepMismatch(f"build_connector_meta freed blocks: implementation {names(freed)}, model "
                               f"{names(model_freed)} (window frees of this schedule {names(window)})")

    def _slices(self, pairs: set[tuple[str, int]]) -> str:
        return "{" + ", ".join(f"{r}:{self._show_block(b)}" for r, b in sorted(pairs)) + "}"

    def _execute_model(self, action: Record) -> None:
        if self.executed >= len(self.inflight):
            raise StepMismatch("execute_model with no scheduled step to run")
        meta = self.inflight[self.executed]
        self.executed += 1
        ranks = action["ranks"]
        for index, rank in enumerate(self.constants.ranks):
            self._rank_step(index, meta, list(ranks[rank]))

    def _rank_step(self, w: int, meta: DeferDumpMetadata, calls: list[Record]) -> None:
        worker, store = self.workers[w], self.stores[w]
        layer_records = any(c["name"] == "save_kv_layer" for c in calls)
        loads_started = False
        for call in calls:
            name = call["name"]
            waited_from = len(store.waited)
            if name == "start_load_kv":  # async_loads: recorded apart, before the forward
                self._start_load_kv(w, meta, call)
                loads_started = True
            elif name == "handle_preemptions":
                if not self.profile.set_preemption_api:
                    worker.handle_preemptions(meta)
                elif meta.preempted_req_ids:  # older vLLM: the set, and only in a step that preempted
                    worker.handle_preemptions(set(meta.preempted_req_ids))
                self._check_waits(w, "handle_preemptions", store.waited[waited_from:], call["waited"])
            elif name == "forward":
                if not loads_started:
                    worker.bind_connector_metadata(meta)
                    worker.start_load_kv()
                for layer in range(self.constants.layers):  # each attention layer waits its load first
                    worker.wait_for_layer_load(f"layer.{layer}")
                if not layer_records:  # vLLM calls save_kv_layer for every layer; none may submit here
                    for layer in range(self.constants.layers):
                        self._submitting(w, f"save_kv_layer(layer.{layer})", 0, False,
                                         lambda layer=layer: worker.save_kv_layer(f"layer.{layer}"))
            elif name == "save_kv_layer":
                layer_name = f"layer.{int(call['layer']) - 1}"
                self._submitting(w, f"save_kv_layer({layer_name})", int(call["submitted"]),
                                 bool(call["submit_error"]), lambda: worker.save_kv_layer(layer_name))
            elif name == "wait_for_save":
                store.check_fail = bool(call["check_error"])
                try:
                    self._submitting(w, "wait_for_save", int(call["submitted"]), bool(call["submit_error"]),
                                     worker.wait_for_save)
                finally:
                    store.check_fail = False
                expected = set(call["reaped"]) | {Record(task=t) for t in call["blocked"]}
                self._check_waits(w, "wait_for_save", store.waited[waited_from:], expected)
            elif name == "get_finished":
                finished = _names(call["finished_req_ids"])
                loading = {rid: load.parts for rid, load in self._inner(w)._pending_loads.items()}
                sending, receiving = worker.get_finished(set(finished))
                self._check_waits(w, "get_finished", store.waited[waited_from:], call["waited"])
                got, want = set(sending or ()), _names(call["ucm_sending"])
                if got != want:
                    raise StepMismatch(f"rank {self.constants.ranks[w]} get_finished({sorted(finished)}): finished_sending model "
                                       f"{sorted(want)}, implementation {sorted(got)}")
                self._check_recving(w, call, set(receiving or ()), loading)
                for rid in got:
                    self.reports[w][rid] = min(2, self.reports[w][rid] + 1)
            else:
                raise StepMismatch(f"rank {self.constants.ranks[w]}: unknown call record {name!r}")
        worker.clear_connector_metadata()

    def _inner(self, w: int) -> DirectConnector:
        worker = self.workers[w]
        return worker.inner if self.constants.wrapper else worker

    def _start_load_kv(self, w: int, meta: DeferDumpMetadata, call: Record) -> None:
        """Bind and ``start_load_kv``: the load tasks it submits (request, block) must be the model's."""
        worker, inner = self.workers[w], self._inner(w)
        before = {rid: len(load.parts) for rid, load in inner._pending_loads.items()}
        worker.bind_connector_metadata(meta)
        worker.start_load_kv()
        got = {(rid, b) for rid, load in inner._pending_loads.items()
               for part in load.parts[before.get(rid, 0):] for b in part.block_ids}
        want = {(_name(req), self.block_ids[_name(block)]) for req, block in call["submitted"]}
        if got != want:
            raise StepMismatch(f"rank {self.constants.ranks[w]} start_load_kv submitted loads: model "
                               f"{self._slices(want)}, implementation {self._slices(got)}")

    def _check_recving(self, w: int, call: Record, receiving: set[str], loading: Mapping[str, Any]) -> None:
        """finished_recving, and failed_recving as the connector reports it: with one KV-cache group the load
        errors of the failed requests' blocks (vLLM's `get_block_ids_with_load_errors`, read right after
        `get_finished`); with several (hybrid) the failed requests themselves (`failed_recving` of
        `get_transfer_results`: vLLM 0.32 raises on block-level errors there) and no block errors."""
        rank = self.constants.ranks[w]
        want = _names(call["finished_recving"]) if "finished_recving" in call else set()
        if receiving != want:
            raise StepMismatch(f"rank {rank} get_finished: finished_recving model {sorted(want)}, "
                               f"implementation {sorted(receiving)}")
        errors = set(self.workers[w].get_block_ids_with_load_errors())
        failed = _names(call["failed_recving"]) if "failed_recving" in call else set()
        if self.constants.hybrid:
            got = set(self.workers[w].take_failed_recving())
            if got != failed or errors:
                raise StepMismatch(f"rank {rank} get_transfer_results: failed_recving model {sorted(failed)}, "
                                   f"implementation {sorted(got)} (block errors "
                                   f"{sorted(self.block_names.get(b, str(b)) for b in errors)})")
            return
        want_errors = {b for rid in failed for part in loading.get(rid, ()) for b in part.block_ids}
        if errors != want_errors:
            raise StepMismatch(f"rank {rank} get_block_ids_with_load_errors: model (failed_recving {sorted(failed)}) "
                               f"{sorted(self._show_block(b) for b in want_errors)}, implementation "
                               f"{sorted(self.block_names.get(b, str(b)) for b in errors)}")

    def _submitting(self, w: int, what: str, submitted: int, submit_error: bool, call: Any) -> None:
        """Run a call that may submit one dump task; inject a submit failure if the record has one."""
        worker, store, device = self.workers[w], self.stores[w], self.devices[w]
        before = {id(p) for p in worker._pending_dump_tasks}
        # the model's submit failure, injected at the store's dump or (profile) at the device read before it
        fault_at_read = self.profile.submit_fault_at_read
        store.submit_fail_next = 1 if submit_error and not fault_at_read else 0
        device.read_fail_next = 1 if submit_error and fault_at_read else 0
        try:
            call()
        finally:
            unused = store.submit_fail_next + device.read_fail_next
            store.submit_fail_next = 0
            device.read_fail_next = 0
        if submit_error and unused:
            raise StepMismatch(f"rank {self.constants.ranks[w]} {what}: the model submits (and fails), the implementation did not submit")
        new = [p for p in worker._pending_dump_tasks if id(p) not in before]
        if submitted == 0 and new:
            raise StepMismatch(f"rank {self.constants.ranks[w]} {what}: the implementation submitted {len(new)} task(s), the model none")
        if submitted != 0:
            if len(new) != 1:
                raise StepMismatch(f"rank {self.constants.ranks[w]} {what}: the model submits task {submitted}, "
                                   f"the implementation submitted {len(new)}")
            task = new[0]
            self.model_ids[w][id(task)] = submitted
            self.by_model_id[w][submitted] = task
            self.store_task_ids[w][task.task.task_id] = submitted
            if task.event_handle:
                self.handle_ids[w][task.event_handle] = submitted

    def _check_waits(self, w: int, what: str, waited: list[StoreTask], expected: Iterable[Record]) -> None:
        got = sorted(self.store_task_ids[w].get(t.task_id, -t.task_id) for t in waited if t.kind == "dump")
        want = sorted(int(x["task"]) for x in expected)
        if got != want:
            raise StepMismatch(f"rank {self.constants.ranks[w]} {what} waited tasks: model {want}, implementation {got}")

    def _update_from_output(self, before: Mapping[str, Value], action: Record) -> None:
        if not self.inflight or self.executed < 1:
            raise StepMismatch("update_from_output with no executed step")
        self.inflight.popleft()
        self.executed -= 1
        first = action["calls"][0]
        delayed = _names(first["ucm_delayed"]) if first["name"] == "request_finished" else set()
        use_all_groups = self.constants.hma and not self.constants.multi
        for req in sorted(action["finished"], key=_name):
            rid = _name(req)
            view = self.requests[rid]
            blocks = [self.block_ids[_name(b)] for b in before["blocksOf"][req]]
            if use_all_groups and self.constants.hybrid:  # the record's lists: freed positions are the null block
                full, window = action["calls"][0]["block_ids"][req]
                lists = tuple([NULL_BLOCK if b == 0 else self.block_ids[_name(b)] for b in seq] for seq in (full, window))
                delay, params = self.scheduler.request_finished_all_groups(view, lists)
            elif use_all_groups:
                delay, params = self.scheduler.request_finished_all_groups(view, (blocks,))
            else:
                delay, params = self.scheduler.request_finished(view, blocks)
            if bool(delay) != (rid in delayed) or params is not None:
                call = "request_finished_all_groups" if use_all_groups else "request_finished"
                raise StepMismatch(f"{call}({rid}): model delays={rid in delayed}, implementation "
                                   f"returned ({delay}, {params})")
        for call in action["calls"]:  # async_loads: the aggregated receives reach the scheduler's connector
            if call["name"] == "_update_from_kv_xfer_finished" and "finished_recving" in call:
                self.scheduler.update_connector_output(_names(call["finished_recving"]))

    def _finish_requests(self, before: Mapping[str, Value], action: Record) -> None:
        """An abort (``Scheduler.finish_requests``): a request waiting for remote KV is finished through
        ``request_finished``, whose answer must be the model's (vLLM delays the free itself until the receive)."""
        for call in action["calls"]:
            rid = _name(action["req"])
            blocks = [self.block_ids[_name(b)] for b in before["blocksOf"][action["req"]]]
            delay, params = self.scheduler.request_finished(self.requests[rid], blocks)
            want = rid in _names(call["ucm_delayed"])
            if bool(delay) != want or params is not None:
                raise StepMismatch(f"request_finished({rid}) at an abort: model delays={want}, implementation "
                                   f"returned ({delay}, {params})")
        self.async_matched.pop(_name(action["req"]), None)

    def _load_complete(self, action: Record) -> None:
        """The rank's store ends the request's load task of the block (under Hybrid: of the group's
        ``blocks``, one store task): completed, or failed."""
        w = self.constants.ranks.index(int(action["rank"]))
        rid = _name(action["req"])
        blocks = {self.block_ids[_name(b)] for b in (action["blocks"] if "blocks" in action else [action["block"]])}
        block = min(blocks)
        load = self._inner(w)._pending_loads.get(rid)
        parts = [] if load is None else [p for p in load.parts if block in p.block_ids and p.task is not None]
        running = [p.task for p in parts if not self.stores[w].finished(p.task)]
        if not running:
            raise StepMismatch(f"load_complete: rank {self.constants.ranks[w]} has no running load of {rid} into "
                               f"{self._show_block(block)} in the implementation")
        if "blocks" in action and set(parts[0].block_ids) != blocks:
            raise StepMismatch(f"load_complete: the implementation's store task of {rid} loads "
                               f"{sorted(self._show_block(b) for b in parts[0].block_ids)}, the model's "
                               f"{sorted(self._show_block(b) for b in blocks)}")
        outcome = str(action["outcome"])
        if outcome == "done":
            self.stores[w].complete(running[0])
        elif outcome == "failed":
            self.stores[w].fail(running[0])
        else:
            raise StepMismatch(f"load_complete: outcome {outcome!r} (a lost load) has no store event in the replay")
        self.load_outcomes[w][running[0].task_id] = outcome

    def _task_complete(self, action: Record) -> None:
        """One task (``rank``, ``task``), or under Lockstep every running task of ``ranks`` (``tasks``)."""
        if "tasks" in action:
            finished = [(int(rank), int(task)) for rank, tasks in action["tasks"].items() for task in tasks]
        else:
            finished = [(int(action["rank"]), int(action["task"]))]
        for rank, task_id in finished:
            self._finish(self.constants.ranks.index(rank), task_id, str(action["outcome"]))

    def _shutdown(self, action: Record) -> None:
        """Worker shutdown (KVConnectorBase_V1.shutdown): each rank waits every pending task, releasing its
        handle; the waits must be the model's."""
        for index, rank in enumerate(self.constants.ranks):
            store = self.stores[index]
            waited_from = len(store.waited)
            self.workers[index].shutdown()
            self._check_waits(index, "shutdown", store.waited[waited_from:], action["ranks"][rank])

    def _finish(self, w: int, task_id: int, outcome: str) -> None:
        pending = self.by_model_id[w].get(task_id)
        if pending is None or id(pending) not in {id(p) for p in self.workers[w]._pending_dump_tasks}:
            raise StepMismatch(f"task_complete: rank {self.constants.ranks[w]} has no pending task {task_id} "
                               "in the implementation")
        if outcome == "ok":
            self.stores[w].complete(pending.task)
            self.outcomes[w][task_id] = "done"
        else:
            self.stores[w].fail(pending.task)
            self.outcomes[w][task_id] = "failed"

    # ------------------------------------------------------------------ refinement mapping
    def _task_record(self, w: int, pending: PendingDumpTask) -> Record:
        model_id = self.model_ids[w].get(id(pending), -1)
        store = self.stores[w]
        try:
            finished = store.finished(pending.task)
        except Exception:  # already waited (the implementation kept a waited task)
            finished = True
        status = self.outcomes[w].get(model_id, "done") if finished else "running"
        layer = 0 if pending.layer_name is None else int(pending.layer_name.rsplit(".", 1)[1]) + 1
        fields = (model_id, pending.request_ids, pending.block_ids, layer, status,
                  model_id if pending.event_handle else 0)
        record = self._records.get(fields)
        if record is None:
            record = self._records[fields] = Record(
                id=model_id, reqs=_reqs(pending.request_ids),
                blocks=TlaSet(self._model_block(b) for b in sorted(set(pending.block_ids))),
                layer=layer, status=status, event=fields[5])
        return record

    def abstract_state(self) -> dict[str, Value]:
        ranks = list(enumerate(self.constants.ranks))  # (implementation index, model rank)
        state: dict[str, Value] = {
            "schedAsync": _reqs(self.scheduler._async_dump_req_ids),
            "workerAsync": TlaFunction((r, _reqs(self.workers[i]._async_dump_req_ids)) for i, r in ranks),
            "pending": TlaFunction((r, TlaSet(self._task_record(i, p) for p in self.workers[i]._pending_dump_tasks))
                                   for i, r in ranks),
        }
        if "live" in self.observed:
            state["live"] = TlaFunction(
                (r, TlaSet(self.handle_ids[i].get(h, -h) for h in self.workers[i].events.live_handles())) for i, r in ranks)
        if "reported" in self.observed:
            state["reported"] = TlaFunction(
                (r, TlaFunction((ModelValue(q), self.reports[i][q]) for q in self.constants.requests)) for i, r in ranks)
        if "loadTasks" in self.observed:
            state["loadTasks"] = TlaFunction((r, TlaSet(self._load_records(i))) for i, r in ranks)
            state["workerRecv"] = TlaFunction((r, _reqs(self._inner(i)._pending_loads)) for i, r in ranks)
        return state

    def _load_records(self, w: int) -> list[Record]:
        """Rank w's asynchronous load tasks as the model's ``[req, block, status]`` (one per block)."""
        store, records = self.stores[w], []
        for rid, load in self._inner(w)._pending_loads.items():
            for part in load.parts:
                if part.task is None:
                    status = "failed"  # a refused submit: a failed load (the model has no such event)
                elif store.finished(part.task):
                    status = self.load_outcomes[w].get(part.task.task_id, "done")
                else:
                    status = "running"
                records += [Record(req=ModelValue(rid), block=self._model_block(b), status=status)
                            for b in part.block_ids]
        return records

    def model_view(self, state: Mapping[str, Value]) -> dict[str, Value]:
        view = {name: state[name] for name in self.observed}
        if self.profile.observes_events:
            if all(isinstance(t, Record) and t.keys() == _TASK_FIELD_SET
                   for tasks in state["pending"].values() for t in tasks):
                return view  # the model's tasks have exactly the observed fields (IsTask): nothing to project
            view["pending"] = TlaFunction(
                (w, TlaSet(Record({f: t[f] for f in _TASK_FIELDS}) for t in tasks))
                for w, tasks in state["pending"].items())
        else:  # no handles: the model's task events have no image (see the module docstring)
            view["pending"] = TlaFunction(
                (w, TlaSet(Record({f: 0 if f == "event" else t[f] for f in _TASK_FIELDS}) for t in tasks))
                for w, tasks in state["pending"].items())
        return view
