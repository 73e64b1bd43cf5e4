"""A store task handed to a ``self`` helper that drops it (tools/mro/dropped_handoffs.py). ``FrozenRecordStatsConnector``
(blind_frozen_state.py) saves with ``self._record(rid, self.store.dump(...))`` and its ``_record`` throws away the
``dataclasses.replace(rec, tasks=rec.tasks + (task,))`` it computes: the record it stores never holds the task, and
nothing waits that dump. The reader counted the handed task as kept, so a class of that shape whose other
definitions it reads was judged **safe** where a finished request is reported (and freed) while its dump runs:
``RecordHelperConnector`` below, with the copy discarded, was safe with one group, as a child and under MLA. Now a
pass proves nothing there; the opposite, a helper that keeps the task, is judged as before."""
from __future__ import annotations

import ast
from pathlib import Path

from deferdump.tools.mro.dropped_handoffs import dropped_handoffs, dropped_params
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds
from support.mro_probes import DISPATCH, TABLE_DISPATCH

#: TABLE_DISPATCH saving through a ``self._record`` helper instead of the table, and reporting after it waits.
SOURCE = TABLE_DISPATCH.replace(
    '''        self.ops = {"dump": lambda r, span: self._tasks.setdefault(r, []).append(self.store.dump(span, r))}
''', "").replace(DISPATCH, """            self._record(r, self.store.dump(span, r))

    def _record(self, r, task):
        self._tasks.setdefault(r, []).append(task)""").replace(
    TABLE_DISPATCH[TABLE_DISPATCH.index("    def get_finished"):], """    def get_finished(self, finished_req_ids):
        done = {r for r in finished_req_ids if r in self._async_dump_req_ids}
        for r in done:
            self._async_dump_req_ids.discard(r)
            for t in self._tasks.pop(r, []):
                self.store.wait(t)
        return done or None, None
""").replace("TableDispatchConnector", "RecordHelperConnector")

KEEP = "        self._tasks.setdefault(r, []).append(task)"
DISCARD = """        entry = tuple(self._tasks.get(r, ()))
        dataclasses.replace(Entry(entry), tasks=entry + (task,))
        self._tasks[r] = list(entry)"""
ENTRY = """import dataclasses


@dataclasses.dataclass(frozen=True)
class Entry:
    tasks: tuple = ()
"""
FROZEN = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_frozen_state.py"


def _judge(tmp_path: Path, helper: str = KEEP) -> Judge:
    path = tmp_path / "record_helper.py"
    path.write_text(ENTRY + SOURCE.replace(KEEP, helper), encoding="utf-8")
    return Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 120))


def test_a_task_the_helper_discards_in_a_copy_makes_a_pass_prove_nothing(tmp_path: Path) -> None:
    judgement = _judge(tmp_path, DISCARD).judge("RecordHelperConnector", cases=["single"]).judgements[0]
    assert judgement.verdict == "unknown", (judgement.verdict, judgement.reasons)
    assert any("RecordHelperConnector._record()" in r and "`task`" in r for r in judgement.reasons), judgement.reasons


def test_the_helper_that_keeps_the_task_is_judged_as_before(tmp_path: Path) -> None:
    judge = _judge(tmp_path)
    assert dropped_handoffs(judge.reader, "RecordHelperConnector") == ()
    assert judge.judge("RecordHelperConnector", cases=["single"]).judgements[0].verdict == "safe"


def _params(body: str) -> frozenset[str]:
    func = ast.parse(f"def _record(self, r, task):\n{body}").body[0]
    assert isinstance(func, ast.FunctionDef)
    return dropped_params(func)


def test_which_parameters_go_nowhere() -> None:
    assert _params("    logger.debug('%s %s', r, task)\n") == {"r", "task"}  # a log line keeps nothing
    assert _params("    pass\n") == {"r", "task"}
    assert _params("    dataclasses.replace(rec, tasks=(task,))\n") == {"r", "task"}
    assert "task" not in _params("    rec = dataclasses.replace(rec, tasks=(task,))\n    self._recs[r] = rec\n")
    assert "task" not in _params("    self._log.append(task)\n")
    assert "task" not in _params("    return task\n")
    assert "task" not in _params("    if task is None:\n        return\n")
    assert "task" not in _params("    task = self._wrap(task)\n")


def test_the_corpus_class_and_its_siblings() -> None:
    judge = Judge(build_hierarchy(read_files([FROZEN])), ModelRunner(ModelBounds(), 120))
    assert dropped_handoffs(judge.reader, "FrozenRecordStatsConnector"), "the discarded replace was not read"
    assert dropped_handoffs(judge.reader, "FrozenRecordConnector") == ()
    assert dropped_handoffs(judge.reader, "FrozenRecordDeferredConnector") == ()
