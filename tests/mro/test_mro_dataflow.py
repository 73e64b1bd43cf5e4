"""What `deferdump mro` reads from a body by data flow, without TLC: synchronous saves (a submitted task
waited in the same call, or layer tasks waited one by one in wait_for_save), early exits from such loops,
tracking sets of other names and shapes, waits selected by what get_finished reports, and fences."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.behaviour import AMBIGUOUS_PREEMPT, EffectReader
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.source import discover_tracking_attrs, read_files, read_source

HEADER = "from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA\n"


def _label(source: str, cls: str, method: str):
    hierarchy = build_hierarchy(read_source(HEADER + textwrap.dedent(source), "<t>"))
    owner = hierarchy.lookup(cls, method)
    assert owner is not None
    return EffectReader(hierarchy).label(cls, owner, method)


def test_a_submit_waited_in_the_same_call_is_a_synchronous_save() -> None:
    for body in (
        "task = self.store.dump_data(blocks)\nself.store.wait(task)",
        "self.store.wait(self.store.dump(blocks))",
        "pending = []\ntask = self.store.dump_data(blocks)\npending.append(task)\nfor each in pending:\n    self.store.wait(each)",
        "tasks = []\nfor b in blocks:\n    tasks.append(self.store.dump_data(b))\nfor t in tasks:\n    self.store.wait(t)",
    ):
        source = (
            "class C(KVConnectorBase_V1):\n    def wait_for_save(self):\n"
            "        blocks = self._get_connector_metadata().blocks\n"
            + textwrap.indent(body, " " * 8) + "\n"
        )
        assert _label(source, "C", "wait_for_save").label == "sync_save", body


def test_a_submit_kept_on_self_is_not_synchronous_even_if_a_local_is_waited_later() -> None:
    source = """
    class C(KVConnectorBase_V1):
        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw):
            task = self.store.dump_data(layer_name)
            self._pending.append(task)
    """
    assert _label(source, "C", "save_kv_layer").label == "submit_layer"


LAYERS = """
class S(KVConnectorBase_V1):
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw):
        self._layer_tasks.append(self.store.dump_data(layer_name))
    def wait_for_save(self):
        for t in self._layer_tasks:
            self.store.wait(t)
        self._layer_tasks.clear()

class Breaks(S):
    def wait_for_save(self):
        for t in self._layer_tasks:
            try:
                self.store.wait(t)
            except RuntimeError:
                break
        self._layer_tasks.clear()
"""


def test_layer_tasks_waited_one_by_one_in_wait_for_save_are_a_synchronous_save() -> None:
    assert _label(LAYERS, "S", "save_kv_layer").label == "sync_save"
    assert _label(LAYERS, "S", "wait_for_save").label == "base"


def test_a_wait_loop_that_stops_at_the_first_failure_is_unknown_with_the_reason() -> None:
    label = _label(LAYERS, "Breaks", "save_kv_layer")
    assert label.label == "unknown"
    assert "can stop before the last one" in label.reasons[0] and "self._layer_tasks" in label.reasons[0]


TUPLE_KEYED = """
class T(KVConnectorBase_V1):
    def build_connector_meta(self, so):
        for r in so.new:
            self.requests_meta[r.id] = r
        for r, chunk in so.saving:
            self._chunks[(r, chunk)] = True
        return so
    def request_finished(self, request, block_ids):
        self.requests_meta.pop(request.request_id, None)
        if any(k[0] == request.request_id for k in self._chunks):
            return True, None
        return False, None
