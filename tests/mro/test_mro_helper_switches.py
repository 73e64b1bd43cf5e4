"""A preemption wait whose helper chooses between every task it holds and the preempted requests' ones. The eighth
blind round's rule (a ``handle_preemptions`` choosing what it waits by a test, between ``self`` state and what it is
given, is ``unknown``: one side is a flush, on a hybrid model a fence) read only the method's own body.
``PlanSplitConnector`` (blind_split_plan_frozen.py, keyed safe) puts the choice in a helper,
``targets = list(self._tasks) if plan.fence_all else list(plan.preempted)`` in ``_fence``, with ``fence_all`` set on
a sliding-window model: read as a plain preemption wait, the hybrid case would find an overwrite the fence prevents
(a record-table reading tried in the forty-fourth session gave exactly that). Now the helpers it reaches count; a
helper that waits the preempted requests only keeps the label."""
from __future__ import annotations

from pathlib import Path

from support.mro import edited_label

PLAN = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_split_plan_frozen.py"
SWITCH = "        targets = list(self._tasks) if plan.fence_all else list(plan.preempted)"


def _label(tmp_path: Path, edited: str = SWITCH) -> tuple[str, tuple[str, ...]]:
    return edited_label(tmp_path, PLAN, (SWITCH, edited), "PlanSplitConnector", "PlanSplitConnector", "handle_preemptions")


def test_a_switch_in_the_fence_helper_is_read(tmp_path: Path) -> None:
    label, reasons = _label(tmp_path)
    assert label == "unknown" and "`plan.fence_all` (PlanSplitConnector._fence)" in reasons[0], (label, reasons)


def test_a_helper_waiting_the_preempted_requests_only_keeps_the_label(tmp_path: Path) -> None:
    assert _label(tmp_path, "        targets = list(plan.preempted)")[0] == "wait_preempted"
