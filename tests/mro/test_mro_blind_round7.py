"""The reading rules the seventh blind round called for (two helpers wrote 12 files, 36 classes, with answer
keys; tests/fixtures/mro/corpus/blind_{builtin_fold,finally_guard,property_table,class_registry,completion_hook,
task_slot_descriptor}_connectors.py and blind_{heap_step_queue,template_fence_hooks,protocol_sinks,
deferred_finalisers,layer_chain_zip,chainmap_scopes}.py are judged with TLC by the corpus test). Each test names
the blind class the judge got wrong without the rule, and checks the rule leaves its opposite alone:

* waits that may stop before the last entry (``HeapFrontPopConnector``: safe, truth unsafe; ``HeapQueueConnector``:
  unsafe on a hybrid model, truth safe): a ``while`` whose test is more than "not empty", a loop the body leaves,
  ``zip``, ``all``/``any`` over a generator, a lazy ``map``, a loop over a live view the body removes from
  (``WindowAwareFenceConnector``);
* a preemption handler reading the bound metadata, which vLLM 0.32 binds after it (``BoundMetaPropertyConnector``:
  safe, truth unsafe);
* a preemption wait whose tasks are not chosen by the preempted requests (``TaskTableConnector``,
  ``OwnerKeyedRegistryConnector``, ``DrainAllFenceConnector``: unsafe on a hybrid model, truth safe: a fence);
* a report gated by a table that a waiting method empties (``TimerGraceConnector``: unsafe, truth safe);
* tasks kept in a set of objects that compare equal without being the same (``LayerHookSetConnector``: safe,
  truth unsafe).
Reader tests, no TLC."""
from __future__ import annotations

import pytest

from deferdump.tools.mro.behaviour import UNKNOWN
from test_mro_blind_round6 import _labels

HEAP = """
def get_finished(self, finished_req_ids):
    done = finished_req_ids & self._async_dump_req_ids
    {loop}
    return done, None
"""
EACH = "for r in done:\n        q = self._by_req.pop(r, [])\n        "


@pytest.mark.parametrize(("loop", "partial"), [
    (EACH + "while q and q[0] is not None:\n            self.store.wait(q.pop(0))", True),
    (EACH + "for task in q:\n            if self.store.wait(task) != 0:\n                break", True),
    ("for r, name in zip(done, self._short):\n        for t in self._by_req.pop(r, []):\n            self.store.wait(t)", True),
    ("ok = all(self.store.wait(t) == 0 for r in done for t in self._by_req.pop(r, []))", True),
    (EACH + "codes = map(self.store.wait, q)", True),
    (EACH + "ok = self.store.wait(q[0]) == 0 and self.store.wait(q[1]) == 0", True),
    (EACH + "for task in q:\n            self.store.wait(task)", False),
    (EACH + "while q:\n            self.store.wait(q.pop())", False),
    ("total = sum(self.store.wait(t) for r in done for t in self._by_req.pop(r, []))", False),
    ("for r, name in zip(done, self._short, strict=True):\n        for t in self._by_req.pop(r, []):\n"
     "            self.store.wait(t)", False),
])
def test_a_report_whose_waits_may_stop_early_is_unknown(loop: str, partial: bool) -> None:
    label = _labels(HEAP.format(loop=loop))["Proto.get_finished"]
    if partial:
        assert label.label == UNKNOWN and any(w in label.reasons[0] for w in ("left running", "lazily")), label
    else:
        assert label.label == "wait_finished", label


def test_a_drain_that_waits_everything_then_leaves_is_a_full_wait() -> None:
    hooks = """
    def _await_all(self, tasks):
        pending = list(tasks)
        while pending:
            pending = [t for t in pending if not self.store.check(t)]
            if pending and self._late():
                for t in pending:
                    self.store.wait(t)
                break
    def handle_preemptions(self, metadata):
        for req_id in metadata.preempted_req_ids:
            self._await_all(self._by_req.pop(req_id, []))
    """  # PolledReleaseConnector, sixth round: blocks on the stragglers, then leaves
    label = _labels(hooks)["Proto.handle_preemptions"]
    assert label.label == "wait_preempted" and not label.reasons and not label.hybrid_reasons, label
    until_done = """
    def handle_preemptions(self, metadata):
        for req_id in metadata.preempted_req_ids:
            for fut in self._by_req.pop(req_id, []):
                while not fut.done():
                    self.store.wait(fut)
    """
    assert _labels(until_done)["Proto.handle_preemptions"].label == "wait_preempted"


def test_a_loop_over_a_live_view_that_the_body_empties_is_unknown() -> None:
    hooks = """
    def _fence_entries(self, metadata):
        return (t for t in self._pending if t.sliding)
    def handle_preemptions(self, metadata):
        for task in self._fence_entries(metadata):
            self.store.wait(task)
            self._pending.remove(task)
    """
    label = _labels(hooks)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN and "removes entries from self._pending" in label.reasons[0], label
    snapshot = """
    def handle_preemptions(self, metadata):
        for task in list(self._pending):
            self.store.wait(task)
            self._pending.remove(task)
    """
    assert _labels(snapshot)["Proto.handle_preemptions"].label != UNKNOWN


