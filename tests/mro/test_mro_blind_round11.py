"""The rule the eleventh blind round called for (two helpers wrote 11 files, 30 classes, with answer keys:
tests/fixtures/mro/corpus/blind_{semaphore,container,packed_meta,walrus_drain,frozen_state,save_mode}.py and
blind_{request_threads,lru_plan,lambda_fsm,slot_table,oldest_k}.py, judged with TLC by the corpus test). One wrong
case verdict by reading: ``FrozenRecordStatsConnector`` **safe** as a MultiConnector child, where its key says
unsafe. Its ``wait_for_save`` dumps a sliding-window group inline (submitted and waited in one expression) and the
full-attention group deferred, handing that task to a helper (``self._record(rid, store.dump(...))``) that, in this
subclass, drops it (the ``dataclasses.replace`` result is discarded). One of two dumps waited in the call and the
other kept nowhere visible read as a blocking save: every task waited before the call returns. Now a
``wait_for_save`` that waits some of its dumps in the call but not all, keeping none in ``self`` and draining
nothing it holds (a drain through a helper over kept tasks stays blocking: test_mro_blind_round8), is
``unknown``. Reader tests without TLC."""
from __future__ import annotations

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES

CORPUS = FIXTURES / "mro" / "corpus"


def test_a_save_waiting_one_of_its_dumps_and_handing_the_other_to_a_helper_is_not_blocking() -> None:
    path = CORPUS / "blind_frozen_state.py"
    judge = Judge(build_hierarchy(read_files([path], None), sources=[path]), ModelRunner(ModelBounds(), 60))
    for cls in ("FrozenRecordConnector", "FrozenRecordStatsConnector", "FrozenRecordDeferredConnector"):
        label = judge.reader.label(cls, "FrozenRecordConnector", "wait_for_save")
        assert label.label == "unknown", (cls, label)
        assert "waits 1 of the 2 dumps it submits" in label.reasons[0]
        # the multi case no longer reads the save as synchronous
        labels = {f"{l.owner}.{l.method}": l.label for l in judge._labels(cls, None, [], "single")}  # noqa: SLF001
        assert labels["FrozenRecordConnector.wait_for_save"] == "unknown"


def test_a_save_that_waits_every_dump_it_submits_is_still_blocking(tmp_path) -> None:  # type: ignore[no-untyped-def]
    source = '''
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


class InlineSaver(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._store = BlockStore()
        self._sent = set()

    def build_connector_meta(self, scheduler_output):
        return None

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        for rid, ids in meta.saves.items():
            if self._store.wait(self._store.dump(ids, rid)) != 0:
                continue
            self._sent.add(rid)

    def request_finished(self, request, block_ids):
        return request.request_id in self._sent, None
'''
    path = tmp_path / "inline_saver.py"
    path.write_text(source, encoding="utf-8")
    judge = Judge(build_hierarchy(read_files([path], None), sources=[path]), ModelRunner(ModelBounds(), 60))
    assert judge.reader.label("InlineSaver", "InlineSaver", "wait_for_save").label == "blocking"
