"""Builders shared by the reference connector tests: configs, views, small real KV caches."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from deferdump.reference import (
    OuterConnector,
    CachedRequestView,
    ConnectorConfig,
    DeferDumpMetadata,
    DirectConnector,
    NewRequestView,
    RequestDispatchMeta,
    RequestView,
    Role,
    StepView,
)
from deferdump.reference.stores.base import KVStore
from deferdump.reference.testing.late_copy import LateCopyDevice

BLOCK_SIZE = 4
NUM_BLOCKS = 16


def cpu_kv_caches(layers: int = 2, num_blocks: int = NUM_BLOCKS, seed: int = 0) -> dict[str, torch.Tensor]:
    """vLLM's CPU layout [num_blocks, kv_heads, block_size, 2*head_dim], random contents."""
    generator = torch.Generator().manual_seed(seed)
    return {f"layer.{i}": torch.randn(num_blocks, 2, BLOCK_SIZE, 8, generator=generator) for i in range(layers)}


def request(req_id: str, num_tokens: int, base: int = 0) -> RequestView:
    return RequestView(req_id, tuple(range(base, base + num_tokens)), num_tokens)


def new_req(view: RequestView, block_ids: Sequence[int], scheduled: int, computed: int = 0) -> NewRequestView:
    return NewRequestView(view.req_id, view.token_ids, view.num_prompt_tokens, tuple(block_ids), computed, scheduled)


def cached_req(
    req_id: str, new_block_ids: Sequence[int], scheduled: int, computed: int, resumed: bool = False
) -> CachedRequestView:
    return CachedRequestView(req_id, tuple(new_block_ids), resumed, computed, scheduled)


def step(new=(), cached=(), finished=(), preempted=()) -> StepView:
    return StepView(tuple(new), tuple(cached), frozenset(finished), frozenset(preempted))


def dump_meta(*entries: tuple[str, Sequence[int]], preempted: Sequence[str] = ()) -> DeferDumpMetadata:
    """Metadata giving each (req_id, block_ids) a dump slice with one distinct hash per block."""
    request_meta = {
        req_id: RequestDispatchMeta(
            dump_hashes=tuple(f"{req_id}:{b}".encode() for b in block_ids), dump_block_ids=tuple(block_ids)
        )
        for req_id, block_ids in entries
    }
    return DeferDumpMetadata(request_meta, frozenset(preempted))


def worker(
    store: KVStore,
    *,
    cls: type[DirectConnector] = DirectConnector,
    config: ConnectorConfig | None = None,
    rank: int = 0,
    world_size: int = 1,
    deferred: bool = True,
    kv_caches: dict[str, torch.Tensor] | None = None,
) -> DirectConnector:
    """A worker connector on real CPU tensors; `deferred` copies read their blocks only when stored."""
    connector = cls(
        config or ConnectorConfig(block_size=BLOCK_SIZE), Role.WORKER, store=store,
        device=LateCopyDevice() if deferred else None, rank=rank, world_size=world_size,
    )
    connector.register_kv_caches(kv_caches if kv_caches is not None else cpu_kv_caches())
    return connector


def run_save_step(connector: DirectConnector, meta: DeferDumpMetadata, layers: Sequence[str] = ()) -> None:
    """One worker step's dump half: bind, layer saves, wait_for_save, clear."""
    connector.bind_connector_metadata(meta)
    connector.start_load_kv()
    for layer in layers:
        connector.wait_for_layer_load(layer)
        connector.save_kv_layer(layer)
    connector.wait_for_save()
    connector.clear_connector_metadata()


def deployment(config: ConnectorConfig, caches: dict[str, torch.Tensor]) -> tuple[OuterConnector, OuterConnector]:
    """A scheduler and one worker sharing one store the config names (the worker owns and closes it)."""
    worker = OuterConnector(config, Role.WORKER)
    worker.register_kv_caches(caches)
    scheduler = OuterConnector(config, Role.SCHEDULER, store=worker.store)
    return scheduler, worker


def run_request(scheduler: OuterConnector, worker: OuterConnector, req_id: str, tokens: int, blocks: list[int]) -> int:
    """Admit, run one full prefill step, finish; returns the external tokens the lookup found."""
    req = request(req_id, tokens)
    external, _ = scheduler.get_num_new_matched_tokens(req, 0)
    scheduler.update_state_after_alloc(req, blocks, external)
    meta = scheduler.build_connector_meta(step(new=[new_req(req, blocks, tokens - external, external)]))
    worker.handle_preemptions(meta)
    worker.bind_connector_metadata(meta)
    worker.start_load_kv()
    for layer in worker.inner.device.layout.layers:
        worker.wait_for_layer_load(layer.name)
        worker.save_kv_layer(layer.name)
    worker.wait_for_save()
    worker.clear_connector_metadata()
    delayed, _ = scheduler.request_finished(req, blocks)
    finished = {req_id}
    sending, _ = worker.get_finished(finished)
    assert (sending == finished) == delayed
    return external
