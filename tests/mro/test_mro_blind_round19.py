"""The reading rule the nineteenth blind round called for (two helpers wrote 12 files with answer keys: names that
mislead a reader, second series, and failure and lifecycle paths; tests/fixtures/mro/corpus/blind_passive_name_calls.py
and its siblings are judged with TLC by the corpus test):

* a call into a helper object whose class the analysed files define is read by what that method does, not by its
  name. ``SlotTableConnector`` submitted its dumps through ``self._helper.set(...)`` (a ``SlotTable`` whose ``set``
  calls ``store.dump``) and fenced with ``join`` (one ``check`` poll): the reader took ``set`` for a container's
  and saw no dump at all, and the class was judged **safe** on the single-group model, truth unsafe. A wrapper
  ``wait`` that only polls was read as a wait the same way.
* where the object's class is not read from the code (a factory's or a registry's result, a parameter), every helper
  class of the files that defines a method of that name is a candidate, and one that does other than the name says
  makes the call unread."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from deferdump.tools.mro.behaviour import UNKNOWN
from deferdump.tools.mro.helpers import HelperObjects
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.source import read_source
from support.mro import judge_cases
from test_mro_blind_round6 import HEADER, PROTOCOL, _labels

#: A slot table that keeps each request's dump tasks: ``set`` submits, ``join`` polls once, ``drain`` waits.
SLOT_TABLE = """
class SlotTable:
    def __init__(self, store):
        self._store = store
        self._slots = {}
    def set(self, req_id, blocks):
        self._slots.setdefault(req_id, []).append(self._store.dump(blocks))
    def join(self, req_id):
        if all(self._store.check(t) for t in self._slots.get(req_id, [])):
            self._slots.pop(req_id, None)
            return True
        return False
    def get(self, req_id):
        return self._slots.get(req_id, [])
"""

#: Proto saving through the slot table: the PR's tracking, the table's calls in place of the store's.
THROUGH_TABLE = """
def register_kv_caches(self, kv_caches):
    self._helper = SlotTable(self.store)
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    for req_id in meta.saving:
        self._helper.set(req_id, meta.blocks)
def handle_preemptions(self, metadata):
    for req_id in metadata.preempted_req_ids:
        self._helper.join(req_id)
"""

#: A thin wrapper of the store whose calls do what their names say: read by their names, as before.
FAITHFUL_WRAPPER = """
class StoreIO:
    def __init__(self, store):
        self._store = store
    def dump(self, blocks):
        return self._store.dump(blocks)
    def wait(self, task):
        return self._store.wait(task)
"""


def test_a_helper_method_named_like_a_container_call_that_submits_is_not_read_as_no_store_work() -> None:
    labels = _labels(THROUGH_TABLE, prelude=SLOT_TABLE)
    save = labels["Proto.wait_for_save"]
    assert save.label == UNKNOWN, save
    assert "self._helper.set() on a SlotTable, and SlotTable.set does a store submit" in save.reasons[0], save
    fence = labels["Proto.handle_preemptions"]
    assert fence.label == UNKNOWN and "SlotTable.join does a store check" in fence.reasons[0], fence


@pytest.mark.parametrize("body, does", [
    ("return self._store.check(task)", "a store check"),  # NextStepSettleConnector's wait: one poll
    ("task = self._store.dump([0])\n        return self._store.wait(task)", "a store submit, a store wait"),
    ("return 0", "no store work"),
])
def test_a_wrapper_wait_that_does_not_wait_is_not_read_as_a_wait(body: str, does: str) -> None:
    wrapper = FAITHFUL_WRAPPER.replace("return self._store.wait(task)", body)
    hooks = """
    def register_kv_caches(self, kv_caches):
        self.io = StoreIO(self.store)
    def _settle(self, req_ids):
        for req_id in req_ids:
            for task in self._by_req.pop(req_id, []):
                self.io.wait(task)
    """
    label = _labels(hooks, prelude=wrapper)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN and f"StoreIO.wait does {does}" in label.reasons[0], label


@pytest.mark.parametrize("built", [
    "self.io = make_io(self.store)",  # a module-level factory
    "self.io = IO_CLASSES['default'](self.store)",  # a registry entry
    "io = StoreIO(self.store)\n    self.io = io",  # through a local
])
def test_a_helper_built_where_the_reader_cannot_name_its_class_is_matched_against_every_helper_class(built: str) -> None:
    """``blind_factory_helpers.py``: the object comes from a factory or a registry, so its class is not read; any
    helper class of the files whose method of that name does other than the name says makes the call unread."""
    wrapper = FAITHFUL_WRAPPER.replace("return self._store.wait(task)", "return self._store.check(task)") + """
