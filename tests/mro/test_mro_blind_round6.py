"""The reading rules the sixth blind round called for (a helper wrote 6 files, 16 classes, with an answer key;
tests/fixtures/mro/corpus/blind_{reaper_queue_connectors,hma_group_split,chunked_prefill_savers,
lru_layer_dumpers,spec_rollback_savers,opt_in_persist}.py are judged with TLC by the corpus test). Each test
names the blind class the judge got wrong without the rule, and checks the rule leaves its opposite alone:

* a wait that runs only under a condition (``if self._sync: wait(t)``), and tasks kept in an object a ``self``
  table holds (``state.tasks[key] = task``): ``FixedChunkSaveConnector`` and ``OptInPersistConnector``, judged
  safe as synchronous savers (truth: unsafe, a task replaced without a wait);
* a report gated by polling (``all(store.check(t) ...)``): with the rule above, ``ChunkSaveConnector`` was unsafe;
* a preemption set built in ``bind_connector_metadata``, which vLLM 0.32 calls after ``handle_preemptions``
  (``StepViewPersistConnector``: safe, truth unsafe);
* a finish answering False for a tracked request (``BestEffortPersistConnector``: safe, truth unsafe);
* a preemption handler or ``wait_for_save`` that always drains a second task list (``SplitGroupSaver``,
  ``WindowFencedSaver``), or chooses between all pending tasks and the preempted ones by a test
  (``QueueReaperConnector``, ``SpecRollbackConnector``): unsafe on a hybrid model, truth safe (a fence).
Reader tests, no TLC."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.behaviour import UNKNOWN
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_source
from deferdump.tools.mro.tla import ModelBounds

HEADER = "from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1\n"

#: PR #989's protocol with every method spelled out; {hooks} replace or add methods per test.
PROTOCOL = """
class Proto(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._async_dump_req_ids = set()
        self._recving = set()
        self._pending = []
        self._by_req = {{}}
        self._short = []
        self._sync = False
    def build_connector_meta(self, scheduler_output):
        self._async_dump_req_ids.update(scheduler_output.saving)
        return scheduler_output
    def request_finished(self, request, block_ids):
        if request.request_id in self._async_dump_req_ids:
            self._async_dump_req_ids.discard(request.request_id)
            return True, None
        return False, None
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass
    def wait_for_save(self):
        meta = self._get_connector_metadata()
        self._async_dump_req_ids.update(meta.saving)
        task = self.store.dump(meta.blocks)
        self._pending.append(task)
        for req_id in meta.saving:
            self._by_req.setdefault(req_id, []).append(task)
    def _settle(self, req_ids):
        for req_id in req_ids:
            for task in self._by_req.pop(req_id, []):
                self.store.wait(task)
    def handle_preemptions(self, metadata):
        self._settle(metadata.preempted_req_ids)
    def get_finished(self, finished_req_ids):
        done = finished_req_ids & self._async_dump_req_ids
        self._settle(done)
        return done, None
{hooks}
"""


def _labels(hooks: str, case: str = "single", prelude: str = "") -> dict[str, object]:
    """Labels of ``Proto`` with ``hooks`` added; ``prelude``: module-level code before it (helper classes)."""
    source = PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(hooks), "    "))
    hierarchy = build_hierarchy(read_source(HEADER + prelude + textwrap.dedent(source), "<t>"))
    judge = Judge(hierarchy, ModelRunner(ModelBounds(), 60))
    return {f"{l.owner}.{l.method}": l for l in judge._labels("Proto", None, [], case)}  # noqa: SLF001


def test_the_protocol_fixture_reads_as_the_pr() -> None:
    labels = _labels("")
    assert labels["Proto.get_finished"].label == "wait_finished"
    assert labels["Proto.handle_preemptions"].label == "wait_preempted"
    assert labels["Proto.request_finished"].label == "delay_if_tracked"
    assert not labels["Proto.handle_preemptions"].hybrid_reasons


# -- conditional waits, tasks kept in held objects -------------------------------------------------------------
def test_a_wait_under_a_switch_is_neither_a_synchronous_save_nor_a_deferred_one() -> None:
    hooks = """
    def wait_for_save(self):
        meta = self._get_connector_metadata()
        self._async_dump_req_ids.update(meta.saving)
        task = self.store.dump(meta.blocks)
        if self._sync:
            self.store.wait(task)
        else:
            self._pending.append(task)
    """
    label = _labels(hooks)["Proto.wait_for_save"]
    assert label.label == UNKNOWN and "only under a condition" in label.reasons[0], label


def test_a_submit_and_its_wait_under_one_condition_stay_a_synchronous_save() -> None:
    """UCM's pre-#989 wait_for_save: ``if is_save:`` encloses both the dump and its wait."""
    hooks = """
    def wait_for_save(self):
        meta = self._get_connector_metadata()
        if meta.blocks:
            task = self.store.dump(meta.blocks)
            self.store.wait(task)
    """
    assert _labels(hooks)["Proto.wait_for_save"].label == "sync_save"


def test_a_task_put_in_an_object_a_table_holds_is_kept_and_replaced_per_key() -> None:
    """FixedChunkSaveConnector: ``state = self._reqs.setdefault(...)``, ``state.tasks[key] = task``; a later
    dump under the same key loses the earlier task (the sync wait runs only under ``if self._sync``)."""
    hooks = """
    def wait_for_save(self):
        meta = self._get_connector_metadata()
        self._async_dump_req_ids.update(meta.saving)
        for plan in meta.plans:
            state = self._by_req.setdefault(plan.req_id, State())
            task = self.store.dump(plan.blocks)
            state.tasks[plan.start // 512] = task
    """
    label = _labels(hooks)["Proto.wait_for_save"]
    assert label.label == "poll_track_submit" and label.beyond_model, label
    assert "one per key (self._by_req[plan]" in label.beyond_model[0]


def test_a_report_gated_by_polling_is_not_report_before_wait() -> None:
    hooks = """
    def get_finished(self, finished_req_ids):
        done = set()
        for req_id in finished_req_ids & self._async_dump_req_ids:
            if all(self.store.check(t) for t in self._by_req.get(req_id, [])):
                done.add(req_id)
        return done, None
    """
    label = _labels(hooks)["Proto.get_finished"]
    assert label.label == UNKNOWN and "polls store tasks" in label.reasons[0], label


# -- the step order: handle_preemptions before bind ------------------------------------------------------------
def test_a_preemption_set_built_when_the_metadata_is_bound_is_the_previous_steps() -> None:
    hooks = """
    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        self._preempted = set(connector_metadata.preempted_req_ids)
    def handle_preemptions(self, metadata):
        self._settle(self._preempted)
    """
    label = _labels(hooks)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN and "gpu_model_runner.py ~3968-3971" in label.reasons[0], label
    own = """
    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        self._step = connector_metadata
    """
    assert _labels(own)["Proto.handle_preemptions"].label == "wait_preempted"  # reads its argument only


# -- a finish that frees a tracked request ---------------------------------------------------------------------
def test_a_finish_answering_false_for_a_tracked_request_is_unknown() -> None:
    hooks = """
    def request_finished(self, request, block_ids):
        if request.priority > 0 and request.request_id in self._async_dump_req_ids:
            self._async_dump_req_ids.discard(request.request_id)
            return False, None
        if request.request_id in self._async_dump_req_ids:
            self._async_dump_req_ids.discard(request.request_id)
            return True, None
        return False, None
    """
    label = _labels(hooks)["Proto.request_finished"]
    assert label.label == UNKNOWN and "answers False" in label.reasons[0], label
    receiving = """
    def request_finished(self, request, block_ids):
        if request.request_id in self._recving:
            return False, None
        if request.request_id in self._async_dump_req_ids:
            self._async_dump_req_ids.discard(request.request_id)
            return True, None
        return False, None
    """  # the reference connector's shape, but a set the class never fills where it untracks (twenty-fifth round):
    # a tracked request in it is freed at once; the reference's own set is read in test_mro_blind_round25.py
    label = _labels(receiving)["Proto.request_finished"]
    assert label.label == UNKNOWN and "request.request_id in self._recving" in label.reasons[0], label


# -- fences the reader cannot place ----------------------------------------------------------------------------
def test_an_unconditional_drain_beside_the_preemption_wait_may_be_a_hybrid_fence() -> None:
    hooks = """
    def _wait_all(self, tasks, what):
        for task in tasks:
            if self.store.wait(task) != 0:
                logger.warning("%s failed", what)
    def _drain_short(self):
        tasks, self._short = self._short, []
        self._wait_all(tasks, "window")
    def handle_preemptions(self, metadata):
        self._settle(metadata.preempted_req_ids)
        self._drain_short()
    """
    # it waits more than the preempted requests' tasks, in every case (tenth blind round): not wait_preempted
    label = _labels(hooks)["Proto.handle_preemptions"]
    assert label.label == UNKNOWN and "it may wait more than their tasks" in label.reasons[0], label
    assert _labels(hooks, "hybrid")["Proto.handle_preemptions"].label == UNKNOWN
    polling = """
    def _poll(self):
        for task in list(self._pending):
            if self.store.check(task):
                self.store.wait(task)
                self._pending.remove(task)
    def handle_preemptions(self, metadata):
        self._settle(metadata.preempted_req_ids)
        self._poll()
    """  # UCM's _poll_pending_dump_tasks: it waits only tasks a poll found done
    assert not _labels(polling)["Proto.handle_preemptions"].hybrid_reasons


def test_a_selection_switched_between_all_pending_and_the_preempted_is_unknown_in_every_case() -> None:
    """Either side may run: waiting every pending task is a fence on a hybrid model and a flush before the
    forward on any (the eighth blind round's ``LeaderLayoutConnector`` chose it by the KV-cache layout)."""
    hooks = """
    def handle_preemptions(self, metadata):
        if self._sync:
            with self._lock:
                targets = list(self._by_req)
        else:
            targets = list(metadata.preempted_req_ids)
        self._settle(targets)
    """
    for case in ("single", "hybrid"):
        label = _labels(hooks, case)["Proto.handle_preemptions"]
        assert label.label == UNKNOWN and "chooses what it waits by `self._sync`" in label.reasons[0], label
    expression = """
    def handle_preemptions(self, metadata):
        targets = list(self._by_req) if self._sync else metadata.preempted_req_ids
        self._settle(targets)
    """
    assert _labels(expression)["Proto.handle_preemptions"].label == UNKNOWN
