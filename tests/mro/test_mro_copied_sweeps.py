"""Tasks the report path ends through a copy of their table and leaves in it (tools/mro/copied_sweeps.py, facts
``copied_sweeps`` from tools/mro/task_holders.py). The twenty-ninth blind round's ``StagedRequestMapStoreConnector``
waits and releases ``list(self._by_req.get(r, ()))`` in ``get_finished`` and clears the copy; its ``_reap`` then
releases the same handles again: judged **safe** with one group and as a child, where it releases twice. A pass now
proves nothing; the opposites (the entries popped from the table, or deleted after the copy) keep their verdicts."""
from __future__ import annotations

from test_mro_blind_round26 import _judge

#: get_finished waits a copy of each request's tasks and clears the copy; shutdown drains the table again.
THROUGH_A_COPY = """
def get_finished(self, finished_req_ids):
    done = finished_req_ids & self._async_dump_req_ids
    for req_id in done:
        tasks = list(self._by_req.get(req_id, ()))
        for task in tasks:
            self.store.wait(task)
        tasks.clear()
    return done, None
def shutdown(self):
    for tasks in self._by_req.values():
        for task in tasks:
            self.store.wait(task)
"""

#: The opposite: the request's tasks taken out of the table.
POPPED = THROUGH_A_COPY.replace("tasks = list(self._by_req.get(req_id, ()))", "tasks = self._by_req.pop(req_id, [])")

#: The opposite: the copy waited, then the table's entry deleted.
DELETED_AFTER = THROUGH_A_COPY.replace("        tasks.clear()\n", "        del self._by_req[req_id]\n")


def _single(hooks: str) -> tuple[str, tuple[str, ...]]:
    judgement = _judge(hooks).judge("Proto", cases=["single"]).judgements[0]
    return judgement.verdict, judgement.reasons


def test_tasks_ended_through_a_copy_and_left_in_the_table_make_a_pass_prove_nothing() -> None:
    verdict, reasons = _single(THROUGH_A_COPY)
    assert verdict == "unknown", (verdict, reasons)
    assert any("ends the entries of a copy of self._by_req" in r and "Proto.shutdown visits again" in r
               for r in reasons), reasons


def test_tasks_taken_out_of_the_table_keep_the_verdict() -> None:
    assert _single(POPPED) == ("safe", ())


def test_a_copy_whose_entries_are_deleted_from_the_table_keeps_the_verdict() -> None:
    verdict, reasons = _single(DELETED_AFTER)
    assert not any("a copy of self._by_req" in r for r in reasons), reasons
    assert verdict == "safe", reasons
