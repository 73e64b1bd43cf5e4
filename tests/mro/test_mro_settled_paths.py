"""A synchronous save split across helpers (tools/mro/settled_paths.py). The thirtieth blind round's
``StepBatchConnector`` (keyed safe) submits each dump in one helper, into the step's batch
(``batch.tasks.append(self._store.dump(...))``), and waits every entry of that list in another
(``self._settle(batch.tasks)``), both in ``wait_for_save`` (its finish answers a constant False through
``request_finished_all_groups``: test_mro_finish_answers.py). It was ``unknown`` in every case; it is now **safe**.
Each opposite below leaves a dump of the call unwaited (or may), and keeps the class from ``safe``: a wait loop that
stops at the first failure, a call before the wait that may raise into the handler, a wait only under a test, the
settle before the submit or under a test, an entry taken out between them, the container rebound, a task put into a
copy, the list handed to code not read or reached through an argument that is not a path, the batch rebound after
a name was bound to it (the tasks go to the old one, the wait to the new), a bounded deque (a full one drops its
oldest entry), an attribute that is a property, a loop that skips entries, and a ``return`` between submit and
settle."""
from __future__ import annotations

import textwrap

import pytest

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_source
from deferdump.tools.mro.tla import ModelBounds

#: The StepBatchConnector shape: the step's batch bound in ``bind_connector_metadata``, its dumps submitted by one
#: helper and settled by another in ``wait_for_save``; the finish answers through ``request_finished_all_groups``.
STEP_BATCH = '''
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


class Batch:
    def __init__(self, meta):
        self.meta = meta
        self.tasks = []


class StepSettled(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._store = make_store()
        self._batch = None

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        return None

    def build_connector_meta(self, scheduler_output):
        return scheduler_output

    def request_finished(self, request, block_ids):
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request, block_ids):
        return False, None

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        self._batch = Batch(connector_metadata)

    def start_load_kv(self, forward_context, **kwargs):
        return None

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return None

    def _submit_batch(self, batch):
        for spec in batch.meta.dumps:
            batch.tasks.append(self._store.dump(spec.block_ids, spec.keys))

    def _settle(self, tasks):
        failures = 0
        for task in tasks:
            try:
                if self._store.wait(task) != 0:
                    failures += 1
            except RuntimeError:
                failures += 1
        return failures

    def wait_for_save(self):
        batch = self._batch
        if batch is None:
            return
        self._submit_batch(batch)
        self._settle(batch.tasks)
        batch.tasks.clear()

    def clear_connector_metadata(self):
        super().clear_connector_metadata()
        self._batch = None
'''

SETTLE = '''        self._submit_batch(batch)
        self._settle(batch.tasks)
'''


def _verdicts(source: str) -> tuple[dict[str, str], tuple[str, ...]]:
    judge = Judge(build_hierarchy(read_source(textwrap.dedent(source), "<t>")), ModelRunner(ModelBounds(), 60))
    judgement = judge.judge("StepSettled", cases=["single", "hybrid"])
    cases = {j.context.case if j.context else "single": j.verdict for j in judgement.judgements}
    return cases, judgement.judgements[0].reasons


def _with(old: str, new: str, source: str = STEP_BATCH) -> str:
    assert old in source, old
    return source.replace(old, new)


def test_a_save_submitted_in_one_helper_and_settled_in_another_is_safe_in_every_case() -> None:
    cases, reasons = _verdicts(STEP_BATCH)
    assert set(cases.values()) == {"safe"}, (cases, reasons)


def test_settling_a_copy_of_the_list_is_the_same_save() -> None:
    cases, reasons = _verdicts(_with("self._settle(batch.tasks)", "self._settle(list(batch.tasks))"))
    assert set(cases.values()) == {"safe"}, (cases, reasons)


#: Each of these leaves a dump of the call unwaited, or may: the class must not be safe.
OPPOSITES = {
    "the wait loop stops at the first failure": _with("""            except RuntimeError:
                failures += 1
        return failures""", """            except RuntimeError:
                failures += 1
                break
        return failures"""),
    "a wait only under a test": _with("""                if self._store.wait(task) != 0:
                    failures += 1""", """                if task.pending:
                    self._store.wait(task)"""),
    "the settle before the submit": _with(SETTLE, """        self._settle(batch.tasks)
        self._submit_batch(batch)
"""),
    "the settle under a test": _with(SETTLE, """        self._submit_batch(batch)
        if self._strict:
            self._settle(batch.tasks)
"""),
    "an entry taken out between them": _with(SETTLE, """        self._submit_batch(batch)
        self._late = batch.tasks.pop()
        self._settle(batch.tasks)
"""),
    "the container rebound between them": _with(SETTLE, """        self._submit_batch(batch)
        self._batch = Batch(batch.meta)
        self._settle(self._batch.tasks)
"""),
    "the tasks put into a copy": _with(SETTLE, """        self._submit_batch(Batch(batch.meta))
        self._settle(batch.tasks)
"""),
    "a return between submit and settle": _with(SETTLE, """        self._submit_batch(batch)
        if not batch.meta.sync:
            return
        self._settle(batch.tasks)
"""),
    "a call that may raise into the handler before the wait": _with("""            try:
                if self._store.wait(task) != 0:""", """            try:
                metrics.observe(task.size)
                if self._store.wait(task) != 0:"""),
    "a loop that skips entries": _with("""        for task in tasks:
            try:""", """        for task in tasks:
            if task.done:
                continue
            try:"""),
    "the list handed to code that is not read": _with(SETTLE, """        self._submit_batch(batch)
        self._offload(batch.tasks)
        self._settle(batch.tasks)
"""),
    "the settle given an expression over the list": _with("""    def _settle(self, tasks):
        failures = 0""", """    def _settle(self, tasks):
        tasks.clear()
        failures = 0""", _with("self._settle(batch.tasks)", "self._settle(batch.tasks or [])")),
    "the batch rebound after it was named, then submitted to by that name": _with(SETTLE, """        self._batch = Batch(batch.meta)
        self._submit_batch(batch)
        self._settle(self._batch.tasks)
"""),
    "a bounded deque for the tasks": _with("""        self.tasks = []
""", """        self.tasks = deque(maxlen=4)
""", "from collections import deque\n" + STEP_BATCH),
    "an attribute that is a property": _with("""        self.tasks = []
""", """        self._tasks = []

    @property
    def tasks(self):
        return list(self._tasks)
"""),
}


@pytest.mark.parametrize("name", sorted(OPPOSITES))
def test_a_save_that_may_leave_a_dump_unwaited_is_not_safe(name: str) -> None:
    cases, reasons = _verdicts(OPPOSITES[name])
    assert "safe" not in cases.values(), (name, cases, reasons)
