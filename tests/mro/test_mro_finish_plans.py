"""Transfers planned at a request's finish (tools/mro/finish_plans.py). ``AsyncLoadStoreConnector``
(blind_async_loads_and_saves.py, keyed safe) dumps only finished requests: its ``request_finished`` appends the
request's blocks to the dump list ``wait_for_save`` submits, answers True, and ``get_finished`` reports each once its
dumps are done. Given a plain tracking set (below), the reader reads its save as the PR's and the model, which dumps
running requests, found a preemption overwrite of a request the class never dumps: **unsafe** in every case. Now a
counterexample for a class whose finish keeps the block ids it is handed is ``unknown``; a class whose finish keeps
nothing keeps its counterexample."""
from __future__ import annotations

from pathlib import Path

from deferdump.tools.mro.finish_plans import finish_plans
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds

CORPUS = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_async_loads_and_saves.py"

#: The class with its task table read through a plain tracking set: added at submit, reported once done.
TRACKED = (
    ("            self._dumps.setdefault(t.req_id, []).append(self.store.dump(t.block_ids, t.key))",
     "            self._async_dump_req_ids.add(t.req_id)\n"
     "            self._dumps.setdefault(t.req_id, []).append(self.store.dump(t.block_ids, t.key))"),
    ("        sending = {r for r in self._dumps if self._dump_done(r)}\n        for r in sending:",
     "        sending = {r for r in self._async_dump_req_ids if self._dump_done(r)}\n"
     "        self._async_dump_req_ids -= sending\n        for r in sending:"),
    ("            self._bad: set[int] = set()",
     "            self._bad: set[int] = set()\n            self._async_dump_req_ids: set[str] = set()"),
)


def _judge(tmp_path: Path, extra: tuple[tuple[str, str], ...] = ()) -> Judge:
    text = CORPUS.read_text(encoding="utf-8")
    for old, new in (*TRACKED, *extra):
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / CORPUS.name
    path.write_text(text, encoding="utf-8")
    return Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 120))


def test_a_dump_planned_at_the_finish_is_no_preemption_counterexample(tmp_path: Path) -> None:
    judge = _judge(tmp_path)
    assert judge.reader.label("AsyncLoadStoreConnector", "AsyncLoadStoreConnector", "wait_for_save").label \
        == "poll_track_submit"
    judgement = judge.judge("AsyncLoadStoreConnector", cases=["single"]).judgements[0]
    assert judgement.verdict == "unknown", (judgement.verdict, judgement.reasons)
    assert any("keeps `block_ids`" in r for r in judgement.reasons), judgement.reasons


def test_a_finish_that_keeps_no_blocks_keeps_its_counterexample(tmp_path: Path) -> None:
    """The opposite: the dump list filled from the scheduled requests instead (a dump of running requests), the
    finish only answering: the preemption overwrite is the class's own."""
    plan = (
        ("        meta, self._pending = self._pending, TierMetadata()\n        return meta",
         "        meta, self._pending = self._pending, TierMetadata()\n"
         "        for new in scheduler_output.scheduled_new_reqs:\n"
         "            meta.dumps.append(Transfer(new.req_id, new.block_ids[0], new.req_id))\n"
         "        return meta"),
        ("        self._pending.dumps.append(Transfer(request.request_id, block_ids[:full], key))\n", ""),
        ("        full = min(request.num_computed_tokens // self._bs, len(block_ids))",
         "        full = request.num_computed_tokens // self._bs"),
    )
    judge = _judge(tmp_path, plan)
    assert finish_plans(judge.reader, "AsyncLoadStoreConnector") == ()
    assert judge.judge("AsyncLoadStoreConnector", cases=["single"]).judgements[0].verdict == "unsafe"
