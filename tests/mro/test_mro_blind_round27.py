"""The reading rules the twenty-seventh blind round called for (two helpers wrote 12 files: deadlines, layer
countdowns, deduplicated prefix dumps, retries, load timeouts, counter-gated reports; pattern matching, module
registries, context managers, generators, properties and engine shells; tests/fixtures/mro/corpus/
blind_stats_gated.py and its siblings are judged with TLC by the corpus test):

* **a report gated by counters the waits credit is not a report before the wait.** ``CounterGatedDumpConnector``
  reports a finished request only when ``self._gate_open(r)`` (``self._completed[r] >= self._submitted[r]``), and
  ``_credit`` raises ``_completed`` only after ``store.wait`` (in the poll and the drain). Its ``get_finished``
  waits nothing, so it read as PR #989's report-before-wait mutant: **unsafe**, truth safe (three classes).
* **a dump deduplicated across requests is beyond the model.** ``HashScopedPrefixDumpConnector`` skips prompt
  blocks whose hash another request's task is already dumping (``key in self._inflight``) and records its own
  task there by hash; a request dropping its hashes drops the owner's entries too, so the owner's wait finds
  nothing. The model gives each request its own dumps: judged **safe** with one group, truth unsafe."""
from __future__ import annotations

from deferdump.tools.mro.behaviour import UNKNOWN

from test_mro_blind_round26 import _judge, _labels


# -- reports gated by counters the waits credit ----------------------------------------------------------------------
COUNTER_GATE = """
def wait_for_save(self):
    self._poll()
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    task = self.store.dump(meta.blocks)
    self._pending.append((task, frozenset(meta.saving)))
    for req_id in meta.saving:
        self._submitted[req_id] = self._submitted.get(req_id, 0) + 1
def _credit(self, req_ids):
    for req_id in req_ids:
        self._completed[req_id] = self._completed.get(req_id, 0) + 1
def _poll(self):
    still = []
    for task, req_ids in self._pending:
        if self.store.check(task):
            self.store.wait(task)
            self._credit(req_ids)
        else:
            still.append((task, req_ids))
    self._pending = still
def _gate_open(self, req_id):
    return self._completed.get(req_id, 0) >= self._submitted.get(req_id, 0)
def get_finished(self, finished_req_ids):
    done = {r for r in finished_req_ids & self._async_dump_req_ids if self._gate_open(r)}
    return done or None, None
"""


def test_a_report_gated_by_counters_credited_after_waits_is_unknown_and_its_class_not_unsafe() -> None:
    label = _labels(COUNTER_GATE)["Proto.get_finished"]
    assert label.label == UNKNOWN, label
    assert "self._gate_open() answers from self._completed" in label.reasons[0], label.reasons
    assert "_credit, which changes it, is called by Proto._poll, which waits store tasks" in label.reasons[0]
    judgement = _judge(COUNTER_GATE).judge("Proto", cases=["single"]).judgements[0]
    assert judgement.verdict != "unsafe", (judgement.verdict, judgement.violated)


def test_counters_credited_where_nothing_waits_leave_the_report_before_the_wait() -> None:
    """The opposite: credited at submission (nothing waits before the count moves), or read only from what the
    save writes, the gate says nothing about the dumps' end: PR #989's mutant, and TLC's counterexample stands."""
    unwaited = COUNTER_GATE.replace("            self.store.wait(task)\n", "")
    assert _labels(unwaited)["Proto.get_finished"].label == "report_before_wait"
    submitted_only = COUNTER_GATE.replace(
        "    return self._completed.get(req_id, 0) >= self._submitted.get(req_id, 0)\n",
        "    return self._submitted.get(req_id, 0) > 0\n")
    assert _labels(submitted_only)["Proto.get_finished"].label == "report_before_wait"
    assert _judge(submitted_only).judge("Proto", cases=["single"]).judgements[0].verdict == "unsafe"


# -- dumps deduplicated across requests ------------------------------------------------------------------------------
DEDUP = """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    for req_id, keys, blocks in meta.dumps:
        self._publish(req_id, keys, blocks)
def _in_flight(self, key):
    return key in self._inflight
def _publish(self, req_id, keys, blocks):
    keep = [i for i, key in enumerate(keys) if not self._in_flight(key)]
    if not keep:
        return
    task = self.store.dump([blocks[i] for i in keep])
    task_id = next(self._task_ids)
    self._by_req.setdefault(req_id, []).append(task)
    for i in keep:
        self._inflight[keys[i]] = InFlight(req_id, task_id)
"""


def test_a_dump_deduplicated_by_an_in_flight_table_is_beyond_the_model() -> None:
    label = _labels(DEDUP)["Proto.wait_for_save"]
    assert label.label != UNKNOWN and label.beyond_model, label
    assert "skips keys self._inflight already holds" in label.beyond_model[0], label.beyond_model
    assert "gives each request its own dumps" in label.beyond_model[0]
    judgement = _judge(DEDUP).judge("Proto", cases=["single"]).judgements[0]
    assert judgement.verdict == "unknown" and "deduplicated by key" in judgement.reasons[0], judgement


def test_a_table_written_by_key_without_the_skip_or_asked_without_the_write_is_no_deduplication() -> None:
    """The opposites: the save records its task by key but never asks the table first (every request dumps its
    own blocks), or asks a table it never writes after the submit (a filter on configuration): nothing shared."""
    def shared(hooks: str) -> list[str]:
        return [why for why in _labels(hooks)["Proto.wait_for_save"].beyond_model if "skips keys" in why]

    unasked = DEDUP.replace(" if not self._in_flight(key)", "")
    assert not shared(unasked)
    elsewhere = DEDUP.replace("        self._inflight[keys[i]] = InFlight(req_id, task_id)\n",
                              "        self._by_key[keys[i]] = InFlight(req_id, task_id)\n")
    assert "self._inflight[" not in elsewhere.split("def _publish")[1]
    assert not shared(elsewhere)
