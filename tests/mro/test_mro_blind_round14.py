"""The rule the fourteenth blind round called for (two helpers wrote 12 files, 44 classes, with answer keys:
tests/fixtures/mro/corpus/blind_{itertools_plumbing,dataclass_records,except_star,descriptor_state,recursive_walk,
thread_local_context}.py and blind_{nixl_send_side,lmcache_adapter_style,lmcache_mp_style,offloading_worker_style,
ucm_pr989_style,decode_side_prefetch}.py, judged with TLC by the corpus test). One wrong verdict by reading:

* ``GroupTreeConnector`` **safe**, its key unsafe. Its ``save_kv_layer`` submits every dump inside a lambda it hands
  to a helper (``self._file(rid, groups, layer, lambda ids, key=key: self._store.dump(ids, key))``), and the reader
  did not look inside lambdas: it saw no dump at all, so nothing could be unsafe. (Its drain then walks the task
  tree with a depth guard that stops one level short of the tasks.) Now a store dump or wait inside a lambda or a
  nested function makes the method that holds it opaque: ``unknown``, naming the line.

And one wrong verdict in a case:

* ``UCMStyleLayerWiseConnector`` **unsafe** on the hybrid model, its key safe. A mixin's ``handle_preemptions`` drains
  every pending dump through the helper PR #989's poll also uses, ``_flush(None)``, whose wait sits under
  ``if (...) and (not only_ended or self._store.check(t))``: the reader took any ``check`` in the test for a poll of
  ended tasks, so the drain's waits counted for nothing and the super call's preemption wait was all it saw. Now a
  wait counts as polled only where its branch requires the poll (a ``check`` in an ``and``, not one an ``or`` can
  bypass, nor one whose ``else`` holds the wait).
"""
from __future__ import annotations

from pathlib import Path

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds
from support.mro import judge_cases

_CALLABLES = '''
import threading

from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata


class SaveMeta(KVConnectorMetadata):
    def __init__(self, stores):
        self.stores = stores


class SyncSave(KVConnectorBase_V1):
    """Each step's dumps submitted and waited in wait_for_save: synchronous (a lambda only sorts)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._store = BlockStore()
        self._tasks = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def build_connector_meta(self, scheduler_output):
        return SaveMeta([(new.req_id, list(new.block_ids[0])) for new in scheduler_output.scheduled_new_reqs])

    def request_finished(self, request, block_ids):
        return False, None

    def wait_for_save(self):
        stores = sorted(self._get_connector_metadata().stores, key=lambda entry: entry[0])
        for rid, blocks in stores:
            task = self._store.dump(blocks, rid)
            self._store.wait(task)


class LambdaSubmit(SyncSave):
    """Each layer's dump runs in a helper through a lambda, and nothing waits it."""

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        for rid, blocks in self._get_connector_metadata().stores:
            self._file(rid, layer_name, lambda ids, key=f"{rid}/{layer_name}": self._store.dump(ids, key), blocks)

    def _file(self, rid, layer, task_of, blocks):
        self._tasks.setdefault(rid, {}).setdefault(layer, []).append(task_of(blocks))

    def wait_for_save(self):
        return


class NestedWait(SyncSave):
    """Submitted in wait_for_save; a nested function, run later by a timer thread, waits it."""

    def wait_for_save(self):
        for rid, blocks in self._get_connector_metadata().stores:
            task = self._store.dump(blocks, rid)

            def settle(task=task):
                self._store.wait(task)

            threading.Timer(0.01, settle).start()


class NestedFirst(SyncSave):
    """A nested function defined at the top of the body submits; the body calls it."""

    def wait_for_save(self):
        def submit(rid, blocks):
            return self._store.dump(blocks, rid)

        for rid, blocks in self._get_connector_metadata().stores:
            self._tasks[rid] = submit(rid, blocks)
'''


def _judge(tmp_path: Path) -> Judge:
    path = tmp_path / "connectors.py"
    path.write_text(_CALLABLES, encoding="utf-8")
    return Judge(build_hierarchy(read_files([path], None), sources=[path]), ModelRunner(ModelBounds(), 120))


def test_a_store_call_inside_a_lambda_or_nested_function_makes_its_method_unknown(tmp_path: Path) -> None:
    judge = _judge(tmp_path)
    assert judge.reader.label("SyncSave", "SyncSave", "wait_for_save").label != "unknown"  # a sorting lambda is fine
    expected = {("LambdaSubmit", "save_kv_layer"): "store dump() inside a lambda",
                ("NestedWait", "wait_for_save"): "store wait() inside nested function settle()",
                ("NestedFirst", "wait_for_save"): "store dump() inside nested function submit()"}
    for (cls, method), reason in expected.items():
        label = judge.reader.label(cls, cls, method)
        assert label.label == "unknown", (cls, label)
        assert any(reason in r and "the reader does not follow callables" in r for r in label.reasons), label.reasons


def test_a_dump_hidden_in_a_lambda_is_no_longer_judged_safe(tmp_path: Path) -> None:
    path = tmp_path / "connectors.py"
    path.write_text(_CALLABLES, encoding="utf-8")
    report = judge_cases([path], {"SyncSave": ["single"], "LambdaSubmit": ["single"]})
    assert report.connectors["SyncSave"].verdict == "safe"
    assert report.connectors["LambdaSubmit"].verdict == "unknown"


_POLLS = '''
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


class Direct(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._store = BlockStore()
        self._pending = []

    def _flush(self, request_ids, only_ended=False):
        keep = []
        for task, rids in self._pending:
            if (request_ids is None or rids & request_ids) and (not only_ended or self._store.check(task)):
                self._store.wait(task)
            else:
                keep.append((task, rids))
        self._pending = keep

    def handle_preemptions(self, metadata):
        if preempted := metadata.preempted_req_ids:
            self._flush(preempted)


class Drained(Direct):
    def handle_preemptions(self, metadata):
        self._flush(None)
        super().handle_preemptions(metadata)


class Polled(Direct):
    def _flush(self, request_ids, only_ended=False):
        for task, rids in list(self._pending):
            if self._store.check(task) and (request_ids is None or rids & request_ids):
                self._store.wait(task)
                self._pending.remove((task, rids))

    def handle_preemptions(self, metadata):
        self._flush(None)
        super().handle_preemptions(metadata)
'''


def test_a_wait_counts_as_polled_only_where_its_branch_requires_the_poll(tmp_path: Path) -> None:
    path = tmp_path / "polls.py"
    path.write_text(_POLLS, encoding="utf-8")
    judge = Judge(build_hierarchy(read_files([path], None), sources=[path]), ModelRunner(ModelBounds(), 120))
    assert judge.reader.label("Direct", "Direct", "handle_preemptions").label == "wait_preempted"
    assert judge.reader.label("Polled", "Polled", "handle_preemptions").label == "wait_preempted"  # ended ones only
    drained = judge.reader.label("Drained", "Drained", "handle_preemptions")  # every pending task: a flush
    assert drained.label == "unknown", drained
    assert "waits store tasks not selected by the preempted requests" in drained.reasons[0]
