"""The rules the tenth blind round called for (two helpers wrote 10 files, 29 classes, with answer keys;
tests/fixtures/mro/corpus/blind_{ring_window,full_group_publish,abort_policy,meta_carried_layer,condition_drain}
_connectors.py and blind_{savespec_fullblocks,step_ledger,mla_rank_reports,fullattn_groups,op_program}.py are judged
with TLC by the corpus test). Two wrong verdicts by reading, both `unsafe` where the class is safe:

* ``ConditionDrainConnector``: its ``get_finished`` reports only requests no longer in a count table that a drain
  thread's loop lowers after each store wait; the table is also its tracking set, whose uses the reader did not
  record as ``self`` table operations, so the report read as one before any wait;
* ``StepLedgerConnector``: its ``handle_preemptions`` drains every older step under ``if meta.preempted or
  meta.fence_all``; the ``preempted`` in one side of the ``or`` made the drain read as a wait for the preempted
  requests only, so on a sliding-window model it read as unfenced.

And a ``return None`` body does nothing, like a bare ``return`` (it read as unknown work). With those bodies read,
two more misreadings showed in the corpus: ``ScopeCollapseConnector`` (drains every scope before each forward, never
delays) read **unsafe** because its drain read as a wait for the preempted requests, and an unconditional drain's
label ``wait_all_on_free`` waits only when the metadata's ``freed`` set (hybrid models only) is non-empty, missing
that a drain also covers an undelayed finish: a handle_preemptions whose waits nothing preempted selects is
``unknown`` in every case, and a drain is the spec's new ``wait_all_always`` (the corpus's ``StepFenceConnector``:
``safe`` with it, its truth). Reader tests without TLC."""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from deferdump.tools.mro.behaviour import DefinitionLabel
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import _body_kind, read_files
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES
from test_mro_blind_round6 import _labels

CORPUS = FIXTURES / "mro" / "corpus"


def _file_labels(path: Path, cls: str, case: str = "single") -> dict[str, DefinitionLabel]:
    judge = Judge(build_hierarchy(read_files([path], None), sources=[path]), ModelRunner(ModelBounds(), 60))
    return {f"{l.owner}.{l.method}": l for l in judge._labels(cls, None, [], case)}  # noqa: SLF001


def test_a_report_gated_on_a_table_a_waiting_thread_loop_lowers_is_not_read_as_a_report_before_the_wait(
        tmp_path: Path) -> None:
    name = "blind_condition_drain_connectors.py"
    for cls in ("ConditionDrainConnector", "ClaimCountDrainConnector"):  # truth: safe; unsafe (counts on claim)
        label = _file_labels(CORPUS / name, cls)["ConditionDrainConnector.get_finished"]
        assert label.label == "unknown", label
        assert "self._outstanding no longer holds" in label.reasons[0] and "_drain_loop, which waits store tasks" \
            in label.reasons[0], label.reasons
    # the same report where nothing that waits lowers the table stays a report before any wait
    source = (CORPUS / name).read_text(encoding="utf-8")
    unwaited = source.replace("            with self._cv:\n                self._retire(req_id)\n",
                              "            with self._cv:\n                pass\n", 1)
    assert unwaited != source
    (tmp_path / name).write_text(unwaited, encoding="utf-8")
    label = _file_labels(tmp_path / name, "ConditionDrainConnector")["ConditionDrainConnector.get_finished"]
    assert label.label == "report_before_wait", label


def test_a_drain_under_preempted_or_a_flag_is_not_a_wait_for_the_preempted_only() -> None:
    hooks = """
    def _retire_all(self):
        for task in self._pending:
            self.store.wait(task)
        self._pending.clear()
    def handle_preemptions(self, metadata):
        if metadata.preempted_req_ids or metadata.fence_all:
            self._retire_all()
    """
    for case in ("single", "hybrid"):  # a drain when the flag is set (on a sliding-window model: a fence)
        label = _labels(hooks, case)["Proto.handle_preemptions"]
        assert label.label == "unknown", label
        assert "not selected by the preempted requests" in label.reasons[0], label.reasons
    # both sides about preemption: the wait runs only for a preemption (the PR's handler reads the same)
    both = """
    def handle_preemptions(self, metadata):
        if metadata.preempted_req_ids or self._preempted_before:
            self._settle(metadata.preempted_req_ids)
    """
    assert _labels(both)["Proto.handle_preemptions"].label == "wait_preempted"


def test_a_wait_no_preempted_id_selects_is_unknown_in_every_case() -> None:
    hooks = (
        "def handle_preemptions(self, metadata):\n"
        "    for scope in self._scopes:\n"
        "        for req_id, task in scope.items():\n"
        "            self.store.wait(task)\n"
        "    self._scopes = []\n")
    for case in ("single", "mla", "hybrid"):
        label = _labels(hooks, case)["Proto.handle_preemptions"]
        assert label.label == "unknown" and "it may wait more than their tasks" in label.reasons[0], (case, label)
    assert _labels("")["Proto.handle_preemptions"].label == "wait_preempted"  # PR #989's: selected by the ids


def test_return_none_does_nothing_like_a_bare_return() -> None:
    for body in ("return None", "return", "pass", '"""doc"""\nreturn None'):
        func = ast.parse(f"def save_kv_layer(self, name, layer, meta):\n{textwrap.indent(body, '    ')}\n").body[0]
        assert _body_kind(func) == "noop", body  # type: ignore[arg-type]
    func = ast.parse("def f(self):\n    return 0\n").body[0]
    assert _body_kind(func) == "code"  # type: ignore[arg-type]