def test_a_preemption_handler_reading_the_bound_metadata_sees_the_previous_step() -> None:
    hooks = """
    @property
    def preempted_tasks(self):
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        return {} if meta is None else {r: self._by_req[r] for r in meta.preempted_req_ids if r in self._by_req}
    def handle_preemptions(self, metadata):
        for req_id, tasks in self.preempted_tasks.items():
            for task in tasks:
                self.store.wait(task)
    """
    label = _labels(hooks)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN and "reads the bound metadata" in label.reasons[0], label
    given = """
    @property
    def parked(self):
        return self._by_req
    def handle_preemptions(self, metadata):
        for req_id in metadata.preempted_req_ids:
            for task in self.parked.pop(req_id, []):
                self.store.wait(task)
    """
    assert _labels(given)["Proto.handle_preemptions"].label == "wait_preempted"


def test_a_preemption_wait_not_chosen_by_the_preempted_requests_may_be_a_hybrid_fence() -> None:
    hooks = """
    def handle_preemptions(self, metadata):
        for task in list(self._pending):
            if task.sliding:
                self.store.wait(task)
                self._pending.remove(task)
    """  # WindowAwareFenceConnector's choice: a fence over sliding-window dumps
    label = _labels(hooks)["Proto.handle_preemptions"]  # unknown in every case since the tenth blind round
    assert label.label == UNKNOWN and "not selected by the preempted requests" in label.reasons[0], label
    assert _labels(hooks, "hybrid")["Proto.handle_preemptions"].label == UNKNOWN
    helper = """
    def _fence(self, tasks):
        for task in tasks:
            self.store.wait(task)
    def handle_preemptions(self, metadata):
        self._fence(self._pending)
    """
    assert _labels(helper)["Proto.handle_preemptions"].label == UNKNOWN
    # the protocol's own handler: _settle(metadata.preempted_req_ids) waits the preempted requests' tasks only
    assert not _labels("")["Proto.handle_preemptions"].hybrid_reasons


TIMER = """
def _close(self, bid):
    batch = self._batches.pop(bid)
    batch.close()
    for req_id in batch.req_ids:
        del self._open[req_id]
def get_finished(self, finished_req_ids):
    ready = {{r for r in finished_req_ids & self._async_dump_req_ids if r not in self._open}}
    return ready or None, None
"""


def test_a_report_gated_by_a_table_a_waiting_method_empties_is_unknown() -> None:
    label = _labels(TIMER)["Proto.get_finished"]
    assert label.label == UNKNOWN and "self._open no longer holds" in label.reasons[0], label
    plain = TIMER.replace("    batch.close()\n", "")
    assert _labels(plain)["Proto.get_finished"].label == "report_before_wait"


@pytest.mark.parametrize("emptying", ["self._open.clear()", "self._open.difference_update(batch.req_ids)",
                                      "self._open -= set(batch.req_ids)", "self._open.popitem()"])
def test_every_way_of_emptying_the_gating_table_counts(emptying: str) -> None:
    """``clear()`` and the in-place differences take requests out of the table as ``del`` does (a second,
    narrower ``_REMOVING_CALLS`` once shadowed the tracking one, so ``clear()`` read as a read)."""
    hooks = TIMER.replace("    for req_id in batch.req_ids:\n        del self._open[req_id]\n", f"    {emptying}\n")
    assert emptying in hooks
    label = _labels(hooks)["Proto.get_finished"]
    assert label.label == UNKNOWN and "self._open no longer holds" in label.reasons[0], label
    reading = hooks.replace(f"    {emptying}\n", "    self._open.copy()\n")
    assert _labels(reading)["Proto.get_finished"].label == "report_before_wait"


SET_HEADER = """
from dataclasses import dataclass, field
@dataclass(frozen=True)
class Hook:
    req_id: str
    layer: str
    task: object = field(compare=False)
class Plain:
    def __init__(self, req_id, layer, task):
        self.req_id, self.layer, self.task = req_id, layer, task
"""


@pytest.mark.parametrize(("made", "lost"), [("Hook", True), ("Plain", False)])
def test_a_task_kept_in_a_set_of_equal_comparing_objects_can_be_dropped(made: str, lost: bool) -> None:
    hooks = f"""
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        meta = self._get_connector_metadata()
        task = self.store.dump(meta.blocks)
        self._hooks.add({made}(meta.req_id, layer_name, task))
    """
    label = _labels(hooks, prelude=SET_HEADER)["Proto.save_kv_layer"]
    assert bool(label.beyond_model) is lost, label
    if lost:
        assert "compare equal without being the same" in label.beyond_model[0]
