"""The reading rules the twenty-first blind round called for (two helpers wrote 12 files with answer keys: task tables
that subclass ``dict``, ``set``, ``list`` or ``queue.Queue`` and override one method with store work, library objects
holding tasks, and helper objects carried in the connector metadata; tests/fixtures/mro/corpus/
blind_dict_subclass_task_tables.py and its siblings are judged with TLC by the corpus test):

* **special methods are calls.** ``self._tasks[rid] = (0, ids[0])`` calls ``type(self._tasks).__setitem__``, which
  ``LatentAssignConnector``'s table (``PolledDumpTable(dict)``) overrides to submit a dump. The reader read the line
  as a dict store, saw no dump at all and judged the class **safe** under MLA (truth unsafe: only rank 0 waits, and
  rank 1's dumps still read blocks both ranks' reports free). Subscripts, ``del``, operators and augmented
  assignments, comparisons and ``in``, truth tests and builtins such as ``len`` are now recorded as calls of their
  special methods on their receivers, and matched against the helper classes of the analysed files like any call
  whose receiver's class is not read; a builtin's own special methods do no store work;
* **a container subclass's own ``extend``/``pop``/``__setitem__`` is its own**: ``LayerBatchConnector`` fenced over
  a ``StepBatch(list)`` whose ``extend`` replaces the batch, read as ``list.extend`` (**safe**, truth unsafe);
* **``super().pop()`` in a ``dict`` subclass is the builtin's** (no store work), so the subclass's ``pop`` is read
  for what it adds (a wait), not dismissed as "finds no definition"; ``UserDict``'s is not a builtin's;
* **a helper calling back into the connector**: ``plan.execute(self)``, whose ``execute`` calls
  ``connector._dump(...)``, hid every dump of ``EpochPlanConnector`` and ``TailCheckPlanConnector`` (**safe** with
  one group, as MultiConnector children and under MLA; truth unsafe)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from deferdump.tools.mro.behaviour import UNKNOWN
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner, judge_files
from deferdump.tools.mro.source import HIDDEN_SUBMIT, UNSEEN_KEEPING, read_source
from deferdump.tools.mro.tla import ModelBounds
from test_mro_blind_round6 import HEADER, PROTOCOL, _labels

#: Task tables that override one special method with store work, and one whose special methods are the builtin's.
TABLES = """
class PolledDumpTable(dict):
    def __init__(self, store):
        super().__init__()
        self._store = store
    def __setitem__(self, req_id, blocks):
        super().__setitem__(req_id, [*super().get(req_id, ()), self._store.dump(blocks)])
class ClosingTaskDict(dict):
    def __init__(self, store):
        super().__init__()
        self._store = store
    def __delitem__(self, req_id):
        for task in super().__getitem__(req_id):
            self._store.wait(task)
        super().__delitem__(req_id)
class RunningSet(set):
    def __init__(self, store):
        super().__init__()
        self._store = store
    def __contains__(self, task):
        return not self._store.check(task)
class DrainingList(list):
    def __init__(self, store):
        super().__init__()
        self._store = store
    def __len__(self):
        return sum(1 for task in list.__iter__(self) if not self._store.check(task))
    def __isub__(self, done):
        for task in done:
            self._store.wait(task)
        return self
class PlainTable(dict):
    def describe(self):
        return sorted(self)
"""

INIT = """
def __init__(self, vllm_config, role, kv_cache_config=None):
    super().__init__(vllm_config, role, kv_cache_config)
    self._async_dump_req_ids = set()
    self._by_req = {{}}
    self._pending = []
    self._tasks = {table}
"""


@pytest.mark.parametrize("table", ["PolledDumpTable(self.store)", "self._table_cls(self.store)"])
def test_a_subscript_store_into_a_table_whose_setitem_submits_is_a_hidden_submit(table: str) -> None:
    hooks = INIT.format(table=table) + """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    for req_id in meta.saving:
        self._tasks[req_id] = meta.blocks
