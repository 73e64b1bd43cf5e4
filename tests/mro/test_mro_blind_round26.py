"""The reading rules the twenty-sixth blind round called for (two helpers wrote 12 files: connectors doing
asynchronous loads beside deferred saves, and per-request state objects, futures and callbacks;
tests/fixtures/mro/corpus/blind_hbm_prefetch.py and its siblings are judged with TLC by the corpus test):

* **a ``_wait_pending_dump_task`` that releases nothing is not the PR's release-on-success mutant.**
  ``PrefetchDirectConnector`` keeps PR #989's helper name for a plain store wait (``try: store.wait(task)
  except RuntimeError: log``) and has no event handle at all. It was read as releasing its handle only after a
  successful wait, so a failed wait "leaked" it: **unsafe** (``NoEventLeakInv``), truth safe. Such a helper is now
  ``unknown`` (a class holding a handle per task and never releasing it is not the model's either).
* **a test of an attribute the class assigns from the rank is a rank test**, whatever the attribute is called.
  ``TieredCacheMLAConnector`` reports every id it still holds on MLA's other ranks (``if not self._is_writer:``,
  with ``self._is_writer = not use_mla or get_tensor_model_parallel_rank() == 0``): **safe** under MLA, truth unsafe
  (vLLM's aggregator counts one report per rank, so rank 1's repeated report frees the request early).
* **an addition to the tracking set made only under a test, beside work done either way, is not "track".**
  ``TieredCacheWarmStartConnector`` tracks a request only when ``spec.hold_blocks`` (False for requests loaded from
  the store) and emits its dump either way: **safe** with one group, as a child and under MLA, truth unsafe. A loop
  whose body only chooses which requests to track (PR #989's ``if meta.dump_block_ids[0]: add``) stays "track"."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_source
from deferdump.tools.mro.tla import ModelBounds

from test_mro_blind_round6 import HEADER, PROTOCOL


def _judge(hooks: str, prelude: str = "") -> Judge:
    source = PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(hooks), "    "))
    return Judge(build_hierarchy(read_source(HEADER + prelude + textwrap.dedent(source), "<t>")),
                 ModelRunner(ModelBounds(), 60))


def _labels(hooks: str, case: str = "single", prelude: str = "") -> dict[str, object]:
    return {f"{l.owner}.{l.method}": l for l in _judge(hooks, prelude)._labels("Proto", None, [], case)}  # noqa: SLF001


# -- the PR's helper name on a wait that releases nothing ------------------------------------------------------------
SETTLE_THROUGH_HELPER = """
def _settle(self, req_ids):
    for req_id in req_ids:
        for task in self._by_req.pop(req_id, []):
            self._wait_pending_dump_task(task)
"""

PLAIN_WAIT = SETTLE_THROUGH_HELPER + """
def _wait_pending_dump_task(self, task):
    try:
        self.store.wait(task)
    except RuntimeError:
        logger.exception("dump task failed")
"""


def test_a_helper_waiting_with_nothing_to_release_is_unknown_and_its_class_not_unsafe() -> None:
    label = _labels(PLAIN_WAIT)["Proto._wait_pending_dump_task"]
    assert label.label == "unknown" and "releases nothing after it" in label.reasons[0], label
    judgement = _judge(PLAIN_WAIT).judge("Proto", cases=["single"]).judgements[0]
    assert judgement.verdict != "unsafe", (judgement.verdict, judgement.violated)


def _wait_label(after_try: str, handler: str = 'logger.exception("dump task failed")\n        return'):
    """The label of a ``_wait_pending_dump_task`` waiting in a ``try`` with ``handler`` (or ``finally:`` when
    ``handler`` is None), followed by ``after_try``."""
    clause = "finally:\n        self.events.release(task.event)" if handler is None else f"except RuntimeError:\n        {handler}"
    return _labels(SETTLE_THROUGH_HELPER + f"""
def _wait_pending_dump_task(self, task):
    try:
        self.store.wait(task)
    {clause}
    {after_try}
""")["Proto._wait_pending_dump_task"]


def test_a_release_after_the_wait_only_is_the_release_on_success_mutant() -> None:
    """The opposite: a release the success path alone reaches leaks the handle of a failed wait (PR #989 releases
    it in ``finally``); in ``finally`` it is the PR's; in the handler as well, which path is not told apart."""
    on_success = _wait_label("self.events.release(task.event)")
    assert on_success.label == "release_on_success", on_success
    in_finally = _wait_label("pass", handler=None)
    assert in_finally.label == "release_finally", in_finally
    both = _wait_label("self.events.release(task.event)", handler="self.events.release(task.event)\n        raise")
    assert both.label == "unknown" and "except handler" in both.reasons[0], both


# -- rank flags under any name ---------------------------------------------------------------------------------------
RANK_FLAG = """
def _writer_flag(self):
    tp = get_tensor_model_parallel_rank()
    self._is_writer = not self._use_mla or tp == 0
def get_finished(self, finished_req_ids):
    if not self._is_writer:
        return set(self._async_dump_req_ids), None
    done = finished_req_ids & self._async_dump_req_ids
    self._settle(done)
    return done, None
"""


