"""Calls on objects whose class the reader does not read are matched against the analysed helper classes.

The nineteenth round's rule reads ``self.<attr>.<m>()`` and a local built by name (``batch = DumpBatch(store)``) by
what ``m`` does. A call on any other receiver was still read by its name alone: an element taken from a container
(``self._tables[req_id].set(...)``), a loop variable over one, a parameter a helper was handed, a method's result.
PR #989's protocol saving through ``SlotTable.set`` on such a receiver read as "no dump at all" and was judged
**safe** with one group (truth unsafe: ``get_finished`` reports requests whose dumps nobody waited), and a fence
through ``self._tables[req_id].drain()`` read as no wait. Now every helper class of the analysed files with a method
of that name is a candidate, and one that does other store work than the name says makes the call unread; a call
through such a receiver in a worker method outside the save path that may start a transfer makes the class unknown.
Receivers that are modules the file imports (``torch.cuda.synchronize()``) are left out."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from deferdump.tools.mro.behaviour import UNKNOWN, EffectReader
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.source import HIDDEN_SUBMIT, read_source
from support.mro import judge_cases
from test_mro_blind_round6 import HEADER, _labels
from test_mro_blind_round19 import SLOT_TABLE

#: SlotTable (``set`` submits, ``join`` polls) with a ``drain`` that waits, and a batch whose ``flush`` submits.
HELPERS = SLOT_TABLE + """
    def drain(self, req_id):
        for t in self._slots.pop(req_id, []):
            self._store.wait(t)
class DumpBatch:
    def __init__(self, store):
        self._store = store
    def flush(self, blocks):
        return self._store.dump(blocks)
