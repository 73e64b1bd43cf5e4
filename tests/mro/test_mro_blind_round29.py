"""The reading rules the twenty-ninth blind round called for (two helpers wrote 12 files: parallel sampling, priority
preemption, async scheduling, backfill of local hits, resumed block tables, pipeline stages; container aliases, lazy
waits, futures around store tasks, nested records, helpers returning tasks, dynamic attributes;
tests/fixtures/mro/corpus/blind_parallel_sampling.py and its siblings are judged with TLC by the corpus test). With
the session's starting code no class verdict contradicted a key, but 17 classes had cases judged **safe** against
their keys; these rules decide seven of them `unknown`:

* **a rank that returns from ``wait_for_save`` before it tracks never reports.** ``ReplicaAwareLaneConnector``
  returns on MLA's replica ranks (``if not self._dumps_enabled: return``, the attribute assigned from the rank) before
  ``super().wait_for_save()`` tracks the step's requests; vLLM's aggregator waits for a report from every rank, so
  the request's delayed free never comes (PR #989's ``track_after_mla_return`` mutant). The model's worst reading of
  the unknown save tracks on every rank and passed: **safe** under MLA. And a first-statement ``if <rank test>:
  return`` was read as the PR's MLA early return, which comes after the tracking.
* **a release made only when a store wait returns leaks on a wait that raises.** ``EventFencedStageLeanConnector``
  releases its event after ``store.wait`` inside a ``try`` whose ``except`` only logs: PR #989's release-on-success
  bug in a helper named ``_wait``, where the model checks handles only in ``_wait_pending_dump_task``: **safe**.
* **attributes named at run time** (``vars(self)``, ``self.__dict__``, ``setattr(self, <expression>, ...)``) are not
  read: ``ReflectiveStoreConnector``'s subclasses hide a task table in ``__slots__`` (``SlottedLayerConnector``).
* **a local alias of a ``self`` container bound anew** before entries go through it keeps them nowhere
  (``ResumeAwareStoreConnector``).
* **a wait under a test of one set within another** waits a shared task only once all its requests are finished
  (``DetachingRecordConnector``).
* **a save that waits on one side of a test and keeps in a ``self`` container on the other** is not blocking
  (``RecordStoreConnector``, whose reading as blocking hid its subclass's report of a running shared dump)."""
from __future__ import annotations

from deferdump.tools.mro.behaviour import RANK_DECIDED

from test_mro_blind_round26 import _judge, _labels

RANK_PRELUDE = "from vllm.distributed.parallel_state import get_tensor_model_parallel_rank\n"

# -- a rank returning before it tracks -------------------------------------------------------------------------------
REPLICA_RETURN = """
def __init__(self, vllm_config, role, kv_cache_config=None):
    super().__init__(vllm_config, role, kv_cache_config)
    self._async_dump_req_ids = set()
    self._by_req = {}
    self._dumps_enabled = get_tensor_model_parallel_rank() == 0
def _save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    task = self.store.dump(meta.blocks)
    for req_id in meta.saving:
        self._by_req.setdefault(req_id, []).append(task)
def wait_for_save(self):
    if not self._dumps_enabled:
        return
    self._save()
"""

NAMED_RETURN = REPLICA_RETURN.replace("    if not self._dumps_enabled:\n",
                                      "    if get_tensor_model_parallel_rank() != 0:\n")

#: The PR's order: every rank tracks the step's requests, then the replica ranks return before submitting.
TRACK_THEN_RETURN = NAMED_RETURN.replace("""def wait_for_save(self):
    if get_tensor_model_parallel_rank() != 0:
        return
    self._save()""", """def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    if get_tensor_model_parallel_rank() != 0:
        return
    task = self.store.dump(meta.blocks)
    for req_id in meta.saving:
        self._by_req.setdefault(req_id, []).append(task)""")


def test_a_rank_returning_from_the_save_before_it_tracks_is_never_safe_under_mla() -> None:
    for hooks in (REPLICA_RETURN, NAMED_RETURN):
        label = _labels(hooks, case="mla", prelude=RANK_PRELUDE)["Proto.wait_for_save"]
        assert label.label == "unknown" and RANK_DECIDED in label.reasons[0], label
        judge = _judge(hooks, prelude=RANK_PRELUDE)
        mla = judge.judge("Proto", cases=["mla"]).judgements[0]
        assert mla.verdict == "unknown" and RANK_DECIDED in mla.reasons[0], (mla.verdict, mla.reasons)
        assert judge.judge("Proto", cases=["single"]).judgements[0].verdict == "safe"  # one rank: it tracks


