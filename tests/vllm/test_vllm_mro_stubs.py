"""The stub vLLM `deferdump mro --run` replays classes on (tools/mro/run/stubs.py) keeps real vLLM 0.32's
shape: the same abstract methods and defaults on `KVConnectorBase_V1`, and the scheduler-output fields it
fills are fields of the real dataclasses. Where the stub and vLLM disagree, vLLM is right and this fails."""
from __future__ import annotations

import dataclasses
import inspect

from vllm.distributed.kv_transfer.kv_connector.v1 import base as real_base
from vllm.v1 import request as real_request
from vllm.v1.core.sched import output as real_output

from deferdump.tools.mro.run import stubs


def test_the_base_class_has_vllms_abstract_methods_and_defaults() -> None:
    assert stubs.KVConnectorBase_V1.__abstractmethods__ == real_base.KVConnectorBase_V1.__abstractmethods__
    assert stubs.SupportsHMA.__abstractmethods__ == real_base.SupportsHMA.__abstractmethods__
    assert {r.name: r.value for r in stubs.KVConnectorRole} == {r.name: r.value for r in real_base.KVConnectorRole}
    for method in ("request_finished", "get_finished", "handle_preemptions", "bind_connector_metadata",
                   "clear_connector_metadata", "has_connector_metadata", "update_connector_output",
                   "get_block_ids_with_load_errors", "register_kv_caches", "shutdown", "get_kv_connector_stats",
                   "get_kv_connector_kv_cache_events", "take_events", "reset_cache"):
        real = inspect.signature(getattr(real_base.KVConnectorBase_V1, method))
        stub = inspect.signature(getattr(stubs.KVConnectorBase_V1, method))
        assert list(stub.parameters) == list(real.parameters), method


def test_the_request_states_are_vllms_in_its_order() -> None:
    """A connector may compare states (`status == FINISHED_ABORTED`, `is_finished`): names, values, order."""
    assert [(s.name, s.value) for s in stubs.RequestStatus] == [(s.name, s.value) for s in real_request.RequestStatus]
    for status in stubs.RequestStatus:
        assert stubs.RequestStatus.is_finished(status) == real_request.RequestStatus.is_finished(
            real_request.RequestStatus[status.name])


def test_the_request_stub_has_only_attributes_vllms_request_has() -> None:
    """The stub Request answers a connector only with names real vLLM's Request has (set in __init__ or defined
    on the class); any other name stops the run as not runnable."""
    source = inspect.getsource(real_request.Request)
    names = {f.name for f in dataclasses.fields(stubs.Request)} | {
        n for n, v in vars(stubs.Request).items() if isinstance(v, property) or (callable(v) and not n.startswith("_"))}
    for name in sorted(names):
        assert f"self.{name} =" in source or f"self.{name}: " in source or f"def {name}(" in source, name


