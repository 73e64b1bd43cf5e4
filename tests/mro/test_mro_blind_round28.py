"""The reading rules the twenty-eighth blind round called for (two helpers wrote 12 files: speculative decoding,
worker-metadata acknowledgements, KV-sharing layers, local prefix hits, events and resets, chunked-prefill plans;
an event per request, drain threads and queues, locked snapshots and double buffers, an asyncio loop in a thread,
``as_completed`` batches, semaphore budgets; tests/fixtures/mro/corpus/blind_event_per_request.py and its siblings
are judged with TLC by the corpus test):

* **a report gated by futures or events is not a report before the wait.** ``AsyncioLoopDumpConnector`` reports a
  finished request when ``all(f.done() for f in self._inflight[r])``, each future a coroutine awaiting
  ``store.wait`` in an executor; ``EventTrackedDumpConnector`` when its event ``is_set()``, set by a completion
  thread after its wait. Neither ``get_finished`` waits, so both read as PR #989's report-before-wait mutant:
  **unsafe**, truth safe (four classes).
* **a save whose waits are of other tasks is not synchronous.** ``DoubleBufferedDumpConnector`` waits out the
  buffer filled two steps ago, then submits this step's dump through a helper and appends it to that buffer;
  ``FuturesBatchDumpConnector`` hands ``store.wait`` to a thread pool and calls ``concurrent.futures.wait``. Both
  ``wait_for_save`` read as a blocking save, so their subclasses that lose a task (``ParityBufferedDumpConnector``
  waits only one buffer on preemption; ``CancellingFuturesDumpConnector`` cancels a queued wait) were **safe**
  with one group, truth unsafe.
* **a helper whose whole body tracks under a test is no choosing loop.** ``PromptCompleteDelayConnector`` delays
  a request only when its last prompt chunk is planned (``_register_chunk``), every chunk dumped: **safe** with one
  group, truth unsafe (an abort mid-prompt frees blocks a chunk's dump reads).
* **a set kept on a state object is not "no tracking".** ``LifecycleDumpConnector`` tracks in
  ``self._state.delayed``: read "tracks nothing", its hybrid case was **unsafe** by a report of a request it never
  delays, a run the class never makes (it is unsafe there, by the overwrite)."""
from __future__ import annotations

from deferdump.tools.mro.behaviour import GUARDED_TRACKING, UNKNOWN

from test_mro_blind_round26 import _judge, _labels


# -- reports gated by futures and events -----------------------------------------------------------------------------
FUTURES = """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    task = self.store.dump(meta.blocks)
    future = self._pool.submit(self._await_dump, task)
    for req_id in meta.saving:
        self._by_req.setdefault(req_id, []).append(future)
def get_finished(self, finished_req_ids):
    done = {r for r in finished_req_ids & self._async_dump_req_ids
            if all(f.done() for f in self._by_req.get(r, ()))}
    return done or None, None
"""

EVENTS = """
def _idle(self, req_id):
    entry = self._events.get(req_id)
    return entry is None or entry.is_set()
def get_finished(self, finished_req_ids):
    done = {r for r in finished_req_ids & self._async_dump_req_ids if self._idle(r)}
    return done or None, None
"""


def test_a_report_gated_by_futures_or_events_being_done_is_unknown_and_its_class_not_unsafe() -> None:
    for hooks, call in ((FUTURES, "done()"), (EVENTS, "is_set()")):
        label = _labels(hooks)["Proto.get_finished"]
        assert label.label == UNKNOWN and f"are done ({call})" in label.reasons[0], label
        judgement = _judge(hooks).judge("Proto", cases=["single"]).judgements[0]
        assert judgement.verdict != "unsafe", (call, judgement.verdict, judgement.violated)


def test_a_report_asking_nothing_stays_the_report_before_the_wait() -> None:
    """The opposite: the same report without the question is PR #989's mutant, and TLC's counterexample stands."""
    plain = EVENTS.replace(" if self._idle(r)", "")
    assert _labels(plain)["Proto.get_finished"].label == "report_before_wait"
    assert _judge(plain).judge("Proto", cases=["single"]).judgements[0].verdict == "unsafe"


# -- saves whose waits are of other tasks ----------------------------------------------------------------------------
DOUBLE_BUFFER = """
def _submit_step(self, meta):
    task = self.store.dump(meta.blocks)
    return Record(task, frozenset(meta.saving))
def _drain(self, buf):
    for record in buf:
        self.store.wait(record.task)
    buf[:] = []
def wait_for_save(self):
    self._step += 1
    buf = self._buffers[self._step & 1]
    self._drain(buf)
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    buf.append(self._submit_step(meta))
"""


