"""The scheduler's store lookup counts a block only once every rank's shard of it (and, for per-layer dumps, every
layer's slice) is stored.

Under tensor parallelism each rank dumps its shard under its own key in its own task, so rank 0's task can
finish while another rank's still runs. A lookup of rank 0's keys alone then offers a hit that rank's load
misses: a request failed under vLLM's default policy "fail", and under two KV-cache groups vLLM 0.32's
RuntimeError (the property search of tests/reference/test_reference_statemachine_sliding_window.py found it
that way). Per-layer dumps are one task per layer, so the same holds between layers. The model's lookup sees a
prompt only once no dump of it runs (spec/DeferDump.tla, `Visible`).
"""
from __future__ import annotations

import pytest
import torch

from deferdump.reference import ConnectorConfig, DirectConnector, ManualStore, Role
from deferdump.reference.connectors import LayerWiseConnector
from deferdump.reference.hashing import layer_key, prefix_block_hashes, rank_key
from deferdump.reference.testing.late_copy import LateCopyDevice
from deferdump.tools.engine.moves import ScriptedMoves
from deferdump.tools.engine.steploop import StepLoop
from support.reference import request
from support.statemachine import TOKEN_VOCAB, Deployment, prompt_of, engine_violations as _violations

BLOCK = 2


def _stored(store: ManualStore, keys: list[bytes]) -> None:
    for key in keys:
        store._blocks[key] = torch.zeros(1, dtype=torch.uint8)


def _hit_blocks(config: ConnectorConfig, world_size: int, stored: list[bytes], cls: type = DirectConnector,
                num_layers: int | None = None) -> int:
    store = ManualStore()
    _stored(store, stored)
    sched = cls(config, Role.SCHEDULER, store=store, world_size=world_size, num_layers=num_layers)
    external, _ = sched.get_num_new_matched_tokens(request("r", 9), 0)  # 4 full blocks and one token
    return external // BLOCK


def _hashes() -> list[bytes]:
    return prefix_block_hashes(request("r", 9).token_ids, BLOCK, 1)


def test_a_block_is_a_hit_only_where_every_rank_stored_its_shard() -> None:
    hashes = _hashes()
    rank0, rank1 = [rank_key(h, 0) for h in hashes], [rank_key(h, 1) for h in hashes]
    config = ConnectorConfig(block_size=BLOCK)
    assert _hit_blocks(config, 2, rank0[:3] + rank1[:2]) == 2
    assert _hit_blocks(config, 2, rank0[:3] + rank1[1:3]) == 0, "rank 1's first shard is missing"
    assert _hit_blocks(config, 2, rank0 + rank1) == 4
    assert _hit_blocks(config, 1, rank0[:3]) == 3, "one rank: its own keys are the whole block"


def test_mla_ranks_share_rank_0s_keys() -> None:
    rank0 = [rank_key(h, 0) for h in _hashes()]
    assert _hit_blocks(ConnectorConfig(block_size=BLOCK, is_mla=True), 2, rank0[:3]) == 3


def test_per_layer_lookups_ask_every_ranks_key_of_every_layer() -> None:
    hashes = _hashes()
    keys = {(rank, layer): [layer_key(rank_key(h, rank), layer) for h in hashes] for rank in (0, 1) for layer in (0, 1)}
    config = ConnectorConfig(variant="layerwise", block_size=BLOCK)
    layer0 = keys[0, 0] + keys[1, 0]
    assert _hit_blocks(config, 2, layer0 + keys[0, 1] + keys[1, 1][:3], LayerWiseConnector, num_layers=2) == 3
    assert _hit_blocks(config, 2, layer0 + keys[0, 1][:1] + keys[1, 1], LayerWiseConnector, num_layers=2) == 1
    assert _hit_blocks(config, 2, layer0, LayerWiseConnector, num_layers=2) == 0, "layer 1's dumps still run"
    assert _hit_blocks(config, 2, [k for v in keys.values() for k in v], LayerWiseConnector, num_layers=2) == 4
    # the layer count unknown (a caller that does not give it): layer 0's keys stand for the block
    assert _hit_blocks(config, 2, keys[0, 0] + keys[1, 0][:1], LayerWiseConnector) == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_a_bad_layer_count_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="num_layers"):
        DirectConnector(ConnectorConfig(block_size=BLOCK), Role.SCHEDULER, store=ManualStore(), num_layers=bad)  # type: ignore[arg-type]


