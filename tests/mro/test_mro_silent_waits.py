"""A ``get_finished`` that waits store tasks and reports nothing (DeferredTrackerStore, a blind round's): its finish
answers False, it waits every finished request's dumps, and returns ``(None, None)``. The reader took the constant
for the base's ``get_finished`` (waits nothing), so, once its other definitions were decided (a record-table reading
tried in the forty-third session), the model found an overwrite as a MultiConnector child, where the class is safe
(its waits come before the sibling's report frees the blocks). Now the definition is ``unknown``, and no benign reading (each reports what it waits) may make
the class unsafe as a child, or by a violation other than an overwrite. The opposite, a constant with no wait, is
still the base's."""
from __future__ import annotations

from pathlib import Path

from deferdump.tools.mro.behaviour import SILENT_WAITS
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds

TRACKER = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_request_tracker.py"


def _judge(path: Path = TRACKER) -> Judge:
    return Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 60))


def test_a_get_finished_waiting_and_reporting_nothing_is_not_the_base() -> None:
    judge = _judge()
    label = judge.reader.label("DeferredTrackerStore", "DeferredTrackerStore", "get_finished")
    assert label.label == "unknown" and SILENT_WAITS in label.reasons[0], label


def test_a_constant_report_with_no_wait_is_still_the_base(tmp_path: Path) -> None:
    text = TRACKER.read_text(encoding="utf-8")
    waits = """        for req_id in finished_req_ids:
            self._wait_tasks(req_id)
        for req_id, tasks in list(self._inflight.items()):"""
    assert waits in text
    path = tmp_path / TRACKER.name
    path.write_text(text.replace(waits, "        for req_id, tasks in list(self._inflight.items()):", 1),
                    encoding="utf-8")
    label = _judge(path).reader.label("DeferredTrackerStore", "DeferredTrackerStore", "get_finished")
    assert label.label == "base", label


def test_as_a_child_the_silent_waits_keep_the_class_from_unsafe() -> None:
    """Keyed safe as a MultiConnector child: was unsafe (NoUnexpectedReportInv, then an overwrite) by readings
    that report."""
    judgement = _judge().judge("DeferredTrackerStore", cases=["multi"]).judgements[0]
    assert judgement.verdict == "unknown", (judgement.verdict, judgement.reasons)
    assert any(SILENT_WAITS in r for r in judgement.reasons), judgement.reasons


def test_with_one_group_a_silent_wait_of_every_task_is_no_counterexample(tmp_path: Path) -> None:
    """The benign readings wait only the finished tracked requests' tasks. A class whose ``get_finished`` waits every
    pending task each step (and reports nothing) ends each step's dumps before the scheduler frees anything: safe with
    one group, never ``unsafe`` by a reading that waits less."""
    text = TRACKER.read_text(encoding="utf-8")
    report = """        for req_id in finished_req_ids:
            self._wait_tasks(req_id)
        for req_id, tasks in list(self._inflight.items()):
            tasks[:] = [t for t in tasks if not self._store.check(t)]
            if not tasks:
                del self._inflight[req_id]
        return None, None"""
    assert report in text
    path = tmp_path / TRACKER.name
    path.write_text(text.replace(report, """        for req_id in list(self._inflight):
            self._wait_tasks(req_id)
        return None, None""", 1), encoding="utf-8")
    judgement = _judge(path).judge("DeferredTrackerStore", cases=["single"]).judgements[0]
    assert judgement.verdict == "unknown", (judgement.verdict, judgement.reasons)