def test_a_save_waiting_older_tasks_before_its_own_submit_is_not_blocking() -> None:
    label = _labels(DOUBLE_BUFFER)["Proto.wait_for_save"]
    assert label.label == UNKNOWN and "every wait comes before its first submit" in label.reasons[0], label
    judgement = _judge(DOUBLE_BUFFER).judge("Proto", cases=["single"]).judgements[0]
    assert judgement.verdict != "safe", judgement


def test_a_save_waiting_the_task_it_submits_stays_blocking() -> None:
    """The opposites: the dump submitted and then waited in the same call, or kept and then drained with the rest of
    its table after the submit (eighth blind round's ``SWITCHED`` shape), is a synchronous save."""
    own = """
    def wait_for_save(self):
        meta = self._get_connector_metadata()
        self._async_dump_req_ids.update(meta.saving)
        task = self.store.dump(meta.blocks)
        self.store.wait(task)
    """
    assert _labels(own)["Proto.wait_for_save"].label == "blocking"
    drained_after = DOUBLE_BUFFER.replace("    self._drain(buf)\n", "").replace(
        "    buf.append(self._submit_step(meta))\n", "    buf.append(self._submit_step(meta))\n    self._drain(buf)\n")
    assert drained_after.index("buf.append") < drained_after.rindex("self._drain(buf)")
    assert _labels(drained_after)["Proto.wait_for_save"].label == "blocking"


# -- a helper whose whole body tracks under a test -------------------------------------------------------------------
HELPER_GUARD = """
def _register(self, req_id, last_chunk):
    if last_chunk:
        self._async_dump_req_ids.add(req_id)
def build_connector_meta(self, scheduler_output):
    for req_id, last_chunk in scheduler_output.chunks:
        self._register(req_id, last_chunk)
    return scheduler_output
"""


def test_a_helper_tracking_only_under_a_test_makes_the_schedule_side_unknown() -> None:
    """``PromptCompleteDelayConnector`` (``_register_chunk``: ``if plan.last_chunk: self._delayed.add(...)``) delays only
    requests whose last chunk was planned, while every chunk is dumped: an abort mid-prompt frees blocks a dump reads.
    A helper's body ending at the test leaves the rest to its caller, so it is no choosing loop."""
    label = _labels(HELPER_GUARD)["Proto.build_connector_meta"]
    assert label.label == UNKNOWN and "only under a test" in label.reasons[0] and "`if last_chunk`" in label.reasons[0]


def test_a_choosing_loop_in_a_helper_or_an_unconditional_helper_stays_track() -> None:
    """The opposites: the helper's loop only chooses which requests to track (PR #989's loop, moved into a helper),
    or the helper tracks every request it is given."""
    looping = """
    def _register(self, chunks):
        for req_id, last_chunk in chunks:
            if last_chunk:
                self._async_dump_req_ids.add(req_id)
    def build_connector_meta(self, scheduler_output):
        self._register(scheduler_output.chunks)
        return scheduler_output
    """
    assert _labels(looping)["Proto.build_connector_meta"].label == "track"
    plain = HELPER_GUARD.replace("    if last_chunk:\n        self._async_dump_req_ids.add(req_id)\n",
                                 "    self._async_dump_req_ids.add(req_id)\n")
    assert "if last_chunk" not in plain
    assert _labels(plain)["Proto.build_connector_meta"].label == "track"


# -- a tracking set kept on a state object ---------------------------------------------------------------------------
STATE_OBJECT = """
def build_connector_meta(self, scheduler_output):
    for req_id in scheduler_output.saving:
        self._state.delayed.add(req_id)
    return scheduler_output
def request_finished(self, request, block_ids):
    if request.request_id not in self._state.delayed:
        return False, None
    self._state.delayed.discard(request.request_id)
    return True, None
"""


def test_a_schedule_side_adding_to_a_set_of_a_state_object_is_not_read_as_tracking_nothing() -> None:
    """``LifecycleDumpConnector`` keeps its delayed requests in ``self._state.delayed``: read "tracks nothing", its
    hybrid case was unsafe by a report of a request it never delays, a run the class never makes."""
    label = _labels(STATE_OBJECT)["Proto.build_connector_meta"]
    assert label.label == UNKNOWN and "self._state.delayed.add()" in label.reasons[0], label
    judgement = _judge(STATE_OBJECT).judge("Proto", cases=["single"]).judgements[0]
    assert judgement.verdict != "unsafe", (judgement.verdict, judgement.violated)


def test_a_schedule_side_adding_nothing_anywhere_still_tracks_nothing() -> None:
    """The opposite: a ``build_connector_meta`` that only reads the state object is "notrack" as before."""
    reading = STATE_OBJECT.replace("        self._state.delayed.add(req_id)\n", "        self._state.delayed.copy()\n")
    assert _labels(reading)["Proto.build_connector_meta"].label == "notrack"


