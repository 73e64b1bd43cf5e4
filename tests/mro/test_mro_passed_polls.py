"""A store's poll passed as a value (``all(map(self._store.check, rec.tasks))``) is a poll. ``SlottedRecordConnector``
(blind_weak_and_slots.py) reports a finished request once every one of its tasks checks done; the reader saw no
``check()`` call and read a report before any wait (``report_before_wait``): given a tracking set it reads, the model
would have reported requests whose dumps still run, a counterexample the class never makes (a record-table reading
tried in the forty-fourth session made it **unsafe** that way, keyed safe with one group). Now the poll counts as
called, and the ``get_finished`` is ``unknown`` as any report gated by polling is; without the poll the label stays."""
from __future__ import annotations

from pathlib import Path

from support.mro import edited_label

SLOTS = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_weak_and_slots.py"
POLL = "if rec.finishing and all(map(self._store.check, rec.tasks))"


def _label(tmp_path: Path, edited: str = POLL) -> tuple[str, tuple[str, ...]]:
    return edited_label(tmp_path, SLOTS, (POLL, edited), "SlottedRecordConnector", "SlottedRecordConnector",
                        "get_finished")


def test_a_poll_passed_to_map_is_a_poll(tmp_path: Path) -> None:
    label, reasons = _label(tmp_path)
    assert label == "unknown" and "polls store tasks (check())" in reasons[0], (label, reasons)


def test_without_the_poll_the_report_comes_before_any_wait(tmp_path: Path) -> None:
    assert _label(tmp_path, "if rec.finishing")[0] == "report_before_wait"


def test_a_method_of_self_passed_as_a_value_is_not_the_stores_poll(tmp_path: Path) -> None:
    """``map(self.check, ...)`` is the connector's own method (followed, or not, as a helper), not the store's."""
    assert _label(tmp_path, "if rec.finishing and all(map(self.check, rec.tasks))")[0] == "report_before_wait"
