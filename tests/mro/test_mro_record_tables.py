"""A per-request record table as the worker's tracking set, and a report filled in the loop that waits.

The thirtieth blind round's ``FullAttentionDumpConnector`` keeps its worker side in ``self._records``: ``wait_for_save``
puts each dump's task in ``self._records.setdefault(req_id, _DumpRecord()).tasks``, ``get_finished`` pops each
finished request's record, skips ids without one (``if rec is None: continue``), waits its tasks through a helper and
adds the id to the set it returns (``sending.add(req_id)``). The reader took neither ``setdefault`` for a write nor
the tested pop for a consultation, and followed the returned set only through assignments: three ``unknown``s. The
opposites keep them: a pop nothing tests, and a report filled by a loop other than the one that waits (the same loop
variable's name reused)."""
from __future__ import annotations

import tempfile
from pathlib import Path

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds

ROUND30 = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_victim_selection.py"
CLASS = "FullAttentionDumpConnector"

#: The round's report: the loop that waits a finished request's record reports that request.
REPORT = """        for req_id in finished_req_ids:
            rec = self._records.pop(req_id, None)
            if rec is None:
                continue
            try:
                self._settle(req_id, rec)
            finally:
                sending.add(req_id)
"""


def _labels(replace: tuple[str, str] | None = None) -> dict[str, str]:
    text = ROUND30.read_text(encoding="utf-8")
    assert REPORT in text
    if replace is not None:
        assert replace[0] in text
        text = text.replace(*replace, 1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / ROUND30.name
        path.write_text(text, encoding="utf-8")
        judge = Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 60))
        return {l.method: l.label for l in judge._labels(CLASS, None, [], "single")  # noqa: SLF001
                if l.owner == CLASS}


def test_a_record_table_is_the_workers_tracking_set() -> None:
    labels = _labels()
    assert labels["wait_for_save"] == "poll_track_submit", labels  # tracks the step's dump ids, submits, no wait
    assert labels["get_finished"] == "wait_finished", labels  # waits the finished tracked requests' tasks, reports
    assert labels["handle_preemptions"] == "wait_preempted", labels


def test_a_pop_nothing_tests_consults_nothing() -> None:
    """Every finished id reported whether or not it had a record: the table decides nothing."""
    labels = _labels((REPORT, REPORT.replace("""            if rec is None:
                continue
""", "").replace("rec = self._records.pop(req_id, None)", "rec = self._records.pop(req_id, None) or _DumpRecord()")))
    assert labels["wait_for_save"] == "unknown", labels


def test_a_report_filled_by_another_loop_selects_no_wait() -> None:
    """Every finished id reported by a first loop; a second loop, its variable of the same name, waits one record:
    the names match, the loops do not."""
    other = """        for req_id in finished_req_ids:
            if self._records.get(req_id) is not None:
                sending.add(req_id)
        for req_id, rec in list(self._records.items())[:1]:
            self._settle(req_id, rec)
            self._records.pop(req_id, None)
"""
    labels = _labels((REPORT, other))
    assert labels["get_finished"] == "unknown", labels


def test_a_report_that_starts_full_or_outlives_a_swallowed_failure_selects_no_wait() -> None:
    """Two more opposites: the returned set starts with ids nothing here waits (``sending = set(self._late)``),
    and the wait sits in a ``try`` whose ``except`` swallows its failure before the ``finally`` reports."""
    starts_full = REPORT.replace("        for req_id in finished_req_ids:\n",
                                 "        sending = set(self._late)\n        for req_id in finished_req_ids:\n", 1)
    assert _labels((REPORT, starts_full))["get_finished"] == "unknown"
    swallowed = REPORT.replace("""                self._settle(req_id, rec)
            finally:""", """                self._settle(req_id, rec)
            except Exception:
                logger.exception("settle failed")
            finally:""")
    assert _labels((REPORT, swallowed))["get_finished"] == "unknown"


def test_a_report_after_a_helper_that_waits_nothing_selects_no_wait() -> None:
    """ExpiringDumpConnector (a blind round's, keyed unsafe): ``if deadline ... and self._on_deadline(req_id, now):
    done.add(req_id)``, where its ``_on_deadline`` drops the request's tasks unwaited. Read through the fill rule
    without resolving the helper, its report counted as waited and the class passed with one group."""
    path = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_abort_deadlines.py"
    judge = Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 60))
    label = judge.reader.label("ExpiringDumpConnector", "DeadlineDumpConnector", "get_finished")
    assert label.label == "unknown", label
