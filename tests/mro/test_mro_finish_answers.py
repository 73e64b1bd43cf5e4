"""A finish that answers through another finish method, and a ``request_finished_all_groups`` that decides itself.

vLLM calls ``request_finished_all_groups`` on a ``SupportsHMA`` connector, and connectors written for it (vLLM 0.32's
``MooncakeStoreConnector``, the thirtieth blind round's ``StepBatchConnector`` and ``FullAttentionDumpConnector``)
decide there and have ``request_finished`` return ``self.request_finished_all_groups(request, (block_ids,))``. The
reader read such a ``request_finished`` as "decides the delay without consulting the tracking set", and a
``request_finished_all_groups`` testing the tracking set as "does not delegate": both ``unknown``. Now the first
answers what the method it returns answers, as the class resolves it, and the second is the model's
``delay_if_tracked`` for that method (spec/Connectors.tla)."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_source
from deferdump.tools.mro.tla import ModelBounds

from test_mro_blind_round6 import HEADER, PROTOCOL

#: PR #989's protocol, deciding the delay in request_finished_all_groups; request_finished returns its answer.
DECIDES_IN_RFAG = """
def request_finished(self, request, block_ids):
    return self.request_finished_all_groups(request, (block_ids,))
def request_finished_all_groups(self, request, block_ids):
    if request.request_id in self._async_dump_req_ids:
        self._async_dump_req_ids.discard(request.request_id)
        return True, None
    return False, None
"""


def _judge(hooks: str, hma: bool = True) -> Judge:
    source = textwrap.dedent(PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(hooks), "    ")))
    header = HEADER
    if hma:
        source = source.replace("class Proto(KVConnectorBase_V1):", "class Proto(KVConnectorBase_V1, SupportsHMA):")
        header = header.replace("import KVConnectorBase_V1", "import KVConnectorBase_V1, SupportsHMA")
    return Judge(build_hierarchy(read_source(header + source, "<t>")), ModelRunner(ModelBounds(), 60))


def _labels(judge: Judge, case: str = "single") -> dict[str, str]:
    return {f"{l.owner}.{l.method}": l.label for l in judge._labels("Proto", None, [], case)}  # noqa: SLF001


def test_a_request_finished_all_groups_testing_the_tracking_set_is_delay_if_tracked() -> None:
    judge = _judge(DECIDES_IN_RFAG)
    labels = _labels(judge)
    assert labels["Proto.request_finished_all_groups"] == "delay_if_tracked", labels
    verdicts = {j.context.case: j.verdict for j in judge.judge("Proto", cases=["single", "hybrid"]).judgements}
    # the PR's protocol: safe with one group, the unfenced sliding-window hazard on the hybrid model
    assert verdicts == {"single": "safe", "hybrid": "unsafe"}, verdicts


def test_a_request_finished_all_groups_testing_something_else_stays_unknown() -> None:
    """The opposite: the answer rests on a list the save path never fills (not a tracking set)."""
    judge = _judge(DECIDES_IN_RFAG.replace("in self._async_dump_req_ids:", "in self._short:").replace(
        "self._async_dump_req_ids.discard(", "self._short.remove("))
    labels = _labels(judge)
    assert labels["Proto.request_finished_all_groups"] == "unknown", labels
    verdict = judge.judge("Proto", cases=["single"]).judgements[0].verdict
    assert verdict != "safe", verdict


def test_a_finish_answering_through_another_method_has_that_methods_answer() -> None:
    """``return self.request_finished_all_groups(...)``: a constant False is ``base``, a constant True
    ``delay_all``, whatever the returned method's body does beside (the answer is the helper's as the class
    resolves it, so an override in a subclass changes it)."""
    forwarding = "def request_finished(self, request, block_ids):\n    return self.request_finished_all_groups(request, (block_ids,))\n"
    for answer, label in (("False", "base"), ("True", "delay_all")):
        hooks = forwarding + f"def request_finished_all_groups(self, request, block_ids):\n    return {answer}, None\n"
        labels = _labels(_judge(hooks, hma=False))
        assert labels["Proto.request_finished"] == label, (answer, labels)


def test_request_finished_all_groups_returning_request_finished_keeps_its_own_label() -> None:
    hooks = "def request_finished_all_groups(self, request, block_ids):\n    return self.request_finished(request, block_ids[0])\n"
    assert _labels(_judge(hooks))["Proto.request_finished_all_groups"] == "call_request_finished"


def test_a_finish_answering_through_a_helper_carries_the_helpers_guards() -> None:
    """``request_finished`` returning ``self._finish(request, (block_ids,))``: CompactSpanDump (a blind round's, keyed
    unsafe) overrides ``_finish`` to answer False when the block tables are empty, for a request its set still
    holds; SpanDumpConnector's ``_finish`` answers from the set alone (``delay_if_tracked``)."""
    from pathlib import Path

    from deferdump.tools.mro.source import read_files

    path = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_span_dump_wrappers.py"
    judge = Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 60))
    compact = judge.reader.label("CompactSpanDump", "SpanDumpConnector", "request_finished")
    assert compact.label == "unknown" and "its answer also rests on" in compact.reasons[0], compact
    plain = judge.reader.label("SpanDumpConnector", "SpanDumpConnector", "request_finished")
    assert plain.label == "delay_if_tracked", plain