# -- background dumps of requests a save leaves untracked (the open case BackfillDumpConnector) ----------------------
BACKFILL = """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    for plan in meta.plans:
        tracked = plan.kind == "dump"
        if tracked:
            self._async_dump_req_ids.add(plan.req_id)
        task = self.store.dump(plan.block_ids)
        if tracked:
            self._by_req.setdefault(plan.req_id, []).append(task)
        else:
            self._pending.append(task)
"""

TRACK_EVERY_DUMP = """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    for plan in meta.plans:
        self._async_dump_req_ids.add(plan.req_id)
        task = self.store.dump(plan.block_ids)
        self._by_req.setdefault(plan.req_id, []).append(task)
"""


def test_a_save_tracking_only_some_requests_it_dumps_is_never_judged_safe() -> None:
    """``BackfillDumpConnector`` (this round's ``blind_local_hit_skip.py``) also dumps locally hit blocks for
    requests it neither tracks nor waits. The model's worst reading of its ``wait_for_save`` (``poll_track_submit``)
    tracks every request it dumps, and passed: **safe** with one group, as a child and under MLA, truth unsafe (the
    case was recorded open). A pass of that reading proves nothing now: ``unknown``, with the reason."""
    label = _labels(BACKFILL)["Proto.wait_for_save"]
    assert label.label == UNKNOWN and GUARDED_TRACKING in label.reasons[0], label
    for case in ("single", "mla"):
        judgement = _judge(BACKFILL).judge("Proto", cases=[case]).judgements[0]
        assert judgement.verdict == "unknown", (case, judgement.verdict, judgement.violated)
        assert any(GUARDED_TRACKING in reason for reason in judgement.reasons), judgement.reasons


def test_a_save_tracking_every_request_it_dumps_stays_safe() -> None:
    """The opposite: the same save tracking each request it dumps is PR #989's, and safe with one group."""
    assert _labels(TRACK_EVERY_DUMP)["Proto.wait_for_save"].label == "poll_track_submit"
    assert _judge(TRACK_EVERY_DUMP).judge("Proto", cases=["single"]).judgements[0].verdict == "safe"


# -- tasks keyed by a KV-cache tensor's identity (the open case PtrKeyedLayerwiseConnector) --------------------------
PER_TENSOR = """
def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
    meta = self._get_connector_metadata()
    task = self.store.dump(meta.blocks, layer=layer_name)
    self._on_submitted(LayerTask(task, frozenset(meta.saving), layer_name, kv_layer.data_ptr()))
def _on_submitted(self, record):
    self._step_tasks[record.tensor] = record
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    self._pending.extend(self._step_tasks.values())
    self._step_tasks.clear()
def _settle(self, req_ids):
    kept = []
    for record in self._pending:
        if record.req_ids & set(req_ids):
            self.store.wait(record.task)
        else:
            kept.append(record)
    self._pending = kept
"""

#: The task record of PER_TENSOR (module-level, before the class).
LAYER_TASK = """
import dataclasses


@dataclasses.dataclass
class LayerTask:
    task: object
    req_ids: frozenset
    layer: str
    tensor: int
"""


def test_a_save_keyed_by_the_tensor_it_reads_is_unknown_with_two_layers() -> None:
    """``PtrKeyedLayerwiseConnector`` (``blind_kv_sharing_layers.py``) keeps one task per KV-cache tensor
    (``data_ptr()``): two layers sharing a cache (``kv_sharing_target_layer_name``) share the key, and the second
    layer's task replaces the first's, which nothing waits. With two layers of their own the model passed: **safe**,
    truth unsafe (recorded open). A save path asking a tensor's identity is now ``unknown`` in the two-layer case;
    the one-group case, where there is one layer, keeps its verdict."""
    judge = _judge(PER_TENSOR, prelude=LAYER_TASK)
    layerwise = judge.judge("Proto", cases=["layerwise"]).judgements[0]
    assert layerwise.verdict == "unknown" and "data_ptr()" in layerwise.reasons[0], layerwise.reasons
    assert judge.judge("Proto", cases=["single"]).judgements[0].verdict == "safe"


def test_a_save_keyed_by_layer_name_keeps_its_two_layer_verdict() -> None:
    """The opposite: the same table keyed by the layer's name (distinct for layers sharing a cache) is safe."""
    by_name = PER_TENSOR.replace(", kv_layer.data_ptr()))", ", 0))").replace("[record.tensor]", "[record.layer]")
    assert "data_ptr" not in by_name
    assert _judge(by_name, prelude=LAYER_TASK).judge("Proto", cases=["layerwise"]).judgements[0].verdict == "safe"
