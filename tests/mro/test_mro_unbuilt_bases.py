"""A shared base that leaves vLLM's abstract ``wait_for_save`` (or ``build_connector_meta``) undefined cannot be built
(base.py declares them ``@abstractmethod``; ``KVConnectorBase_V1`` derives from ``ABC``): vLLM's factory gets a
TypeError. The thirty-first blind round's ``_LayerwiseBase`` submits a dump per layer in ``save_kv_layer`` and
leaves the settling to its subclasses; judged as if vLLM's empty stub ran, it was **unsafe** with a counterexample no
built class makes. Now such a counterexample is ``unknown``, naming the missing method; the subclass that defines
the method is judged as before, and a base missing only a load method (the corpus's sketches) keeps its verdict."""
from __future__ import annotations

from pathlib import Path

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds

SOURCE = '''
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata


class _Meta(KVConnectorMetadata):
    def __init__(self, saves):
        self.saves = saves


class _LayerBase(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._store = BlockStore("local://kv")
        self._tasks = []

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return _Meta([(r.req_id, r.block_ids) for r in scheduler_output.scheduled_new_reqs])

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        meta = self._get_connector_metadata()
        for req_id, block_ids in meta.saves:
            self._tasks.append(self._store.dump(block_ids, [req_id]))
WAIT


class LayerSettled(_LayerBase):
    def wait_for_save(self):
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            self._store.wait(task)
'''


def _judge(tmp_path: Path, wait: str = "") -> Judge:
    path = tmp_path / "layer_bases.py"
    path.write_text(SOURCE.replace("WAIT\n", wait), encoding="utf-8")
    return Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 120))


def test_a_base_without_wait_for_save_is_not_unsafe(tmp_path: Path) -> None:
    judgement = _judge(tmp_path).judge("_LayerBase", cases=["single"]).judgements[0]
    assert judgement.verdict == "unknown", (judgement.verdict, judgement.reasons)
    assert any("does not define wait_for_save" in r and "TypeError" in r for r in judgement.reasons), judgement.reasons


def test_the_same_base_with_an_empty_wait_for_save_is_unsafe(tmp_path: Path) -> None:
    """The opposite: ``def wait_for_save(self): pass`` builds, and its per-layer dumps are never waited."""
    wait = "\n    def wait_for_save(self):\n        pass\n"
    judgement = _judge(tmp_path, wait).judge("_LayerBase", cases=["single"]).judgements[0]
    assert judgement.verdict == "unsafe", (judgement.verdict, judgement.reasons)


def test_the_subclass_that_settles_its_layers_is_judged(tmp_path: Path) -> None:
    judgement = _judge(tmp_path).judge("LayerSettled", cases=["single"]).judgements[0]
    assert judgement.verdict == "safe", (judgement.verdict, judgement.reasons)


def test_only_the_protocols_methods_count() -> None:
    """The hand-written corpus's sketches leave vLLM's load methods to the base (``HybridDeferredConnector``): its
    recorded counterexample stands."""
    path = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "hybrid_unfenced.py"
    judge = Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 120))
    assert judge.hierarchy.base_abstract_left("HybridDeferredConnector", ("start_load_kv",)) \
        == ("KVConnectorBase_V1.start_load_kv",)
    assert judge.judge("HybridDeferredConnector", cases=["hybrid"]).judgements[0].verdict == "unsafe"