"""
    label = _labels(hooks, prelude=TABLES)["Proto.wait_for_save"]
    assert label.label == UNKNOWN, label
    why = next(r for r in label.reasons if "self._tasks.__setitem__()" in r)
    assert "PolledDumpTable.__setitem__ does a store submit" in why and HIDDEN_SUBMIT in why, label


@pytest.mark.parametrize(("hook", "table", "special"), [
    ("def handle_preemptions(self, metadata):\n    for rid in metadata.preempted_req_ids:\n"
     "        del self._tasks[rid]", "ClosingTaskDict(self.store)", "__delitem__"),
    ("def get_finished(self, finished_req_ids):\n    done = {r for r in finished_req_ids if r not in self._tasks}\n"
     "    return done, None", "RunningSet(self.store)", "__contains__"),
    ("def handle_preemptions(self, metadata):\n    while self._tasks:\n        self.store.wait(self._pending.pop())",
     "DrainingList(self.store)", "__len__"),
    ("def handle_preemptions(self, metadata):\n    self._tasks -= list(self._pending)", "DrainingList(self.store)",
     "__isub__"),
])
def test_waits_and_polls_in_special_methods_are_not_read_as_the_builtin_s(hook: str, table: str, special: str) -> None:
    method = hook.split("(")[0].removeprefix("def ")
    label = _labels(INIT.format(table=table) + hook + "\n", prelude=TABLES)[f"Proto.{method}"]
    assert label.label == UNKNOWN, label
    assert any(f"self._tasks.{special}()" in r and "not by what it does" in r for r in label.reasons), label


def test_tables_of_plain_data_keep_the_protocol_s_reading() -> None:
    """The tables above beside PR #989's protocol change nothing: its ``self._by_req`` is a ``dict`` built by name,
    and a local ``saves = {}`` or ``set(...)`` is the builtin's; a helper class whose special methods are the
    builtin's (``PlainTable``) is read as data too."""
    plain = {name: label.label for name, label in _labels("").items()}
    assert {name: label.label for name, label in _labels("", prelude=TABLES).items()} == plain
    hooks = INIT.format(table="PlainTable()") + """
def build_connector_meta(self, scheduler_output):
    saves = {}
    seen = set(self._async_dump_req_ids)
    for req_id in scheduler_output.saving:
        if req_id not in seen:
            saves[req_id] = len(saves)
        self._tasks[req_id] = saves
    self._async_dump_req_ids.update(scheduler_output.saving)
    return scheduler_output
"""
    labels = _labels(hooks, prelude=TABLES)
    assert labels["Proto.build_connector_meta"].label == plain["Proto.build_connector_meta"], labels


def test_the_mla_case_of_a_table_that_dumps_on_assignment_is_not_safe(tmp_path: Path) -> None:
    """``LatentAssignConnector`` in small: every rank dumps through the table's ``__setitem__``, only rank 0 waits
    before reporting. Judged before the rule: **safe** in every case (no dump was seen)."""
    path = tmp_path / "latent_assign.py"
    path.write_text(HEADER + "from blockstore_client import BlockStore\n" + TABLES + '''
from vllm.distributed.parallel_state import get_tensor_model_parallel_rank


class LatentAssign(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._saved = set()
        self._known = set()
        self._store = BlockStore("bs://local")
        self._tasks = PolledDumpTable(self._store)
        self._persists = True
        if vllm_config.model_config.use_mla:
            self._persists = get_tensor_model_parallel_rank() == 0

    def build_connector_meta(self, scheduler_output):
        self._saved.update(scheduler_output.saving)
        return scheduler_output

    def request_finished(self, request, block_ids):
        held = request.request_id in self._saved
        self._saved.discard(request.request_id)
        return held, None

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        for req_id in meta.saving:
            self._known.add(req_id)
            self._tasks[req_id] = meta.blocks

    def _drop(self, req_ids):
        for req_id in req_ids:
            tasks = self._tasks.pop(req_id, [])
            if self._persists:
                for task in tasks:
                    self._store.wait(task)

    def handle_preemptions(self, metadata):
        self._drop(metadata.preempted_req_ids)

    def get_finished(self, finished_req_ids):
        closing = finished_req_ids & self._known
        self._drop(closing)
        self._known -= closing
        return closing or None, None
''', encoding="utf-8")
    report = judge_files([path], runner=ModelRunner(ModelBounds(), timeout=120))
    judged = report.connectors["LatentAssign"]
    assert judged.verdict != "safe", judged
    mla = [j for j in judged.judgements if j.context.case == "mla"]
    assert mla and all(j.verdict != "safe" for j in mla), [(j.context.key, j.verdict) for j in mla]


#: Per-request plans the scheduler ships in the metadata; the worker runs each with the connector itself.
PLANS = """
class RequestPlan:
    def __init__(self, req_id, blocks):
        self.req_id = req_id
        self.blocks = blocks
    def execute(self, connector):
        connector._dump(self.req_id, self.blocks)
    def describe(self, connector):
        return connector._name(self.req_id)
"""

CALLBACKS = """
def _dump(self, req_id, blocks):
    self._by_req.setdefault(req_id, []).append(self.store.dump(blocks))
def _name(self, req_id):
    return f"{req_id}"
"""


def test_a_helper_calling_back_into_the_connector_s_dump_is_a_hidden_submit() -> None:
    """``RegistryPlanConnector`` (twenty-first round): ``plan.execute(self)`` in ``wait_for_save``, whose
    ``RequestPlan.execute`` calls ``connector._dump(...)``, was read as no store work; the class's only dumps went
    unseen and ``EpochPlanConnector`` and ``TailCheckPlanConnector`` were judged **safe** with one group, as
    MultiConnector children and under MLA (truth unsafe: dumps under a later epoch's tag are never waited)."""
    hooks = CALLBACKS + """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    for plan in meta.plans:
        plan.execute(self)
"""
    label = _labels(hooks, prelude=PLANS)["Proto.wait_for_save"]
    assert label.label == UNKNOWN, label
    why = next(r for r in label.reasons if "hands self to RequestPlan.execute()" in r)
    assert "calls back connector._dump()" in why and HIDDEN_SUBMIT in why, label