def _hit_tokens(engine: StepLoop) -> float:
    assert engine.scheduler_connector is not None
    return engine.scheduler_connector.inner.metrics.value("deferdump_external_hit_tokens_total")


def test_a_prompt_whose_dump_runs_on_another_rank_is_no_hit_under_two_groups() -> None:
    """The case the property search found (two ranks, a hybrid model): rank 0's dump of a prompt finishes,
    rank 1's still runs, and the same prompt comes in. Before the fix the lookup saw rank 0's key, rank 1's
    load missed, and vLLM 0.32 would have raised (`HybridLoadErrors`)."""
    store = ManualStore(auto_complete_on_wait=True)
    config = Deployment(sliding_window=2, world_size=2, num_blocks=14).loop_config()
    engine = StepLoop(config, store, device_factory=lambda rank: LateCopyDevice(), moves=ScriptedMoves(TOKEN_VOCAB))
    engine.scheduler.add_request(prompt_of(2, 2), 2)
    engine.step()
    dumps = [task for task in store.pending_tasks() if task.kind == "dump"]
    assert len(dumps) == 2, "one dump task per rank"
    # each task holds the block's full-attention row, then its sliding-window group's; rank 1 re-keys
    (rank0_task,) = [t for t in dumps if any(u.block_hashes[0] == rank_key(t.block_hashes[0], 1) for u in dumps)]
    store.complete(rank0_task)
    engine.scheduler.add_request(prompt_of(2, 2), 1)
    engine.step()
    assert _violations(engine) == []
    assert _hit_tokens(engine) == 0, "rank 1's shard is not stored yet"
    for task in store.pending_tasks():
        store.complete(task)
    engine.drain_and_shutdown()
    assert _violations(engine) == []


def test_once_every_rank_stored_it_the_prompt_is_a_hit() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    config = Deployment(sliding_window=2, world_size=2, num_blocks=14).loop_config()
    engine = StepLoop(config, store, device_factory=lambda rank: LateCopyDevice(), moves=ScriptedMoves(TOKEN_VOCAB))
    engine.scheduler.add_request(prompt_of(2, 4), 1)
    engine.step()
    for task in store.pending_tasks():
        store.complete(task)
    engine.step()
    engine.scheduler.add_request(prompt_of(2, 4), 1)
    engine.step()
    assert _hit_tokens(engine) == 3, "4 tokens stored, the last one computed"
    assert _violations(engine) == []
    engine.drain_and_shutdown()
    assert _violations(engine) == []


def test_a_prompt_whose_later_layer_still_dumps_is_no_hit() -> None:
    """One rank, per-layer dumps of two layers: layer 0's task finished, layer 1's still runs. Before the layer keys
    were looked up, the lookup offered the prompt and layer 1's load missed: a failed request under policy "fail"."""
    store = ManualStore(auto_complete_on_wait=True)
    config = Deployment(variant="layerwise", world_size=1, num_blocks=14).loop_config()
    engine = StepLoop(config, store, device_factory=lambda rank: LateCopyDevice(), moves=ScriptedMoves(TOKEN_VOCAB))
    engine.scheduler.add_request(prompt_of(2, 4), 2)
    engine.step()
    dumps = [task for task in store.pending_tasks() if task.kind == "dump"]
    assert len(dumps) == 2, "one dump task per layer"
    hashes = prefix_block_hashes(prompt_of(2, 4), 2, 1)
    (layer0_task,) = [t for t in dumps if t.block_hashes == tuple(layer_key(h, 0) for h in hashes)]
    store.complete(layer0_task)
    engine.scheduler.add_request(prompt_of(2, 4), 1)
    engine.step()
    assert _hit_tokens(engine) == 0, "layer 1 of the prompt is not stored yet"
    assert _violations(engine) == []
    for task in store.pending_tasks():
        store.complete(task)
    engine.drain_and_shutdown()
    assert _violations(engine) == []


def test_the_vllm_adapter_counts_the_layers_of_every_group() -> None:
    from types import SimpleNamespace

    from deferdump.reference.vllm import kv_layer_count

    groups = [SimpleNamespace(layer_names=["model.layers.0.attn", "model.layers.1.attn"]),
              SimpleNamespace(layer_names=["model.layers.2.attn"])]
    assert kv_layer_count(SimpleNamespace(kv_cache_groups=groups)) == 3
    assert kv_layer_count(SimpleNamespace(kv_cache_groups=[])) is None
    assert kv_layer_count(SimpleNamespace()) is None
