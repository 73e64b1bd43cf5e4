"""The rules the sixteenth blind round called for (two helpers wrote 12 files, 43 classes, with answer keys:
tests/fixtures/mro/corpus/blind_{shared_mutables,tensor_handles,cached_views,generator_send,finalizers,flag_enums}.py
and blind_{layerwise_storer_generators,transfer_engine_batches,push_to_decode,two_phase_tiering,
worker_metadata_reports,prefix_dedup_refcounts}.py, judged with TLC by the corpus test). Three wrong verdicts by
reading:

* ``FlagStateConnector`` and ``LeaderFlagConnector`` **unsafe** on the hybrid model, their key safe: their
  ``__init__`` keeps the KV-cache groups whose spec is not ``SlidingWindowSpec`` and ``build_connector_meta`` dumps
  those only, while the hybrid model's dumps always read the sliding-window group, whose blocks vLLM frees while
  the request runs. Now a class that reads the groups' specs anywhere (``SlidingWindowSpec``, ``kv_cache_spec``,
  ...) has its save labels ``unknown`` on the hybrid model: a violation there may be none of the class's, a pass
  stands (fewer groups dumped only removes hazards).
* ``GuardedLayerConnector`` **safe**, its key unsafe with two layers and a failing wait: ``wait_for_save`` waits
  every per-layer task in a loop that raises on a failed wait inside ``with _Settling():``, whose ``__exit__``
  returns True, and then clears the list: the other layers' dumps run on unwaited. The reader took the loop for
  one that waits every task (a synchronous save of the step, so no layer-wise case was judged). Now a ``raise`` in
  a wait loop inside a ``with`` ends it early, as one inside a ``try`` with handlers did.
"""
from __future__ import annotations

from pathlib import Path

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES
from support.mro import judge_cases

_FULL_ONLY = '''

from vllm.v1.kv_cache_interface import SlidingWindowSpec


class FullGroupsDeferredConnector(HybridDeferredConnector):
    """The same protocol, dumping the full-attention groups only (chosen by spec in __init__)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._groups = [i for i, g in enumerate(kv_cache_config.kv_cache_groups)
                        if not isinstance(g.kv_cache_spec, SlidingWindowSpec)]

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        self._async_dump_req_ids.update(meta.saving)
        groups = [meta.block_ids_per_group[g] for g in self._groups]
        self._pending.append(Pending(self.store.dump_data(groups), set(meta.saving)))
'''

_LAYERS = '''
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


class DumpFailed(RuntimeError):
    pass


class Settling:
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return exc_type is not None and issubclass(exc_type, DumpFailed)


class RaisingLayers(KVConnectorBase_V1):
    """One task per layer, all waited in wait_for_save; a failed wait raises out of the step."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._store = BlockStore()
        self._layer_tasks = []

    def request_finished(self, request, block_ids):
        return False, None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        for rid, blocks in self._get_connector_metadata().stores:
            self._layer_tasks.append(self._store.dump(blocks, f"{rid}/{layer_name}"))

    def wait_for_save(self):
        for task in self._layer_tasks:
            if self._store.wait(task) != 0:
                raise DumpFailed("layer dump failed")
        self._layer_tasks.clear()


class SettledLayers(RaisingLayers):
    """The same loop inside a context manager that swallows the failure, then the list is cleared."""

    def wait_for_save(self):
        with Settling():
            for task in self._layer_tasks:
                if self._store.wait(task) != 0:
                    raise DumpFailed("layer dump failed")
        self._layer_tasks.clear()
'''


def test_a_class_choosing_its_groups_by_spec_is_unknown_not_unsafe_on_the_hybrid_model(tmp_path: Path) -> None:
    path = tmp_path / "hybrid.py"
    path.write_text((FIXTURES / "mro" / "corpus" / "hybrid_unfenced.py").read_text(encoding="utf-8") + _FULL_ONLY,
                    encoding="utf-8")
    report = judge_cases([path], {"HybridDeferredConnector": ["hybrid"], "FullGroupsDeferredConnector": ["hybrid"]})
    (every_group,) = report.connectors["HybridDeferredConnector"].judgements
    assert (every_group.verdict, every_group.violated) == ("unsafe", "NoOverwriteWhileDumpingInv")
    (full_only,) = report.connectors["FullGroupsDeferredConnector"].judgements
    assert full_only.verdict == "unknown", full_only
    assert any("FullGroupsDeferredConnector.__init__ reads `SlidingWindowSpec`" in r for r in full_only.reasons)


def test_a_raise_in_a_wait_loop_inside_a_with_ends_the_loop_early(tmp_path: Path) -> None:
    path = tmp_path / "layers.py"
    path.write_text(_LAYERS, encoding="utf-8")
    judge = Judge(build_hierarchy(read_files([path], None), sources=[path]), ModelRunner(ModelBounds(), 120))
    # no with: a failed wait raises out of wait_for_save (vLLM's step fails); the pair is the step's synchronous save
    assert judge.reader.label("RaisingLayers", "RaisingLayers", "save_kv_layer").label == "sync_save"
    settled = judge.reader.label("SettledLayers", "RaisingLayers", "save_kv_layer")
    assert settled.label == "unknown", settled
    assert "in a loop that can stop before the last one" in settled.reasons[0]