def test_the_prs_early_return_after_the_tracking_keeps_its_label_and_verdict() -> None:
    """The opposite: PR #989's order (track on every rank, then the MLA early return) is its label, safe on MLA."""
    assert _labels(TRACK_THEN_RETURN, case="mla", prelude=RANK_PRELUDE)["Proto.wait_for_save"].label \
        == "poll_track_submit"
    assert _judge(TRACK_THEN_RETURN, prelude=RANK_PRELUDE).judge("Proto", cases=["mla"]).judgements[0].verdict \
        == "safe"


# -- a release made only when the wait returns -----------------------------------------------------------------------
SUCCESS_RELEASE = """
def _settle(self, req_ids):
    for req_id in req_ids:
        for copy in self._by_req.pop(req_id, []):
            self._wait(copy)
def _wait(self, copy):
    try:
        rc = self.store.wait(copy.task)
        self._release_event(copy)
        if rc != 0:
            logger.warning("dump of %s returned %d", copy.req_id, rc)
    except RuntimeError:
        logger.exception("dump of %s failed", copy.req_id)
def _release_event(self, copy):
    self._free_events.append(copy.event)
"""

FINALLY_RELEASE = SUCCESS_RELEASE.replace("""        self._release_event(copy)
        if rc != 0:
            logger.warning("dump of %s returned %d", copy.req_id, rc)
    except RuntimeError:
        logger.exception("dump of %s failed", copy.req_id)""", """        if rc != 0:
            logger.warning("dump of %s returned %d", copy.req_id, rc)
    except RuntimeError:
        logger.exception("dump of %s failed", copy.req_id)
    finally:
        self._release_event(copy)""")


def test_a_release_only_after_a_wait_that_returns_is_never_judged_safe() -> None:
    judgement = _judge(SUCCESS_RELEASE).judge("Proto", cases=["single"]).judgements[0]
    assert judgement.verdict == "unknown", (judgement.verdict, judgement.reasons)
    assert "_release_event() follows a store wait" in judgement.reasons[0], judgement.reasons


def test_a_release_in_finally_keeps_the_verdict() -> None:
    """The opposite: the same helper releasing in ``finally`` (PR #989's fix) is safe."""
    assert "finally:" in FINALLY_RELEASE
    assert _judge(FINALLY_RELEASE).judge("Proto", cases=["single"]).judgements[0].verdict == "safe"


# -- attributes named at run time ------------------------------------------------------------------------------------
BY_VARS = """
def _boxes(self):
    return [value for name, value in vars(self).items() if name.endswith("_inflight")]
def _settle(self, req_ids):
    for box in self._boxes():
        for req_id in req_ids:
            for task in box.pop(req_id, []):
                self.store.wait(task)
"""


def test_containers_found_by_vars_of_self_are_not_read_as_waited() -> None:
    """``ReflectiveStoreConnector`` (``blind_dynamic_attributes.py``) creates its task tables with
    ``setattr(self, f"_{kind}_inflight", ...)`` and waits them by walking ``vars(self)``; a subclass declaring one in
    ``__slots__`` hides it from ``vars``, so its dumps are never waited (**safe** with one group, truth unsafe). Code
    that reaches attributes by run-time names is now opaque: ``unknown``."""
    label = _labels(BY_VARS)["Proto.get_finished"]
    assert label.label == "unknown" and "vars(self): attributes named at run time" in " ".join(label.reasons), label
    assert _judge(BY_VARS).judge("Proto", cases=["single"]).judgements[0].verdict == "unknown"


def test_a_table_named_in_the_code_keeps_its_verdict() -> None:
    """The opposite: the protocol fixture's own ``_settle`` over ``self._by_req`` is read, and safe."""
    assert _judge("").judge("Proto", cases=["single"]).judgements[0].verdict == "safe"


# -- a local alias of a self container bound anew ---------------------------------------------------------------------
REBOUND = """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    task = self.store.dump(meta.blocks)
    for req_id in meta.saving:
        tasks = self._by_req.setdefault(req_id, [])
        if req_id in meta.resumed:
            tasks = []
        tasks.append(task)
"""