def make_io(store):
    return StoreIO(store)
IO_CLASSES = {"default": StoreIO}
"""
    hooks = f"""
    def register_kv_caches(self, kv_caches):
        {built}
    def _settle(self, req_ids):
        for req_id in req_ids:
            for task in self._by_req.pop(req_id, []):
                self.io.wait(task)
    """
    label = _labels(hooks, prelude=wrapper)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN, label
    assert "on what may be a StoreIO (self.io is not built by name), and StoreIO.wait does a store check" \
        in label.reasons[0], label
    # the same factory returning the faithful wrapper reads as the store's wait
    faithful = _labels(hooks, prelude=wrapper.replace("return self._store.check(task)", "return self._store.wait(task)"))
    assert faithful["Proto.handle_preemptions"].label == "wait_preempted", faithful["Proto.handle_preemptions"]


def test_a_wrapper_whose_calls_do_what_their_names_say_reads_as_the_store() -> None:
    hooks = """
    def register_kv_caches(self, kv_caches):
        self.io = StoreIO(self.store)
    def wait_for_save(self):
        meta = self._get_connector_metadata()
        self._async_dump_req_ids.update(meta.saving)
        task = self.io.dump(meta.blocks)
        self._pending.append(task)
        for req_id in meta.saving:
            self._by_req.setdefault(req_id, []).append(task)
    def _settle(self, req_ids):
        for req_id in req_ids:
            for task in self._by_req.pop(req_id, []):
                self.io.wait(task)
    """
    labels = _labels(hooks, prelude=FAITHFUL_WRAPPER)
    assert labels["Proto.wait_for_save"].label == "poll_track_submit", labels["Proto.wait_for_save"]
    assert labels["Proto.handle_preemptions"].label == "wait_preempted", labels["Proto.handle_preemptions"]
    assert labels["Proto.get_finished"].label == "wait_finished", labels["Proto.get_finished"]


def _helpers(prelude: str, hooks: str) -> HelperObjects:
    source = PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(hooks), "    "))
    return HelperObjects(build_hierarchy(read_source(HEADER + prelude + textwrap.dedent(source), "<t>")))


def test_a_query_named_call_into_an_analysed_helper_is_followed_for_transfers() -> None:
    """Outside the save methods (start_load_kv, get_finished) a call into a helper object may start a transfer the
    model does not have: a query-like name (``set``, ``get``) no longer clears an analysed class's method unread."""
    helpers = _helpers(SLOT_TABLE, "def register_kv_caches(self, kv_caches):\n    self._helper = SlotTable(self.store)\n")
    assert helpers.unfollowed("Proto", "_helper", "set") == "self._helper holds a SlotTable, and SlotTable.set submits " \
                                                         "a store dump()"
    assert helpers.unfollowed("Proto", "_helper", "get") is None  # the same table's read: nothing starts
    assert helpers.unfollowed("Proto", "_helper", "join") is None  # a poll starts nothing either
    # code that was not analysed keeps the name's trust: a container, a lock, a logger
    assert helpers.unfollowed("Proto", "_by_req", "setdefault") is None


def test_the_table_saving_class_is_no_longer_judged_safe(tmp_path: Path) -> None:
    """With TLC: saving only through ``SlotTable.set`` left the model with no dump at all, so the single-group case
    passed; now it is not decided by reading."""
    source = HEADER + SLOT_TABLE + textwrap.dedent(PROTOCOL.format(
        hooks=textwrap.indent(textwrap.dedent(THROUGH_TABLE), "    ")))
    path = tmp_path / "slot_table.py"
    path.write_text(source)
    judgement = judge_cases([path], {"Proto": ["single"]}).connectors["Proto"]
    assert [j.verdict for j in judgement.judgements] == [UNKNOWN], judgement.judgements


#: A batch object the save makes for itself each step: ``add`` collects, ``flush`` submits every dump.
DUMP_BATCH = """
class DumpBatch:
    def __init__(self, store):
        self._store = store
        self._items = []
    def add(self, blocks):
        self._items.append(blocks)
    def flush(self):
        return [self._store.dump(blocks) for blocks in self._items]
"""

