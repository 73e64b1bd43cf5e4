"""Store submits whose task the save path drops (tools/mro/task_holders.py ``dropped_submits``, counted with the
reader's lost tasks). A dump whose task is a statement of its own (``self.store.dump(ids)``), or is bound only to
names nothing reads, is waited by nothing: a store's wait takes the task the submit returned. Such a save was judged
**safe** with one group (its label is the protocol's, whose tasks the model keeps and waits); a pass now proves
nothing. The opposites (the task kept where the report waits, a serializer's ``json.dump``, a task a nested function
reads) keep their verdicts."""
from __future__ import annotations

import pytest

from test_mro_blind_round26 import _judge

#: The protocol's wait_for_save, plus a second dump per step whose task is never kept.
FIRE_AND_FORGET = """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    task = self.store.dump(meta.blocks)
    for req_id in meta.saving:
        self._by_req.setdefault(req_id, []).append(task)
    self.store.dump(meta.extra_blocks)
"""

#: The same dump bound to a local nothing reads.
UNREAD_LOCAL = FIRE_AND_FORGET.replace("    self.store.dump(meta.extra_blocks)",
                                       "    extra = self.store.dump(meta.extra_blocks)")

#: The opposite: the second task kept under each request too, where get_finished and handle_preemptions wait.
KEPT = UNREAD_LOCAL + """    for req_id in meta.saving:
        self._by_req[req_id].append(extra)
"""

#: The opposite: a serializer's dump beside the protocol's save (no store task).
SERIALIZED = FIRE_AND_FORGET.replace("    self.store.dump(meta.extra_blocks)",
                                     "    json.dump(meta.saving, self._log)")

#: The opposite: a nested function reads the task (a callback that waits it): it is not dropped here.
CLOSURE = UNREAD_LOCAL + """    def settle():
        self.store.wait(extra)
    self._callbacks.append(settle)
"""


def _single(hooks: str) -> tuple[str, tuple[str, ...]]:
    judgement = _judge(hooks).judge("Proto", cases=["single"]).judgements[0]
    return judgement.verdict, judgement.reasons


@pytest.mark.parametrize("hooks", [FIRE_AND_FORGET, UNREAD_LOCAL], ids=["statement", "unread-local"])
def test_a_dump_whose_task_is_dropped_makes_a_pass_prove_nothing(hooks: str) -> None:
    verdict, reasons = _single(hooks)
    assert verdict == "unknown", (verdict, reasons)
    assert any("self.store.dump(...) returns is dropped" in r for r in reasons), reasons


def test_the_same_task_kept_where_the_report_waits_keeps_the_verdict() -> None:
    assert _single(KEPT)[0] == "safe"


def test_a_serializers_dump_is_no_store_task() -> None:
    verdict, reasons = _single(SERIALIZED)
    assert not any("dropped" in r for r in reasons), reasons
    assert verdict == "safe"


def test_a_task_a_nested_function_reads_is_not_dropped() -> None:
    verdict, reasons = _single(CLOSURE)
    assert not any("returns is dropped" in r for r in reasons), (verdict, reasons)