"""

SAVE_HEAD = """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
"""

@pytest.mark.parametrize("hooks, receiver", [
    (SAVE_HEAD + "    for req_id in meta.saving:\n        self._tables[req_id].set(req_id, meta.blocks)\n",
     "self._tables[req_id].set()"),  # a container's element
    (SAVE_HEAD + "    for table in self._tables.values():\n        table.set(0, meta.blocks)\n",
     "table.set()"),  # a loop variable over a container
    ("def _push(self, table, blocks):\n    table.set(0, blocks)\n" + SAVE_HEAD + "    self._push(self._t, meta.blocks)\n",
     "table.set()"),  # a parameter a helper is handed
    ("def _table(self):\n    return self._t\n" + SAVE_HEAD + "    self._table().set(0, meta.blocks)\n",
     "self._table().set()"),  # a method's result
    (SAVE_HEAD + "    table = self._tables.pop(0)\n    table.set(0, meta.blocks)\n",
     "table.set()"),  # a local taken from a container
])
def test_a_submit_through_a_receiver_whose_class_is_not_read_is_not_read_as_no_store_work(
        hooks: str, receiver: str) -> None:
    label = _labels(hooks, prelude=HELPERS)["Proto.wait_for_save"]
    assert label.label == UNKNOWN, label
    assert f"calls {receiver}, whose class is not read and may be a SlotTable, and SlotTable.set does a store " \
           "submit" in label.reasons[0], label

def test_a_fence_through_a_container_element_is_not_read_as_no_wait() -> None:
    hooks = """
    def handle_preemptions(self, metadata):
        for req_id in metadata.preempted_req_ids:
            self._tables[req_id].drain(req_id)
    """
    label = _labels(hooks, prelude=HELPERS)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN and "SlotTable.drain does a store wait" in label.reasons[0], label

@pytest.mark.parametrize("hooks", [
    # container calls whose names no helper class defines otherwise: read by their names, as before
    SAVE_HEAD + "    task = self.store.dump(meta.blocks)\n    for req_id in meta.saving:\n"
                "        self._by_req.setdefault(req_id, []).append(task)\n",
    # a helper method reached on an element that does just what its name says (SlotTable.get reads)
    SAVE_HEAD + "    task = self.store.dump(meta.blocks)\n    for req_id in meta.saving:\n"
                "        self._tables[req_id].get(req_id)\n        self._by_req.setdefault(req_id, []).append(task)\n",
])
def test_calls_on_elements_that_do_what_their_names_say_keep_the_protocol_labels(hooks: str) -> None:
    labels = _labels(hooks, prelude=HELPERS)
    assert labels["Proto.wait_for_save"].label == "poll_track_submit", labels["Proto.wait_for_save"]
    assert labels["Proto.get_finished"].label == "wait_finished"

def test_a_call_on_an_imported_module_is_not_matched_against_the_helpers() -> None:
    """``os.path.join`` is os's; a helper ``join`` that polls (SlotTable.join) has nothing to do with it. A factory's
    result stays a candidate, even from an import (``make_table().join()``)."""
    head = "import os\nfrom tables import make_table\n"
    calls = "\n        os.path.join('a', 'b')\n        make_table().join(0)\n"
    source = HEADER + head + HELPERS + textwrap.dedent("""
    class Plain(KVConnectorBase_V1):
        def handle_preemptions(self, metadata):
            {calls}
    """).replace("{calls}", calls.strip())
    facts = read_source(source, "<t>")["Plain"].methods["handle_preemptions"]
    assert [c[:2] for c in facts.loose_calls] == [("make_table()", "join")], facts.loose_calls

def _reader(source: str) -> EffectReader:
    return EffectReader(build_hierarchy(read_source(HEADER + HELPERS + textwrap.dedent(source), "<t>")))

#: A synchronous saver: each dump waited in the call that submits it; nothing delayed.
SYNC_SAVER = """
class SyncSaver(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._batches = {}
    def wait_for_save(self):
        meta = self._get_connector_metadata()
        task = self.store.dump(meta.blocks)
        self.store.wait(task)
    def start_load_kv(self, forward_context, **kwargs):
        for batch in self._batches.values():
            batch.{call}
"""

@pytest.mark.parametrize("call, started", [
    ("flush([0])", "batch, which may be a DumpBatch, and DumpBatch.flush submits a store dump()"),
    ("get(0)", None),  # SlotTable.get reads: nothing starts
])
def test_a_transfer_started_outside_the_save_path_through_an_element_is_found(call: str, started: str | None) -> None:
    reader = _reader(SYNC_SAVER.replace("{call}", call))
    why = reader.transfer_started("SyncSaver", "SyncSaver", "start_load_kv")
    if started is None:
        assert why is None, why
    else:
        assert why is not None and started in why, why

@pytest.mark.slow
def test_a_synchronous_saver_flushing_an_element_in_start_load_kv_is_not_judged_safe(tmp_path: Path) -> None:
    """Through TLC: without the flush the class is safe with one group; with it, unknown (the model's transfers
    start only in the save methods)."""
    verdicts = {}
    for call in ("get(0)", "flush([0])"):
        path = tmp_path / f"saver_{call[:3]}.py"
        path.write_text(HEADER + HELPERS + textwrap.dedent(SYNC_SAVER.replace("{call}", call)))
        judgement = judge_cases([path], {"SyncSaver": ["single"]}).connectors["SyncSaver"]
        verdicts[call] = judgement.verdict
        if call.startswith("flush"):
            assert "may start a transfer that outlives the call" in " ".join(judgement.judgements[0].reasons)
    assert verdicts == {"get(0)": "safe", "flush([0])": "unknown"}, verdicts

def test_a_transfer_started_outside_the_save_path_through_a_local_built_by_name_is_found() -> None:
    """``batch = DumpBatch(store); batch.flush()`` in ``start_load_kv``: the local's class is read, and its flush
    submits (the save-path rule of the nineteenth round did not reach the methods outside it)."""
    source = SYNC_SAVER.replace("for batch in self._batches.values():\n            batch.{call}",
                                "batch = DumpBatch(self.store)\n        batch.flush([0])")
    why = _reader(source).transfer_started("SyncSaver", "SyncSaver", "start_load_kv")
    assert why is not None and "a local DumpBatch, and DumpBatch.flush submits a store dump()" in why, why

@pytest.mark.slow
@pytest.mark.parametrize("prelude, save", [
    ("", "self._tables[req_id].set(req_id, meta.blocks)"),  # a container element's submitting set
    # a module function: here it returns its tasks and they are kept where _settle waits (truth safe with one
    # group), but the reader follows no task through a call it reads by name, so the pass cannot say so: unknown
    ("def submit_all(store, blocks):\n    return [store.dump(b) for b in blocks]\n",
     "self._by_req.setdefault(req_id, []).extend(submit_all(self.store, meta.blocks))"),
])
def test_a_pass_with_a_submit_out_of_the_reader_s_sight_proves_nothing(tmp_path: Path, prelude: str, save: str) -> None:
    """The worst reading of an unknown save is the model's own deferred dump, whose tasks the waits the reader did
    recognise (``get_finished``'s ``_settle``) find. A class that submits through a call read by its name keeps its
    tasks wherever that call does (the slot table's own list): the single-group model passed and the class was
    judged **safe** while its ``get_finished`` reports requests whose dumps nobody waited."""

    from test_mro_blind_round6 import PROTOCOL
    hooks = SAVE_HEAD + f"    for req_id in meta.saving:\n        {save}\n"
    source = PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(hooks), "    "))
    path = tmp_path / "through_table.py"
    path.write_text(HEADER + HELPERS + prelude + textwrap.dedent(source))
    judgement = judge_cases([path], {"Proto": ["single"]}).connectors["Proto"].judgements[0]
    assert judgement.verdict == "unknown", judgement
    assert any(HIDDEN_SUBMIT in r for r in judgement.reasons), judgement.reasons