def test_an_alias_of_a_self_container_bound_anew_is_not_read_as_keeping() -> None:
    """``ResumeAwareStoreConnector`` (``blind_container_aliases.py``) opens ``tasks = []`` for a resumed request
    after ``tasks = self._by_req.setdefault(...)``, so that dump is kept nowhere and never waited: **safe** with one
    group, truth unsafe. Now ``unknown``, its task among those kept out of the reader's sight."""
    judgement = _judge(REBOUND).judge("Proto", cases=["single"]).judgements[0]
    assert judgement.verdict == "unknown" and "bound anew on another" in judgement.reasons[0], judgement.reasons


def test_an_alias_bound_once_keeps_its_verdict() -> None:
    once = REBOUND.replace("        if req_id in meta.resumed:\n            tasks = []\n", "")
    assert "tasks = []" not in once
    assert _judge(once).judge("Proto", cases=["single"]).judgements[0].verdict == "safe"


# -- a wait made only when a task's requests have all finished ---------------------------------------------------------
SUBSET_WAIT = """
def _settle(self, req_ids):
    keep = []
    for record in self._pending:
        if record.req_ids <= set(req_ids):
            self.store.wait(record.task)
        elif not record.req_ids & set(req_ids):
            keep.append(record)
        else:
            keep.append(record._replace(req_ids=record.req_ids - set(req_ids)))
    self._pending = keep
"""

OVERLAP_WAIT = SUBSET_WAIT.replace("if record.req_ids <= set(req_ids):", "if record.req_ids & set(req_ids):")


def test_a_wait_under_a_subset_test_is_not_the_wait_of_every_finished_requests_task() -> None:
    """``DetachingRecordConnector`` (``blind_nested_records.py``) waits a batched record only when every request
    it serves is finished, narrowing it otherwise, and reports the finished one: **safe**, truth unsafe. Now the
    waiting helper is ``unknown``."""
    label = _labels(SUBSET_WAIT)["Proto.get_finished"]
    assert label.label == "unknown" and "a test of one set within another" in " ".join(label.reasons), label


def test_a_wait_of_every_overlapping_task_keeps_its_label() -> None:
    assert _labels(OVERLAP_WAIT)["Proto.get_finished"].label == "wait_finished"


# -- a save that waits some records and keeps others ------------------------------------------------------------------
WAIT_OR_KEEP = """
def _record(self, records):
    for record in records:
        if self._needs_sync(record):
            self.store.wait(record.task)
        else:
            self._pending.append(record)
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    self._record([Record(self.store.dump(meta.blocks), frozenset(meta.saving))])
"""


def test_a_save_waiting_on_one_side_and_keeping_on_the_other_is_not_blocking() -> None:
    """``RecordStoreConnector`` settles a record at once when it reads a sliding-window group and keeps it
    otherwise; read as a save that waits what it submits (``blocking``), nothing of it outlived the step in the
    model, hiding its subclass's report of a running shared dump. Now ``unknown``."""
    label = _labels(WAIT_OR_KEEP)["Proto.wait_for_save"]
    assert label.label == "unknown" and "waits on one side and keeps" in label.reasons[0], label


def test_a_save_waiting_on_both_sides_stays_blocking() -> None:
    both = WAIT_OR_KEEP.replace("            self._pending.append(record)", "            self.store.wait(record.task)")
    assert _labels(both)["Proto.wait_for_save"].label == "blocking"


def test_an_alias_whose_new_container_is_stored_in_the_same_assignment_keeps_its_verdict() -> None:
    """The other opposite (``RequestStateConnector`` of the corpus's ``blind_request_state.py``:
    ``state = self._states.get(r)``, then ``state = self._states[r] = ...`` when missing): every binding names a
    container the class keeps."""
    stored = REBOUND.replace("""        tasks = self._by_req.setdefault(req_id, [])
        if req_id in meta.resumed:
            tasks = []""", """        tasks = self._by_req.get(req_id)
        if tasks is None:
            tasks = self._by_req[req_id] = []""")
    assert "tasks = self._by_req[req_id] = []" in stored
    assert _judge(stored).judge("Proto", cases=["single"]).judgements[0].verdict == "safe"