def test_a_test_of_an_attribute_assigned_from_the_rank_is_a_rank_test() -> None:
    label = _labels(RANK_FLAG, case="mla")["Proto.get_finished"]
    assert label.label == "unknown" and "`if not self._is_writer` decides return_value by the worker's rank" \
        in label.reasons[0], label
    assert _labels(RANK_FLAG, case="single")["Proto.get_finished"].label == "wait_finished"


def test_the_same_test_of_a_flag_not_assigned_from_the_rank_is_not() -> None:
    label = _labels(RANK_FLAG.replace("tp = get_tensor_model_parallel_rank()", "tp = self._config.mode"),
                    case="mla")["Proto.get_finished"]
    assert label.label == "wait_finished", label


# -- tracking under a test while the dump is emitted either way ------------------------------------------------------
GUARDED_TRACKING = """
def _plan(self, req_id, blocks):
    hold = self._should_hold(req_id)
    if hold:
        self._async_dump_req_ids.add(req_id)
    return {"req_id": req_id, "blocks": blocks}
def build_connector_meta(self, scheduler_output):
    return [self._plan(r, b) for r, b in scheduler_output.saving.items()]
"""


def test_tracking_only_under_a_test_beside_a_dump_emitted_either_way_is_unknown() -> None:
    label = _labels(GUARDED_TRACKING)["Proto.build_connector_meta"]
    assert label.label == "unknown" and "only under a test (Proto._plan line" in label.reasons[0] \
        and "`if hold`" in label.reasons[0], label


def test_a_loop_choosing_which_requests_to_track_and_a_test_of_the_set_itself_stay_track() -> None:
    """The opposites: PR #989's ``_track_async_dump_requests`` (the loop does nothing but choose), a test of the
    tracking set itself (``if r not in self._t``), and an unconditional addition beside a guarded one."""
    assert _labels("""
def build_connector_meta(self, scheduler_output):
    for req_id, meta in scheduler_output.requests.items():
        if meta.dump_block_ids[0]:
            self._async_dump_req_ids.add(req_id)
    return scheduler_output
""")["Proto.build_connector_meta"].label == "track"
    assert _labels("""
def build_connector_meta(self, scheduler_output):
    for req_id in scheduler_output.saving:
        if req_id not in self._async_dump_req_ids:
            self._async_dump_req_ids.add(req_id)
        self._emit(req_id)
    return scheduler_output
""")["Proto.build_connector_meta"].label == "track"
    assert _labels(GUARDED_TRACKING.replace("    return {", "    self._async_dump_req_ids.add(req_id)\n    return {"))[
        "Proto.build_connector_meta"].label == "track"


def test_guarded_tracking_leaves_the_case_undecided_where_it_was_safe() -> None:
    """With the PR's worker side, the class read as tracking every dump was safe; tracking under a test the reader
    cannot follow (``self._should_hold`` may answer False) leaves it unknown, never safe."""
    judgement = _judge(GUARDED_TRACKING).judge("Proto", cases=["single"]).judgements[0]
    assert judgement.verdict == "unknown", (judgement.verdict, judgement.reasons)


def test_a_rank_word_in_another_calls_argument_does_not_make_a_rank_attribute() -> None:
    """vLLM's ``SimpleCPUOffloadConnector`` builds its worker with ``cpu_capacity_per_rank``: a per-rank size, not
    the rank; ``if self.worker_handler is not None`` is a role test."""
    label = _labels(RANK_FLAG.replace("tp = get_tensor_model_parallel_rank()\n    self._is_writer = not self._use_mla or tp == 0",
                                      "cpu_capacity_per_rank = self._config.capacity\n    "
                                      "self._is_writer = Worker(self._config, cpu_capacity_per_rank)"),
                    case="mla")["Proto.get_finished"]
    assert label.label == "wait_finished", label


def test_a_choosing_loop_whose_other_branch_works_for_the_untracked_request_is_not_one() -> None:
    """``if hold: add(r) else: emit(r)`` is tracking under a test beside work done for the untracked request; a branch
    that dumps as it tracks (``self._t[r] = store.dump(...)``) shares its test with the dump (the eighteenth round's
    ``RemoteDecodeSender``)."""
    label = _labels("""
def build_connector_meta(self, scheduler_output):
    for req_id, blocks in scheduler_output.saving.items():
        if self._should_hold(req_id):
            self._async_dump_req_ids.add(req_id)
        else:
            self._emit(req_id, blocks)
    return scheduler_output
""")["Proto.build_connector_meta"]
    assert label.label == "unknown" and "only under a test" in label.reasons[0], label
    assert _labels("""
def wait_for_save(self):
    meta = self._get_connector_metadata()
    for req_id, spec in meta.saving.items():
        if spec.block_ids:
            self._async_dump_req_ids[req_id] = self.store.dump(spec.block_ids)
        else:
            self._done.add(req_id)
""")["Proto.wait_for_save"].label != "unknown"