"""


def test_tracking_sets_are_found_by_data_flow_not_by_name(tmp_path) -> None:
    assert discover_tracking_attrs(read_source(HEADER + TUPLE_KEYED)) == {"_chunks"}  # requests_meta decides nothing
    path = tmp_path / "t.py"
    path.write_text(HEADER + TUPLE_KEYED, encoding="utf-8")
    assert read_files([path])["T"].methods["build_connector_meta"].tracking_ops == {"add"}
    assert read_files([path], "_other")["T"].methods["build_connector_meta"].tracking_ops == frozenset()  # override
    # where the PR's own name is used, nothing else is taken for a tracking set
    with_pr_name = TUPLE_KEYED.replace("        return so", "        self._async_dump_req_ids.add(1)\n        return so")
    assert discover_tracking_attrs(read_source(HEADER + with_pr_name)) == frozenset()


def test_get_finished_that_waits_other_tasks_than_it_reports_is_unknown() -> None:
    source = """
    class E(KVConnectorBase_V1):
        def build_connector_meta(self, so):
            self._async_dump_req_ids.update(so.saving)
        def get_finished(self, finished_req_ids):
            for reqs, handle in list(self._transfers):
                if reqs & self._to_settle:
                    self.backend.wait(handle)
            report = finished_req_ids & self._async_dump_req_ids
            self._to_settle = report
            return report or None, None
    """
    label = _label(source, "E", "get_finished")
    assert label.label == "unknown" and "none is selected by the requests it reports" in label.reasons[0]
    fixed = source.replace("if reqs & self._to_settle:", "if reqs & finished_req_ids:")
    assert _label(fixed, "E", "get_finished").label == "wait_finished"


FENCES = """
class Drain(KVConnectorBase_V1, SupportsHMA):
    def handle_preemptions(self, md):
        for p in self._pending:
            self.store.wait(p.task)
        self._pending = []

class Freed(KVConnectorBase_V1, SupportsHMA):
    def handle_preemptions(self, md):
        for p in list(self._pending):
            if p.reqs & md.preempted_req_ids or p.blocks & md.freed_block_ids:
                self.store.wait(p.task)

class ByBlocks(KVConnectorBase_V1, SupportsHMA):
    def handle_preemptions(self, md):
        for p in list(self._pending):
            if p.block_ids & md.gone:
                self.store.wait(p.task)

class Preempted(KVConnectorBase_V1, SupportsHMA):
    def handle_preemptions(self, md):
        for p in list(self._pending):
            if p.reqs & md.preempted_req_ids:
                self.store.wait(p.task)

class Partial(KVConnectorBase_V1, SupportsHMA):
    def wait_for_save(self):
        meta = self._get_connector_metadata()
        self._async_dump_req_ids.update(meta.saving)
        self._pending.append(self.store.dump_data(meta.full))
        window = self.store.dump_data(meta.window)
        self.store.wait(window)
"""


def test_fences_and_preemption_waits_are_told_apart() -> None:
    assert _label(FENCES, "Drain", "handle_preemptions").label == "wait_all_always"
    assert _label(FENCES, "Freed", "handle_preemptions").label == "wait_freed"
    assert _label(FENCES, "ByBlocks", "handle_preemptions").label == AMBIGUOUS_PREEMPT  # decided per case
    assert _label(FENCES, "Preempted", "handle_preemptions").label == "wait_preempted"
    partial = _label(FENCES, "Partial", "wait_for_save")
    assert partial.label == "poll_track_submit"  # one group: the kept task is a deferred dump
    assert partial.hybrid_reasons and "sliding-window" in partial.hybrid_reasons[0]  # hybrid: undecided


KEYED_WAITS = """
class PopByPreempted(KVConnectorBase_V1, SupportsHMA):
    def handle_preemptions(self, md):
        for req_id in md.preempted:
            for task in self._tasks.pop(req_id, []):
                self.store.wait(task)

class GetByPreempted(KVConnectorBase_V1, SupportsHMA):
    def handle_preemptions(self, md):
        for req_id in md.preempted:
            for task in self._tasks.get(req_id, ()):
                self.store.wait(task)

class DrainValues(KVConnectorBase_V1, SupportsHMA):
    def handle_preemptions(self, md):
        for task in list(self._tasks.values()):
            self.store.wait(task)
        self._tasks.clear()
"""


def test_a_wait_of_entries_chosen_by_key_is_not_a_drain() -> None:
    """`self.x.pop(r)` / `.get(r)` inside a loop over the preempted ids waits those requests' tasks only.
    Read as a drain (`wait_all_always`, a fence), it made an unfenced hybrid connector safe on hybrid models
    (tests/fixtures/mro/runnable/unfenced_hybrid.py)."""
    for cls in ("PopByPreempted", "GetByPreempted"):
        assert _label(KEYED_WAITS, cls, "handle_preemptions").label != "wait_all_always", cls
    assert _label(KEYED_WAITS, "DrainValues", "handle_preemptions").label == "wait_all_always"
