"""Small connectors the mro rule tests build their cases from: one class whose every other definition the reader
reads, so that a rule's case and its opposite differ in one place (tests/mro/test_mro_value_calls.py,
test_mro_dropped_handoffs.py)."""
from __future__ import annotations

#: A connector tracking each scheduled request, waiting the preempted requests' tasks before the forward and
#: reporting finished tracked requests; its ``wait_for_save`` dumps through ``self.ops["dump"]``, a lambda.
TABLE_DISPATCH = '''from blockstore_client import BlockStore
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

#: The place in :data:`TABLE_DISPATCH` where the save dumps (through the table).
DISPATCH = """            step = self.ops.get("dump")
            step(r, span)"""
