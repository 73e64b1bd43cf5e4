"""The adapter on real vLLM objects, without an engine: config errors, views, KV layouts, the shared store."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from vllm.config import KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig

from deferdump.reference.errors import ConfigError
from deferdump.reference.stores.base import ReadyPayload, StoreError
from deferdump.reference.vllm import DeferDumpConnector, step_view

NUM_BLOCKS = 10


def _vllm_config(extra: dict[str, Any]) -> VllmConfig:
    return VllmConfig(
        kv_transfer_config=KVTransferConfig(
            kv_connector="DeferDumpConnector",
            kv_connector_module_path="deferdump.reference.vllm",
            kv_role="kv_both",
            kv_connector_extra_config=extra,
        )
    )


def _kv_cache_config() -> KVCacheConfig:
    return KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[])


def test_adapter_bad_extra_config_key_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match="^varient: unknown config key") as excinfo:
        DeferDumpConnector(_vllm_config({"varient": "direct"}), KVConnectorRole.SCHEDULER, _kv_cache_config())
    assert isinstance(excinfo.value, ConfigError) and excinfo.value.key == "varient"
    with pytest.raises(ValueError, match="^store_path: is required"):
        DeferDumpConnector(_vllm_config({"store": "file"}), KVConnectorRole.WORKER, _kv_cache_config())


def test_adapter_block_size_defaults_to_vllm_and_must_match_it() -> None:
    config = _vllm_config({})
    connector = DeferDumpConnector(config, KVConnectorRole.SCHEDULER, _kv_cache_config())
    assert connector.config.block_size == config.cache_config.block_size
    assert connector.requires_kv_delivery is False  # a best-effort cache under kv_both
    connector.shutdown()
    with pytest.raises(ValueError, match="^block_size: is 7 but vLLM's block_size is"):
        DeferDumpConnector(_vllm_config({"block_size": 7}), KVConnectorRole.SCHEDULER, _kv_cache_config())


def test_adapter_roles_share_one_store_closed_by_the_last_shutdown() -> None:
    config = _vllm_config({"store": "memory"})
    scheduler = DeferDumpConnector(config, KVConnectorRole.SCHEDULER, _kv_cache_config())
    worker = DeferDumpConnector(config, KVConnectorRole.WORKER, _kv_cache_config())
    other_engine = DeferDumpConnector(_vllm_config({"store": "memory"}), KVConnectorRole.WORKER, _kv_cache_config())
    assert scheduler.store is worker.store is not other_engine.store
    payload = ReadyPayload(torch.zeros((1, 4), dtype=torch.uint8))
    scheduler.shutdown()
    worker.store.wait(worker.store.dump([b"still-open"], payload))  # the worker still holds it
    worker.shutdown()
    worker.shutdown()  # idempotent: vLLM may call it again on teardown
    with pytest.raises(StoreError):
        worker.store.dump([b"closed"], payload)
    other_engine.shutdown()


@pytest.mark.parametrize(
    ("shape", "block_dim"),
    [
        ((NUM_BLOCKS, 2, 16, 64), 0),  # CPU: [num_blocks, kv_heads, block_size, 2*head_dim]
        ((2, NUM_BLOCKS, 16, 2, 32), 1),  # CUDA: [2, num_blocks, block_size, heads, head_dim]
    ],
)
def test_adapter_finds_the_block_dimension_of_each_layout(shape: tuple[int, ...], block_dim: int) -> None:
    worker = DeferDumpConnector(_vllm_config({}), KVConnectorRole.WORKER, _kv_cache_config())
    caches = {f"model.layers.{i}.self_attn.attn": torch.randn(shape) for i in range(2)}
    worker.register_kv_caches(caches)
    layout = worker.core.inner.device.layout
    assert [layer.block_dim for layer in layout.layers] == [block_dim, block_dim]
    assert layout.num_blocks == NUM_BLOCKS
    assert layout.block_nbytes == sum(t.numel() * t.element_size() for t in caches.values()) // NUM_BLOCKS
    worker.shutdown()


def test_adapter_step_view_reads_new_cached_finished_and_preempted() -> None:
    new = NewRequestData(
        req_id="a", prompt_token_ids=[5, 6, 7], mm_features=[], sampling_params=None, pooling_params=None,
        block_ids=([3, 4],), num_computed_tokens=0, lora_request=None,
    )
    cached = CachedRequestData(
        req_ids=["b", "c"], resumed_req_ids={"c"}, new_token_ids=[[], []], all_token_ids={"c": [1, 2]},
        new_block_ids=[None, ([8, 9],)], num_computed_tokens=[40, 0], num_output_tokens=[2, 0],
    )
    output = SchedulerOutput(
        scheduled_new_reqs=[new], scheduled_cached_reqs=cached, num_scheduled_tokens={"a": 3, "b": 1, "c": 64},
        total_num_scheduled_tokens=68, scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
        finished_req_ids={"z"}, free_encoder_mm_hashes=[], preempted_req_ids={"y"},
    )
    step = step_view(output)
    [a] = step.new_requests
    assert (a.req_id, a.token_ids, a.num_prompt_tokens) == ("a", (5, 6, 7), 3)
    assert (a.block_ids, a.num_computed_tokens, a.num_scheduled_tokens) == ((3, 4), 0, 3)
    b, c = step.cached_requests
    assert (b.new_block_ids, b.resumed_from_preemption) == ((), False)
    assert (b.num_computed_tokens, b.num_scheduled_tokens) == (40, 1)
    assert (c.new_block_ids, c.resumed_from_preemption, c.num_scheduled_tokens) == ((8, 9), True, 64)
    assert step.finished_req_ids == {"z"} and step.preempted_req_ids == {"y"}
    assert output.finished_req_ids == {"z"}  # read, never modified
