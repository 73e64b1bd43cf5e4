"""Store tasks a save keeps where neither the report nor the preemption path looks (tools/mro/unreached_tasks.py,
facts from tools/mro/task_holders.py). The twenty-ninth blind round's ``DetachedBackfillConnector`` puts the task a
helper returns (``task = self._launch(order)``) into ``self._background``, reaped only by ``check``, for requests the
scheduler does not delay: judged **safe** with one group, as a child and under MLA. A pass proves nothing for such a
class; the opposites (the same helper's task kept where ``get_finished`` waits, a step's tasks waited in a loop
through a waiting helper) keep their verdicts."""
from __future__ import annotations

from test_mro_blind_round26 import _judge

#: The protocol's dumps (the fixture's wait_for_save), plus background dumps a helper returns, kept in a list that
#: is only polled (the per-layer save submits them).
DETACHED = """
def _launch(self, blocks):
    task = self.store.dump(blocks)
    return task
def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
    meta = self._get_connector_metadata()
    self._short = [t for t in self._short if not self.store.check(t)]
    extra = self._launch(meta.blocks)
    self._short.append(extra)
"""

#: The opposite: the helper's task kept under the request, where get_finished and handle_preemptions wait.
ATTRIBUTED = DETACHED.replace("""    self._short.append(extra)""", """    for req_id in meta.saving:
        self._by_req.setdefault(req_id, []).append(extra)""")

#: The opposite: the step's extra tasks waited before the step ends, in wait_for_save through a helper that waits.
SETTLED_IN_THE_STEP = DETACHED + """
def _finish(self, task):
    self.store.wait(task)
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    for task in self._short:
        self._finish(task)
    self._short.clear()
"""


def _single(hooks: str) -> tuple[str, tuple[str, ...]]:
    judgement = _judge(hooks).judge("Proto", cases=["single"]).judgements[0]
    return judgement.verdict, judgement.reasons


def test_a_helpers_task_kept_where_no_finish_or_preemption_looks_is_unknown() -> None:
    verdict, reasons = _single(DETACHED)
    assert verdict == "unknown" and any("self._short" in r and "the task _launch returns" in r for r in reasons), \
        reasons


def test_a_helpers_task_kept_where_the_report_path_waits_keeps_the_verdict() -> None:
    assert _single(ATTRIBUTED)[0] == "safe"


def test_tasks_a_step_loop_waits_through_a_helper_are_reached() -> None:
    verdict, reasons = _single(SETTLED_IN_THE_STEP)
    assert verdict == "safe" and not any("self._short" in r for r in reasons), (verdict, reasons)
