"""A save whose dumps go through a value the reader does not resolve (a transition table's lambda, a callback it
was handed, ``operator.methodcaller(...)(store)``) shows no submit. Read as a save that tracks and submits nothing,
its class was judged with no dumps at all, so nothing could be overwritten: ``TableDispatchConnector`` below tracks
each request and submits through ``self.ops["dump"]``, reports before any wait, and was judged **safe** in every
case. A probe found it (the thirty-first blind round's record-table reading, taken back, exposed
``LambdaFsmRestartConnector``); ``blind_oldest_k.py``'s classes dump through ``methodcaller`` the same way (their
recorded verdicts were already ``unknown``). Now such a ``wait_for_save``/``save_kv_layer`` is ``unknown``; the
opposite, the same submit written out, is read as before."""
from __future__ import annotations

from pathlib import Path

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import HIDDEN_SUBMIT, read_files
from deferdump.tools.mro.tla import ModelBounds

SOURCE = '''from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata


class Meta(KVConnectorMetadata):
    def __init__(self):
        self.spans = {}
        self.preempted = []


class TableDispatchConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._async_dump_req_ids = set()
        self._tasks = {}
        self.store = BlockStore("x")
        self.ops = {"dump": lambda r, span: self._tasks.setdefault(r, []).append(self.store.dump(span, r))}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        meta = Meta()
        for nr in scheduler_output.scheduled_new_reqs:
            meta.spans[nr.req_id] = nr.block_ids
            self._async_dump_req_ids.add(nr.req_id)
        meta.preempted = list(scheduler_output.preempted_req_ids or ())
        return meta

    def request_finished(self, request, block_ids):
        return request.request_id in self._async_dump_req_ids, None

    def handle_preemptions(self, kv_connector_metadata):
        for r in kv_connector_metadata.preempted:
            for t in self._tasks.pop(r, []):
                self.store.wait(t)

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        for r, span in meta.spans.items():
            self._async_dump_req_ids.add(r)
            step = self.ops.get("dump")
            step(r, span)

    def get_finished(self, finished_req_ids):
        done = set()
        for r in finished_req_ids:
            if r in self._async_dump_req_ids:
                self._async_dump_req_ids.discard(r)
                done.add(r)
        return done or None, None
'''

DISPATCH = """            step = self.ops.get("dump")
            step(r, span)"""


def _judge(tmp_path: Path, text: str = SOURCE) -> Judge:
    path = tmp_path / "table_dispatch.py"
    path.write_text(text, encoding="utf-8")
    return Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 120))


def test_a_save_through_a_table_of_lambdas_is_unknown(tmp_path: Path) -> None:
    judge = _judge(tmp_path)
    label = judge.reader.label("TableDispatchConnector", "TableDispatchConnector", "wait_for_save")
    assert label.label == "unknown" and "step(...)" in label.reasons[0] and HIDDEN_SUBMIT in label.reasons[0], label
    verdict = judge.judge("TableDispatchConnector", cases=["single"]).judgements[0].verdict
    assert verdict == "unknown", verdict


def test_an_item_called_in_place_is_a_value_too(tmp_path: Path) -> None:
    text = SOURCE.replace(DISPATCH, '            self.ops["dump"](r, span)')
    label = _judge(tmp_path, text).reader.label("TableDispatchConnector", "TableDispatchConnector", "wait_for_save")
    assert label.label == "unknown" and 'self.ops[\'dump\'](...)' in label.reasons[0], label


def test_the_submit_written_out_is_read_as_before(tmp_path: Path) -> None:
    """The opposite: the same dump called on the store is a visible submit, and the report before any wait is the
    counterexample."""
    text = SOURCE.replace(DISPATCH, "            self._tasks.setdefault(r, []).append(self.store.dump(span, r))")
    judge = _judge(tmp_path, text)
    label = judge.reader.label("TableDispatchConnector", "TableDispatchConnector", "wait_for_save")
    assert label.label == "poll_track_submit", label
    assert judge.judge("TableDispatchConnector", cases=["single"]).judgements[0].verdict == "unsafe"


def test_a_value_called_where_nothing_is_tracked_or_saved_elsewhere_changes_nothing(tmp_path: Path) -> None:
    """A value called in ``build_connector_meta`` (a sort key's lambda, a callback) is not a save."""
    text = SOURCE.replace("        meta.preempted = list(scheduler_output.preempted_req_ids or ())",
                          "        meta.preempted = sorted(scheduler_output.preempted_req_ids or (), key=lambda r: r)\n"
                          "        pick = self.ops.get\n        pick(\"dump\")")
    label = _judge(tmp_path, text).reader.label("TableDispatchConnector", "TableDispatchConnector",
                                                "build_connector_meta")
    assert label.label == "track", label
