"""The reading rules the twentieth blind round called for (two helpers wrote 12 files with answer keys: objects whose
class the reader cannot see at the call, and helpers passed between methods; tests/fixtures/mro/corpus/
blind_callable_iterable_tasks.py and its siblings are judged with TLC by the corpus test):

* a loop whose body waits or submits, over an object that may be a helper class with its own ``__iter__``, is not
  read as a loop over the entries it names. ``PolledIterConnector`` fenced with
  ``for rid, task in Retired(store, table, preempted): store.wait(task)``, whose ``Retired.__iter__`` yields only
  the tasks a ``check`` found done: the reader saw a wait of every preempted request's task and judged the class
  **safe** with one group (truth unsafe: a preempted request's running dump is never waited);
* a connector method assigned on the instance (``self.handle_preemptions = PreemptionFence(...)`` in ``__init__``)
  is what vLLM calls, not the class's definition. ``AttributeFenceConnector`` was judged **unsafe** through the
  base class's no-op ``handle_preemptions`` (truth safe: the callable waits the preempted requests' dumps)."""
from __future__ import annotations

import pytest

from deferdump.tools.mro.behaviour import UNKNOWN
from test_mro_blind_round6 import _labels

#: An iterator over a task table that yields only the tasks a poll found done, and one that waits each.
ITERATORS = """
class Retired:
    def __init__(self, store, table, req_ids):
        self._store = store
        self._table = table
        self._req_ids = list(req_ids)
    def __iter__(self):
        for rid in self._req_ids:
            for task in list(self._table.get(rid, [])):
                if self._store.check(task):
                    self._table[rid].remove(task)
                    yield rid, task
class PreemptionFence:
    def __init__(self, store, table):
        self._store = store
        self._table = table
    def __call__(self, metadata):
        for rid in metadata.preempted_req_ids:
            for task in self._table.pop(rid, []):
                self._store.wait(task)
"""


@pytest.mark.parametrize("loop", [
    "for rid, task in Retired(self.store, self._by_req, metadata.preempted_req_ids):\n        self.store.wait(task)",
    "retired = Retired(self.store, self._by_req, metadata.preempted_req_ids)\n    "
    "for rid, task in retired:\n        self.store.wait(task)",  # a local built by name
    "[self.store.wait(t) for _, t in Retired(self.store, self._by_req, metadata.preempted_req_ids)]",
])
def test_a_wait_over_a_helper_s_own_iteration_is_not_read_as_a_wait_of_the_entries(loop: str) -> None:
    hooks = f"def handle_preemptions(self, metadata):\n    {loop}\n"
    label = _labels(hooks, prelude=ITERATORS)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN, label
    assert "loops over a Retired, whose own iteration (Retired) decides" in label.reasons[0], label


@pytest.mark.parametrize("iterable", [
    "self._by_req.pop(req_id, [])",  # an entry of a container of plain data the class fills with tasks
    "sorted(self._by_req.get(req_id, []))",  # a builtin's result
    "list(range(3))",
])
def test_loops_over_plain_containers_keep_their_reading_beside_an_iterator_class(iterable: str) -> None:
    """The PR's ``_settle`` loops over ``self._by_req.pop(req_id, [])``; the class builds no Retired, so the entry is
    its tasks' list, read as before."""
    hooks = f"""
    def _settle(self, req_ids):
        for req_id in req_ids:
            for task in {iterable}:
                self.store.wait(task)
    """
    label = _labels(hooks, prelude=ITERATORS)["Proto.handle_preemptions"]
    assert label.label != UNKNOWN, label


def test_an_entry_of_a_container_the_class_fills_with_iterators_is_not_read() -> None:
    hooks = """
    def wait_for_save(self):
        meta = self._get_connector_metadata()
        self._async_dump_req_ids.update(meta.saving)
        task = self.store.dump(meta.blocks)
        for req_id in meta.saving:
            self._by_req.setdefault(req_id, []).append(task)
            self._views[req_id] = Retired(self.store, self._by_req, [req_id])
    def handle_preemptions(self, metadata):
        for req_id in metadata.preempted_req_ids:
            for _, task in self._views.pop(req_id, []):
                self.store.wait(task)
    """
    label = _labels(hooks, prelude=ITERATORS)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN and "an entry of self._views, which may be a Retired" in label.reasons[0], label


@pytest.mark.parametrize("where", ["__init__", "register_kv_caches"])
def test_a_connector_method_assigned_on_the_instance_is_not_read_from_the_class(where: str) -> None:
    signature = "self, vllm_config, role, kv_cache_config=None" if where == "__init__" else "self, kv_caches"
    hooks = f"""
    def {where}({signature}):
        self._by_req = {{}}
        self.handle_preemptions = PreemptionFence(self.store, self._by_req)
    """
    labels = _labels(hooks, prelude=ITERATORS)
    label = labels["Proto.handle_preemptions"]
    assert label.label == UNKNOWN and f"Proto.{where} assigns self.handle_preemptions" in label.reasons[0], label
    assert labels["Proto.get_finished"].label == "wait_finished"  # only the assigned name


def test_a_connector_method_unpacked_onto_the_instance_is_not_read_from_the_class() -> None:
    """Any store to ``self.<m>`` counts, a tuple's unpacking included, not only ``self.<m> = value``."""
    hooks = """
    def register_kv_caches(self, kv_caches):
        self.handle_preemptions, self._fences = PreemptionFence(self.store, self._by_req), []
    """
    label = _labels(hooks, prelude=ITERATORS)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN and "Proto.register_kv_caches assigns self.handle_preemptions" in label.reasons[0]
