"""A save whose dumps go through a value the reader does not resolve (a transition table's lambda, a callback it
was handed, ``operator.methodcaller(...)(store)``) shows no submit. Read as a save that tracks and submits nothing,
its class was judged with no dumps at all, so nothing could be overwritten: ``TableDispatchConnector`` below tracks
each request and submits through ``self.ops["dump"]``, reports before any wait, and was judged **safe** in every
case. A probe found it (the thirty-first blind round's record-table reading, taken back, exposed
``LambdaFsmRestartConnector``); ``blind_oldest_k.py``'s classes dump through ``methodcaller`` the same way (their
recorded verdicts were already ``unknown``). Now such a ``wait_for_save``/``save_kv_layer`` is ``unknown``; the
opposite, the same submit written out, is read as before."""
from __future__ import annotations

from pathlib import Path

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import HIDDEN_SUBMIT, read_files
from deferdump.tools.mro.tla import ModelBounds
from support.mro_probes import DISPATCH, TABLE_DISPATCH

SOURCE = TABLE_DISPATCH


def _judge(tmp_path: Path, text: str = SOURCE) -> Judge:
    path = tmp_path / "table_dispatch.py"
    path.write_text(text, encoding="utf-8")
    return Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 120))


def test_a_save_through_a_table_of_lambdas_is_unknown(tmp_path: Path) -> None:
    judge = _judge(tmp_path)
    label = judge.reader.label("TableDispatchConnector", "TableDispatchConnector", "wait_for_save")
    assert label.label == "unknown" and "step(...)" in label.reasons[0] and HIDDEN_SUBMIT in label.reasons[0], label
    verdict = judge.judge("TableDispatchConnector", cases=["single"]).judgements[0].verdict
    assert verdict == "unknown", verdict


def test_an_item_called_in_place_is_a_value_too(tmp_path: Path) -> None:
    text = SOURCE.replace(DISPATCH, '            self.ops["dump"](r, span)')
    label = _judge(tmp_path, text).reader.label("TableDispatchConnector", "TableDispatchConnector", "wait_for_save")
    assert label.label == "unknown" and 'self.ops[\'dump\'](...)' in label.reasons[0], label


def test_the_submit_written_out_is_read_as_before(tmp_path: Path) -> None:
    """The opposite: the same dump called on the store is a visible submit, and the report before any wait is the
    counterexample."""
    text = SOURCE.replace(DISPATCH, "            self._tasks.setdefault(r, []).append(self.store.dump(span, r))")
    judge = _judge(tmp_path, text)
    label = judge.reader.label("TableDispatchConnector", "TableDispatchConnector", "wait_for_save")
    assert label.label == "poll_track_submit", label
    assert judge.judge("TableDispatchConnector", cases=["single"]).judgements[0].verdict == "unsafe"


def test_a_value_called_where_nothing_is_tracked_or_saved_elsewhere_changes_nothing(tmp_path: Path) -> None:
    """A value called in ``build_connector_meta`` (a sort key's lambda, a callback) is not a save."""
    text = SOURCE.replace("        meta.preempted = list(scheduler_output.preempted_req_ids or ())",
                          "        meta.preempted = sorted(scheduler_output.preempted_req_ids or (), key=lambda r: r)\n"
                          "        pick = self.ops.get\n        pick(\"dump\")")
    label = _judge(tmp_path, text).reader.label("TableDispatchConnector", "TableDispatchConnector",
                                                "build_connector_meta")
    assert label.label == "track", label
