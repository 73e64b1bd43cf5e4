"""The rules the ninth blind round called for (two helpers wrote 10 files, 28 classes, with answer keys;
tests/fixtures/mro/corpus/blind_{scope_guard,counted_swap,closure_settle,layer_stack,single_writer}_connectors.py
and blind_{blockmap_dump,batched_step_dump,step_gated_reports,preempt_bookkeeping,priority_tiers}.py are judged
with TLC by the corpus test). Reading gave wrong `unsafe` verdicts where the model's dumps or waits are not the
class's, so a counterexample of the model is not a run of the class (nor a pass a proof): the case is `unknown`
and keeps its counterexample, which `--run` replays against the class.

* a finish that keeps its block ids for a later dump (``BlockListDumpConnector``, ``PriorityTierConnector``:
  unsafe, truth safe: they dump only finished requests' blocks, which their delay holds; the model dumps blocks as
  they are computed, and preempts them);
* a ``get_finished`` that sweeps every task it holds each step (``WriteThroughDrainConnector``: unsafe, truth safe:
  no dump outlives its step).
Judge tests without TLC."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_source
from deferdump.tools.mro.tla import ModelBounds
from test_mro_blind_round6 import HEADER, PROTOCOL


def _undecided(hooks: str) -> tuple[str, ...]:
    source = PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(hooks), "    "))
    judge = Judge(build_hierarchy(read_source(HEADER + textwrap.dedent(source), "<t>")), ModelRunner(ModelBounds(), 60))
    labels = judge._labels("Proto", None, [], "single")  # noqa: SLF001
    return judge._reading_cannot_decide("Proto", None, labels)  # noqa: SLF001


def test_a_finish_keeping_its_block_ids_for_a_later_dump_is_not_decided_by_reading() -> None:
    for keep in ("self._saves[request.request_id] = list(block_ids)",
                 "self._jobs.append((request.request_id, block_ids))",
                 "ids = [b for b in block_ids if b]\nself._saves.setdefault(request.request_id, ids)"):
        body = textwrap.indent(keep, "    ")
        why = _undecided(f"def request_finished(self, request, block_ids):\n{body}\n    return True, None\n")
        assert why and "keeps the finished request's `block_ids`" in why[0], keep
    assert _undecided("""
    def request_finished(self, request, block_ids):
        self._done.add(request.request_id)  # the id, not the blocks
        return bool(block_ids), None
    """) == ()
    assert _undecided("") == ()  # PR #989's protocol


def test_a_report_sweeping_every_held_task_is_not_decided_by_reading() -> None:
    sweep = """
    def _wait_req(self, req_id):
        for task in self._by_req.pop(req_id, ()):
            self.store.wait(task)
    def get_finished(self, finished_req_ids):
        for req_id in list(self._by_req):
            self._wait_req(req_id)
        done = finished_req_ids & self._async_dump_req_ids
        return done, None
    """
    why = _undecided(sweep)
    assert why and "drains every task it holds each step" in why[0], why
    some = sweep.replace("for req_id in list(self._by_req):", "for req_id in list(self._by_req)[:1]:")
    assert _undecided(some) == ()  # one entry: not a sweep of the table
    guarded = sweep.replace("            self._wait_req(req_id)",
                            "            if req_id in finished_req_ids:\n                self._wait_req(req_id)")
    assert _undecided(guarded) == ()
