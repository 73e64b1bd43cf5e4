"""Store tasks a save records on a copy it keeps to itself (tools/mro/unreached_tasks.py ``copied_task_records``,
facts ``copy_records`` and ``param_fills`` from tools/mro/task_holders.py). The twenty-ninth blind round's
``IsolatedScopedRecordConnector`` records its tasks on ``dataclasses.replace(meta, records=[])``, through a helper that
puts its second argument into its first's fields, while ``clear_connector_metadata`` settles the original's list: no
dump is ever waited, and it was judged **safe** with one group and as a child. A pass now proves nothing; the
opposites (the copy kept on ``self``, records on the bound metadata itself) are left to the other rules."""
from __future__ import annotations

import pytest

from test_mro_blind_round26 import _judge

#: The copy filled in place.
DIRECT = """
def wait_for_save(self):
    shared = self._get_connector_metadata()
    meta = dataclasses.replace(shared, records=[])
    self._async_dump_req_ids.update(meta.saving)
    task = self.store.dump(meta.blocks)
    meta.records.append(task)
"""

#: The copy filled by a helper that puts its second argument into its first's fields.
THROUGH_A_HELPER = """
def _note(self, meta, task):
    meta.records.append(task)
def wait_for_save(self):
    meta = copy.copy(self._get_connector_metadata())
    self._async_dump_req_ids.update(meta.saving)
    self._note(meta, self.store.dump(meta.blocks))
"""

#: The opposite: the copy kept on ``self`` (it outlives the call).
KEPT_COPY = DIRECT + "    self._last_meta = meta\n"

#: The opposite: the records go on the bound metadata itself.
ON_THE_METADATA = DIRECT.replace("    meta = dataclasses.replace(shared, records=[])\n", "    meta = shared\n")


def _single(hooks: str) -> tuple[str, tuple[str, ...]]:
    judgement = _judge(hooks).judge("Proto", cases=["single"]).judgements[0]
    return judgement.verdict, judgement.reasons


@pytest.mark.parametrize("hooks", [DIRECT, THROUGH_A_HELPER], ids=["direct", "helper"])
def test_tasks_recorded_on_a_copy_the_save_keeps_to_itself_make_a_pass_prove_nothing(hooks: str) -> None:
    verdict, reasons = _single(hooks)
    assert verdict == "unknown", (verdict, reasons)
    assert any("records store tasks on meta, a copy it keeps to itself" in r for r in reasons), reasons


@pytest.mark.parametrize("hooks", [KEPT_COPY, ON_THE_METADATA], ids=["kept-on-self", "the-metadata"])
def test_a_copy_that_outlives_the_call_or_no_copy_is_left_to_the_other_rules(hooks: str) -> None:
    _, reasons = _single(hooks)
    assert not any("a copy it keeps to itself" in r for r in reasons), reasons
