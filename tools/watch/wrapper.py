"""The watching wrapper: any vLLM KV connector, forwarded call for call, with a boundary log and a scribble.

Load it with `kv_transfer_config={"kv_connector": "WatchConnector" (or "WatchConnectorHMA" when the inner
connector supports HMA: vLLM decides HMA from the configured class), "kv_connector_module_path":
"deferdump.tools.watch.wrapper", "kv_connector_extra_config": {"inner": {...}, "log_dir": DIR,
"scribble": bool}}` (`deferdump.tools.watch.config.watch_transfer_config` builds it).

The inner connector is built as vLLM's MultiConnector builds a child (multi_connector.py ~226-249): a
shallow copy of the vLLM config holding the inner kv_transfer_config. Every method, property and
class-level decision vLLM reaches through the configured class is forwarded (what a wrapper must get
right: shared/notes/third-party-connectors.md). With no log and no scribble the wrapper adds nothing but
an envelope around the scheduler's metadata, which it unwraps before the inner connector sees it.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from deferdump.reference.errors import DeferDumpError
from deferdump.reference.tracelog import SCHEDULER, WORKER, TraceLog, ids
from deferdump.tools.watch.config import WatchConfig
from deferdump.tools.watch.fresh import fresh_blocks, step_fresh_blocks

from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
    supports_hma,
)

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class WatchMetadata(KVConnectorMetadata):
    """The inner connector's metadata for a step, and the blocks vLLM handed out from its free pool."""

    inner: KVConnectorMetadata
    fresh_block_ids: tuple[int, ...] = ()
    preempted: tuple[str, ...] = ()


def inner_vllm_config(vllm_config: "VllmConfig", watch: WatchConfig) -> "VllmConfig":
    """The vLLM config the inner connector sees: ours with its own kv_transfer_config (as MultiConnector does)."""
    outer = vllm_config.kv_transfer_config
    assert outer is not None
    inner = dict(watch.inner)
    inner.setdefault("kv_role", outer.kv_role)
    inner.setdefault("engine_id", outer.engine_id)
    config = copy.copy(vllm_config)
    config.kv_transfer_config = KVTransferConfig(**inner)
    return config


def inner_class(vllm_config: "VllmConfig") -> tuple[type[KVConnectorBase_V1], "VllmConfig"]:
    """The inner connector's class and vLLM config, from the wrapper's vLLM config."""
    transfer = vllm_config.kv_transfer_config
    assert transfer is not None
    watch = WatchConfig.from_extra_config(transfer.kv_connector_extra_config)
    config = inner_vllm_config(vllm_config, watch)
    return KVConnectorFactory.get_connector_class(config.kv_transfer_config), config  # type: ignore[return-value]


def inner_is_hma(inner_config: "VllmConfig") -> bool:
    """Does the inner kv_transfer_config support HMA (MultiConnector: all its children do)?"""
    return KVConnectorFactory.supports_hma_config(inner_config.kv_transfer_config)