def test_the_scheduler_output_fields_the_stub_fills_are_vllms() -> None:
    for name in ("NewRequestData", "CachedRequestData", "SchedulerOutput", "KVConnectorBlockState"):
        real = {f.name for f in dataclasses.fields(getattr(real_output, name))}
        stub = {f.name for f in dataclasses.fields(getattr(stubs, name))}
        assert stub <= real, (name, sorted(stub - real))
        required = {f.name for f in dataclasses.fields(getattr(real_output, name))
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        missing = required - stub
        # fields a connector never reads (multimodal, sampling, LoRA, encoder and structured-output state)
        assert missing <= {"mm_features", "sampling_params", "pooling_params", "lora_request",
                           "scheduled_spec_decode_tokens", "scheduled_encoder_inputs", "free_encoder_mm_hashes",
                           "num_output_tokens"}, (name, sorted(missing))


def test_the_config_and_layout_stubs_carry_only_what_vllm_has() -> None:
    """The replay hands classes a VllmConfig and a KVCacheConfig (both roles, as vLLM 0.32 does): every attribute
    the stubs give exists on vLLM's classes, and the spec classes keep vLLM's hierarchy (isinstance tests)."""
    from vllm import config as real_config
    from vllm.distributed import parallel_state
    from vllm.v1 import kv_cache_interface as real_kv

    pairs = {stubs.VllmConfig: real_config.VllmConfig, stubs.CacheConfig: real_config.CacheConfig,
             stubs.ParallelConfig: real_config.ParallelConfig, stubs.ModelConfig: real_config.ModelConfig,
             stubs.SchedulerConfig: real_config.SchedulerConfig, stubs.KVTransferConfig: real_config.KVTransferConfig}
    for stub, real in pairs.items():
        real_names = {f.name for f in dataclasses.fields(real)} | {name for name, _ in inspect.getmembers(real)}
        stub_names = {f.name for f in dataclasses.fields(stub)}
        assert stub_names <= real_names, (stub.__name__, sorted(stub_names - real_names))
    for name in ("KVCacheConfig", "KVCacheGroupSpec", "KVCacheSpec", "AttentionSpec", "FullAttentionSpec",
                 "SlidingWindowSpec"):
        real = {f.name for f in dataclasses.fields(getattr(real_kv, name))}
        stub = {f.name for f in dataclasses.fields(getattr(stubs, name))}
        assert stub <= real, (name, sorted(stub - real))
    for name in ("AttentionSpec", "FullAttentionSpec", "MLAAttentionSpec", "SlidingWindowSpec",
                 "ChunkedLocalAttentionSpec", "MambaSpec"):
        real_bases = [c.__name__ for c in getattr(real_kv, name).__mro__ if c.__module__ == real_kv.__name__]
        stub_bases = [c.__name__ for c in getattr(stubs, name).__mro__ if c.__module__ == stubs.__name__]
        assert stub_bases == real_bases, name
    for function in ("get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size"):
        assert callable(getattr(parallel_state, function))
    layout = stubs.kv_cache_config(["full", "sliding"], 2, num_blocks=64)
    assert [g.layer_names for g in layout.kv_cache_groups] == [["layer.0", "layer.1"], ["layer.2", "layer.3"]]
    assert isinstance(layout.kv_cache_groups[1].kv_cache_spec, stubs.SlidingWindowSpec)


def test_the_distributed_events_metrics_and_helpers_stubs_are_vllms() -> None:
    """What `--run` serves beyond the connector API, as real connectors import it: the KV event records (their
    fields in vLLM's order, so positional construction means the same), the events container's abstract methods,
    the metrics base class, the process groups' attributes, `cdiv`, a request's `sampling_params.extra_args` and the
    model's layer count."""
    from vllm.distributed import kv_events as real_events
    from vllm.distributed import parallel_state
    from vllm.distributed.kv_transfer.kv_connector.v1 import metrics as real_metrics
    from vllm.sampling_params import SamplingParams
    from vllm.utils import math_utils

    for name in ("BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch"):
        real = list(getattr(real_events, name).__struct_fields__)
        stub = [f.name for f in dataclasses.fields(getattr(stubs, name))]
        assert stub == real, name
    for name in ("MEDIUM_GPU", "MEDIUM_CPU", "MEDIUM_STORAGE"):
        assert getattr(stubs, name) == getattr(real_events, name)
    assert stubs.KVConnectorKVEvents.__abstractmethods__ == real_events.KVConnectorKVEvents.__abstractmethods__
    assert [f.name for f in dataclasses.fields(stubs.KVConnectorStats)] == [
        f.name for f in dataclasses.fields(real_metrics.KVConnectorStats)]
    for method in ("to_dict", "reset", "aggregate", "reduce", "is_empty"):
        assert list(inspect.signature(getattr(stubs.KVConnectorStats, method)).parameters) == list(
            inspect.signature(getattr(real_metrics.KVConnectorStats, method)).parameters), method
    members = {name for name, _ in inspect.getmembers(parallel_state.GroupCoordinator)}
    for name in ("rank", "ranks", "local_rank", "world_size", "rank_in_group"):
        assert f"self.{name} =" in inspect.getsource(parallel_state.GroupCoordinator), name
    for name in ("first_rank", "last_rank", "is_first_rank", "is_last_rank"):
        assert name in members, name
    for a, b in ((0, 16), (1, 16), (16, 16), (17, 16)):
        assert stubs.cdiv(a, b) == math_utils.cdiv(a, b)
        assert stubs.round_up(a, b) == math_utils.round_up(a, b)
        assert stubs.round_down(a, b) == math_utils.round_down(a, b)
    from vllm.model_executor.models.utils import extract_layer_index
    for name in ("layer.0", "layer.3", "model.layers.7.self_attn.attn", "encoder.layers.1.sub"):
        assert stubs.extract_layer_index(name) == extract_layer_index(name), name
    assert stubs.extract_layer_index("model.layers.2.attn.1", 2) == extract_layer_index("model.layers.2.attn.1", 2)
    assert {f.name for f in dataclasses.fields(stubs.SamplingParams)} <= set(SamplingParams.__struct_fields__)
    assert stubs.vllm_config(layers=3).model_config.get_total_num_hidden_layers() == 3