def test_a_module_function_calling_back_into_the_connector_s_dump_is_a_hidden_submit() -> None:
    """The same hand-off to a function of the module: ``run_plan(self, plan)`` whose body calls
    ``conn._dump(...)``."""
    prelude = PLANS + """
def run_plan(conn, plan):
    conn._dump(plan.req_id, plan.blocks)
"""
    hooks = CALLBACKS + """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    for plan in meta.plans:
        run_plan(self, plan)
"""
    label = _labels(hooks, prelude=prelude)["Proto.wait_for_save"]
    assert label.label == UNKNOWN, label
    why = next(r for r in label.reasons if "hands self to run_plan()" in r)
    assert "calls ._dump() on its parameters" in why and HIDDEN_SUBMIT in why, label


def test_a_helper_calling_back_only_into_plain_methods_changes_nothing() -> None:
    """The same hand-off to a method that calls back a connector method with no store work: the PR's reading."""
    hooks = CALLBACKS + """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    task = self.store.dump(meta.blocks)
    self._pending.append(task)
    for req_id in meta.saving:
        self._by_req.setdefault(req_id, []).append(task)
    for plan in meta.plans:
        plan.describe(self)
"""
    assert _labels(hooks, prelude=PLANS)["Proto.wait_for_save"].label == _labels("")["Proto.wait_for_save"].label


def test_a_call_back_that_dumps_from_start_load_kv_starts_a_transfer_outside_the_save_path() -> None:
    source = HEADER + PLANS + PROTOCOL.format(hooks=textwrap.indent(CALLBACKS + """
def start_load_kv(self, forward_context, **kwargs):
    for plan in self._get_connector_metadata().plans:
        plan.execute(self)
""", "    "))
    judge = Judge(build_hierarchy(read_source(source, "<t>")), ModelRunner(ModelBounds(), 60))
    outside = judge._transfers_outside_the_model("Proto", None)  # noqa: SLF001
    assert any("hands self to RequestPlan.execute()" in why for why in outside), outside


#: A ``dict`` or ``UserDict`` subclass ({name}({base})) whose ``pop`` waits the tasks it hands back.
POPPING = """
class {name}({base}):
    def __init__(self, store):
        super().__init__()
        self._store = store
    def pop(self, key, *default):
        tasks = super().pop(key, *default)
        for task in tasks or ():
            self._store.wait(task)
        return tasks
"""


@pytest.mark.parametrize(("table", "base", "why"), [
    ("SettlingTaskDict", "dict", "SettlingTaskDict.pop does a store wait"),  # dict.pop: the builtin's, no store work
    ("SettlingUserDict", "UserDict", "super().pop() finds no definition"),  # UserDict.pop calls an own __delitem__
])
def test_a_builtin_base_s_method_reached_through_super_does_no_store_work(table: str, base: str, why: str) -> None:
    hooks = INIT.format(table=f"{table}(self.store)") + """
def get_finished(self, finished_req_ids):
    done = finished_req_ids & self._async_dump_req_ids
    for req_id in done:
        self._tasks.pop(req_id, None)
    return done, None
"""
    prelude = "from collections import UserDict\n" + POPPING.format(name=table, base=base)
    label = _labels(hooks, prelude=prelude)["Proto.get_finished"]
    assert label.label == UNKNOWN and any(why in r for r in label.reasons), label


#: A list whose ``extend`` replaces its entries, and one whose ``extend`` is the builtin's.
BATCHES = """
class StepBatch(list):
    def extend(self, tasks):
        self[:] = list(tasks)
class CountedBatch(list):
    def size(self):
        return len(self)
"""


@pytest.mark.parametrize(("batch", "unknown"), [("StepBatch", True), ("CountedBatch", False)])
def test_a_container_subclass_s_own_extend_is_not_read_as_the_builtin_s(batch: str, unknown: bool) -> None:
    """``LayerBatchConnector`` (twenty-first round) added each layer's dump with ``self._batch.extend([task])`` and
    fenced every step with ``for task in self._batch: wait(task)``; ``StepBatch.extend`` replaces the batch, so the
    fence waits the newest dump only. Read as ``list.extend``, the fence waited every dump: **safe** in every case
    (truth unsafe). ``CountedBatch`` keeps ``list.extend``: the reading stands. (The class itself is judged with TLC
    by the corpus test: blind_set_list_task_trackers.py is in ``make test``'s sample.)"""
    hooks = f"""
def __init__(self, vllm_config, role, kv_cache_config=None):
    super().__init__(vllm_config, role, kv_cache_config)
    self._async_dump_req_ids = set()
    self._batch = {batch}()
def request_finished(self, request, block_ids):
    return False, None
def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
    for req_id, blocks in self._get_connector_metadata().saves.items():
        self._batch.extend([self.store.dump(blocks)])
def wait_for_save(self):
    return None
def handle_preemptions(self, metadata):
    for task in self._batch:
        self.store.wait(task)
"""
    label = _labels(hooks, prelude=BATCHES)["Proto.save_kv_layer"]
    if not unknown:
        assert label.label != UNKNOWN, label
        return
    assert label.label == UNKNOWN, label
    assert any("StepBatch.extend overrides list.extend" in r and UNSEEN_KEEPING in r for r in label.reasons), label