#: PR #989's save with its dumps submitted through a local batch: the PR's tracking, no fence.
THROUGH_LOCAL_BATCH = """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    batch = DumpBatch(self.store)
    batch.add(meta.blocks)
    for task in batch.flush():
        self._pending.append(task)
        for req_id in meta.saving:
            self._by_req.setdefault(req_id, []).append(task)
"""


def test_a_local_helper_the_method_makes_is_read_by_what_its_methods_do() -> None:
    label = _labels(THROUGH_LOCAL_BATCH, prelude=DUMP_BATCH)["Proto.wait_for_save"]
    assert label.label == UNKNOWN, label
    assert "calls .flush() on a local DumpBatch, and DumpBatch.flush does a store submit" in label.reasons[0], label
    # locals of classes that were not analysed (a lock, a list) keep their names' reading: the PR's own save
    assert _labels("")["Proto.wait_for_save"].label == "poll_track_submit"


@pytest.mark.parametrize("function, does", [
    ("def submit_all(store, blocks):\n    return [store.dump(b) for b in blocks]\n", "a store submit"),
    ("def submit_all(store, blocks):\n    return _each(store, blocks)\n"  # through another module function
     "def _each(store, blocks):\n    return [store.dump(b) for b in blocks]\n", "a store submit"),
])
def test_a_module_function_that_submits_is_not_read_as_no_store_work(function: str, does: str) -> None:
    hooks = THROUGH_LOCAL_BATCH.replace("    batch = DumpBatch(self.store)\n    batch.add(meta.blocks)\n", "") \
        .replace("batch.flush()", "submit_all(self.store, [meta.blocks])")
    label = _labels(hooks, prelude=function)["Proto.wait_for_save"]
    assert label.label == UNKNOWN, label
    assert f"calls submit_all(), a function of its module that does {does}" in label.reasons[0], label


def test_a_module_function_named_wait_that_only_polls_is_no_wait() -> None:
    """``blind_shadowed_builtins.py``'s ``CheckedHandoffConnector``: a module-level ``wait`` that only checks."""
    prelude = "def wait(store, task):\n    return store.check(task)\n"
    hooks = """
    def _settle(self, req_ids):
        for req_id in req_ids:
            for task in self._by_req.pop(req_id, []):
                wait(self.store, task)
    """
    label = _labels(hooks, prelude=prelude)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN and "calls wait(), a function of its module that does a store check" \
        in label.reasons[0], label
    faithful = _labels(hooks, prelude="def wait(store, task):\n    return store.wait(task)\n")
    assert faithful["Proto.handle_preemptions"].label == "wait_preempted"


def test_the_local_batch_class_is_no_longer_judged_safe_on_the_sliding_window_model(tmp_path: Path) -> None:
    """With TLC: PR #989's protocol without a fence is unsafe on a model whose every layer is sliding-window; saving
    through a local ``DumpBatch`` hid its dumps, and that case passed (a wrong safe). Now it is not decided by
    reading."""
    source = HEADER + DUMP_BATCH + textwrap.dedent(PROTOCOL.format(
        hooks=textwrap.indent(textwrap.dedent(THROUGH_LOCAL_BATCH), "    ")))
    path = tmp_path / "local_batch.py"
    path.write_text(source)
    judgement = judge_cases([path], {"Proto": ["hybrid"]}).connectors["Proto"]
    assert [j.verdict for j in judgement.judgements] == [UNKNOWN], judgement.judgements


def test_a_wrapper_reached_through_a_field_of_a_helper_is_read_by_what_it_does() -> None:
    """``self.engine.io.wait(task)``: the engine's ``io`` is a ``StoreIO`` whose ``wait`` only polls."""
    prelude = FAITHFUL_WRAPPER.replace("return self._store.wait(task)", "return self._store.check(task)") + """
class Engine:
    def __init__(self, store):
        self.io = StoreIO(store)
"""
    hooks = """
    def register_kv_caches(self, kv_caches):
        self.engine = Engine(self.store)
    def _settle(self, req_ids):
        for req_id in req_ids:
            for task in self._by_req.pop(req_id, []):
                self.engine.io.wait(task)
    """
    label = _labels(hooks, prelude=prelude)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN and "calls self.engine.io.wait() on a StoreIO, and StoreIO.wait does a store " \
        "check" in label.reasons[0], label