class WatchConnector(KVConnectorBase_V1):
    """The non-HMA wrapper: vLLM calls `request_finished(request, block_ids)` on it."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig") -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        self.watch = WatchConfig.from_extra_config(transfer.kv_connector_extra_config)
        cls, config = inner_class(vllm_config)
        hma = isinstance(self, SupportsHMA)
        if hma != inner_is_hma(config):
            raise DeferDumpError(
                f"{type(self).__name__} wraps {cls.__qualname__}, which {'does not support' if hma else 'supports'} "
                f"HMA: configure {'WatchConnector' if hma else 'WatchConnectorHMA'}")
        self.inner: KVConnectorBase_V1 = cls(config, role, kv_cache_config)
        self._block_size = vllm_config.cache_config.block_size
        self._num_blocks = kv_cache_config.num_blocks
        self._local_hits: dict[str, int] = {}  # scheduler: the local hit vLLM last told us, per request
        self._async_loads: set[str] = set()  # scheduler: answered load_async with tokens to load
        self._parked_fresh: set[int] = set()  # scheduler: blocks handed to requests parked for a load, this step
        self._kv_caches: list["torch.Tensor"] = []  # worker: the layers' KV tensors (scribble targets)
        self._step_meta: Any = None  # worker: the metadata of the step being logged
        self._log: TraceLog | None = None
        if self.watch.log_dir is not None:
            if role == KVConnectorRole.SCHEDULER:
                self._log = TraceLog(self.watch.log_dir, SCHEDULER, 0, str(transfer.engine_id))
            else:
                self._log = TraceLog(self.watch.log_dir, WORKER, _worker_rank(), str(transfer.engine_id))
            self._log.write("connector", inner=f"{cls.__module__}.{cls.__qualname__}", hma=hma,
                            scribble=self.watch.scribble)
        logger.info("deferdump watch %s wrapper around %s (scribble=%s, log=%s)", role.name.lower(),
                    cls.__qualname__, self.watch.scribble, self.watch.log_dir)

    # ------------------------------------------------------------ class-level decisions
    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> str | None:
        inner, config = inner_class(vllm_config)
        return inner.get_required_kvcache_layout(config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        inner = WatchConfig.from_extra_config(extra_config).inner
        inner_cls = KVConnectorFactory.get_connector_class(KVTransferConfig(**inner))
        return inner_cls.requires_piecewise_for_cudagraph(inner.get("kv_connector_extra_config", {}))

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> Any:
        """Stats travel wrapped under the inner class name (as MultiConnector's children's do). Across
        processes they arrive as dicts: rebuilt by the inner class when vLLM's registry knows its name,
        else kept as vLLM's generic `KVConnectorStats` (a class has no config to find a module-path class)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
        from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorStats

        if data is None:
            return MultiKVConnectorStats()
        rebuilt: dict[str, Any] = {}
        for name, value in data.items():
            if isinstance(value, KVConnectorStats):
                rebuilt[name] = value
                continue
            try:
                stats = KVConnectorFactory.get_connector_class_by_name(name).build_kv_connector_stats(data=value)
            except ValueError:
                stats = KVConnectorStats(data=value)
            if stats is not None:
                rebuilt[name] = stats
        return MultiKVConnectorStats(data=rebuilt)

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: Any, labelnames: Any,
                           per_engine_labelvalues: Any) -> Any:
        """The inner class's metrics (None when it has none, as vLLM would get from it alone), fed the
        inner connector's stats out of their wrapping."""
        from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorPromMetrics

        inner, config = inner_class(vllm_config)
        metrics = inner.build_prom_metrics(config, metric_types, labelnames, per_engine_labelvalues)
        if metrics is None:
            return None
        return MultiKVConnectorPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues,
                                           {inner.__name__: metrics})

    # ------------------------------------------------------------ properties
    @property
    def requires_kv_delivery(self) -> bool:
        return self.inner.requires_kv_delivery

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return self.inner.supports_divergent_local_hybrid_hits

    @property
    def log_path(self) -> Any:
        """This instance's boundary log file (None without `log_dir`)."""
        return None if self._log is None else self._log.path

    # ------------------------------------------------------------ worker side
    def get_mem_pool_context(self) -> Any:
        return self.inner.get_mem_pool_context()

    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        self._kv_caches = list(kv_caches.values())
        self.inner.register_kv_caches(kv_caches)

    def set_host_xfer_buffer_ops(self, copy_operation: Any) -> None:
        self.inner.set_host_xfer_buffer_ops(copy_operation)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Bind the inner connector's metadata, and ours: the attention hook asks the outermost connector."""
        self._next_step(connector_metadata)
        self.inner.bind_connector_metadata(_unwrap(connector_metadata))
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        self.inner.clear_connector_metadata()
        super().clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """Called with the step's metadata before it is bound: unwrap it here too; then the scribble."""
        self._next_step(kv_connector_metadata)
        self.inner.handle_preemptions(_unwrap(kv_connector_metadata))
        if self._log is not None:
            self._log.write("handle_preemptions", preempted=ids(getattr(kv_connector_metadata, "preempted", ())))
        if self.watch.scribble and isinstance(kv_connector_metadata, WatchMetadata):
            self._scribble(kv_connector_metadata.fresh_block_ids)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self.inner.start_load_kv(forward_context, **kwargs)

    def finish_forward(self) -> None:
        self.inner.finish_forward()

    def reset_capture_state(self) -> None:
        self.inner.reset_capture_state()

    def wait_for_layer_load(self, layer_name: str) -> None:
        self.inner.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor", attn_metadata: Any, **kwargs: Any) -> None:
        self.inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        self.inner.wait_for_save()
        if self._log is not None:
            self._log.write("wait_for_save")

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        sending, recving = self.inner.get_finished(finished_req_ids)
        self._log_finished(finished_req_ids, sending, recving)
        return sending, recving

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        results = self.inner.get_transfer_results(finished_req_ids)
        self._log_finished(finished_req_ids, results.finished_sending, results.finished_recving)
        return results

    def get_block_ids_with_load_errors(self) -> set[int]:
        block_ids = self.inner.get_block_ids_with_load_errors()
        if self._log is not None and block_ids:
            self._log.write("get_block_ids_with_load_errors", block_ids=sorted(block_ids))
        return block_ids

    def get_kv_connector_stats(self) -> Any:
        from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorStats

        stats = self.inner.get_kv_connector_stats()
        return None if stats is None else MultiKVConnectorStats(data={type(self.inner).__name__: stats})

    def get_kv_connector_kv_cache_events(self) -> Any:
        return self.inner.get_kv_connector_kv_cache_events()

    def get_handshake_metadata(self) -> Any:
        return self.inner.get_handshake_metadata()

    def build_connector_worker_meta(self) -> Any:
        return self.inner.build_connector_worker_meta()

    def get_finished_count(self) -> int | None:
        return self.inner.get_finished_count()

    def set_xfer_handshake_metadata(self, metadata: Any) -> None:
        self.inner.set_xfer_handshake_metadata(metadata)

    def set_xfer_handshake_metadata_pp_aware(self, metadata: Any) -> None:
        self.inner.set_xfer_handshake_metadata_pp_aware(metadata)

    # ------------------------------------------------------------ scheduler side
    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)  # keeps vLLM's base bookkeeping on the wrapper too
        self.inner.bind_kv_cache_manager(kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        # Reached through the base bind_kv_cache_manager; the inner connector's own call binds its pool.
        return

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        return self.inner.get_loaded_kv_cache_group_ids(request)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        matched, load_async = self.inner.get_num_new_matched_tokens(request, num_computed_tokens)
        self._local_hits[request.request_id] = num_computed_tokens
        if load_async and matched:
            self._async_loads.add(request.request_id)
        else:
            self._async_loads.discard(request.request_id)
        if self._log is not None:
            self._log.write("get_num_new_matched_tokens", req=request.request_id,
                            num_computed_tokens=num_computed_tokens, matched=matched, load_async=bool(load_async))
        return matched, load_async

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> Any:
        return self.inner.get_external_cache_hit_sources(request, num_external_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.inner.update_state_after_alloc(request, blocks, num_external_tokens)
        req = request.request_id
        if self.watch.scribble and req in self._async_loads and num_external_tokens > 0 and req in self._local_hits:
            # Parked in WAITING_FOR_REMOTE_KVS, not scheduled this step: its blocks after the local hit are
            # fresh now (scribbled before the load starts); once received, the loaded prefix is live, so
            # when vLLM schedules it later only blocks past the loaded tokens are fresh.
            local = self._local_hits[req]
            self._parked_fresh.update(fresh_blocks([list(g) for g in blocks.get_block_ids()], local // self._block_size))
            self._local_hits[req] = local + num_external_tokens
            self._async_loads.discard(req)
        if self._log is not None:
            groups = [list(g) for g in blocks.get_block_ids()]
            fields: dict[str, Any] = {"block_ids": groups[0] if groups else []}
            if len(groups) > 1:
                fields["group_block_ids"] = groups[1:]
            self._log.write("update_state_after_alloc", req=request.request_id, **fields,
                            num_external_tokens=num_external_tokens)

    def on_new_request(self, request: Any) -> None:
        self.inner.on_new_request(request)

    def build_connector_meta(self, scheduler_output: Any) -> WatchMetadata:
        inner_meta = self.inner.build_connector_meta(scheduler_output)
        new = [(r.req_id, r.block_ids) for r in scheduler_output.scheduled_new_reqs]
        cached_out = scheduler_output.scheduled_cached_reqs
        cached = [(req, req in cached_out.resumed_req_ids, cached_out.new_block_ids[i] or ())
                  for i, req in enumerate(cached_out.req_ids)]
        fresh = step_fresh_blocks(new, cached, self._local_hits, self._block_size) if self.watch.scribble else []
        if self._parked_fresh:
            fresh = sorted(set(fresh) | self._parked_fresh)
            self._parked_fresh.clear()
        for req in scheduler_output.finished_req_ids:
            self._local_hits.pop(req, None)
            self._async_loads.discard(req)
        if self._log is not None:
            self._log.next_step()
            self._log.write("build_connector_meta", **_step_fields(scheduler_output, self._block_size))
        return WatchMetadata(inner=inner_meta, fresh_block_ids=tuple(fresh),
                             preempted=tuple(ids(scheduler_output.preempted_req_ids)))

    def update_connector_output(self, connector_output: Any) -> None:
        self.inner.update_connector_output(connector_output)
        if self._log is not None:
            invalid = sorted(connector_output.invalid_block_ids or ())
            self._log.write("update_connector_output", finished_sending=ids(connector_output.finished_sending),
                            finished_recving=ids(connector_output.finished_recving),
                            **({"invalid_block_ids": invalid} if invalid else {}))

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        delayed, params = self.inner.request_finished(request, block_ids)
        if self._log is not None:
            self._log.write("request_finished", req=request.request_id, block_ids=list(block_ids),
                            delayed=bool(delayed))
        return delayed, params

    def register_finished_partial_tail(self, request: Any, block_ids: Any, partial_tail_offloads: Any) -> bool:
        return self.inner.register_finished_partial_tail(request, block_ids, partial_tail_offloads)

    def take_events(self) -> Iterable[Any]:
        return self.inner.take_events()

    def has_pending_block_frees(self) -> bool:
        return self.inner.has_pending_block_frees()

    def has_pending_push_work(self) -> bool:
        return self.inner.has_pending_push_work()

    def reset_cache(self) -> bool | None:
        return self.inner.reset_cache()

    # ------------------------------------------------------------ both sides
    def shutdown(self) -> None:
        try:
            self.inner.shutdown()
        finally:
            if self._log is not None:
                self._log.write("shutdown", waited=[])
                self._log.close()

    # ------------------------------------------------------------ helpers
    def _next_step(self, metadata: Any) -> None:
        """A worker step begins with the first call carrying its metadata (handle_preemptions comes first)."""
        if metadata is not self._step_meta:
            self._step_meta = metadata
            if self._log is not None:
                self._log.next_step()

    def _log_finished(self, finished_req_ids: Any, sending: Any, recving: Any) -> None:
        if self._log is not None:
            self._log.write("get_finished", finished_req_ids=ids(finished_req_ids), reported=ids(sending),
                            reported_recving=ids(recving))

    def _scribble(self, block_ids: tuple[int, ...]) -> None:
        """Overwrite the blocks vLLM just handed out, in every layer (block ids are global to vLLM's pool)."""
        if not block_ids or not self._kv_caches:
            return
        from deferdump.tools.watch.scribble import scribble_blocks

        scribble_blocks(self._kv_caches, self._num_blocks, block_ids)
        if self._log is not None:
            self._log.write("scribble", block_ids=list(block_ids))


class WatchConnectorHMA(WatchConnector, SupportsHMA):
    """The HMA wrapper: vLLM keeps its hybrid KV-cache manager and calls `request_finished_all_groups`."""

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        delayed, params = self.inner.request_finished_all_groups(request, block_ids)  # type: ignore[attr-defined]
        if self._log is not None:
            groups = [list(g) for g in block_ids]
            self._log.write("request_finished", req=request.request_id, block_ids=groups[0] if groups else [],
                            **({"group_block_ids": groups[1:]} if len(groups) > 1 else {}), delayed=bool(delayed))
        return delayed, params


def _unwrap(metadata: Any) -> Any:
    return metadata.inner if isinstance(metadata, WatchMetadata) else metadata


def _worker_rank() -> int:
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, model_parallel_is_initialized

    return get_tensor_model_parallel_rank() if model_parallel_is_initialized() else 0


def _step_fields(out: Any, block_size: int) -> dict[str, Any]:
    """`build_connector_meta`'s boundary-log line: scheduled requests with their blocks, preempted, finished."""
    def entry(req: str, new: bool, resumed: bool, groups: Any, computed: int) -> dict[str, Any]:
        lists = [list(g) for g in (groups or ())]
        fields: dict[str, Any] = {"req": req, "new": new, "resumed": resumed, "block_ids": lists[0] if lists else [],
                                  "num_computed_tokens": computed,
                                  "num_scheduled_tokens": out.num_scheduled_tokens.get(req, 0)}
        if len(lists) > 1:
            fields["group_block_ids"] = lists[1:]
        return fields

    cached = out.scheduled_cached_reqs
    reqs = [entry(r.req_id, True, False, r.block_ids, r.num_computed_tokens) for r in out.scheduled_new_reqs] + [
        entry(req, False, req in cached.resumed_req_ids, cached.new_block_ids[i], cached.num_computed_tokens[i])
        for i, req in enumerate(cached.req_ids)]
    return {"block_size": block_size, "reqs": reqs, "preempted": ids(out.preempted_req_ids),
            "finished": ids(out.finished_req_ids)}


def wrapped_connectors(connector: Any) -> Iterable[WatchConnector]:
    """The watching wrappers inside a vLLM connector (itself, or MultiConnector children)."""
    if isinstance(connector, WatchConnector):
        yield connector
        return
    for child in getattr(connector, "sub_connectors", ()) or ():
        yield from wrapped_connectors(child)


__all__ = ["WatchConnector", "WatchConnectorHMA", "WatchMetadata", "supports_hma", "wrapped_connectors"]
