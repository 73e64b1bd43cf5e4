"""The reading rules the twenty-fourth blind round called for (two helpers wrote 12 files with answer keys: vLLM 0.32's
connector API beyond PR #989's pair — worker metadata, ``update_connector_output``, stats and events hooks, block
pins, ``reset_cache`` — and the field's recorded save bugs next to their fixes;
tests/fixtures/mro/corpus/blind_stats_events_tables.py and its siblings are judged with TLC by the corpus test):

* **a class that leaves an ``@abstractmethod`` helper undefined cannot be built.** ``_TaskTableConnector`` declares
  ``_reportable`` abstract (its subclasses define it); Python's ABC check refuses to build it, as vLLM's factory
  would try to. It was judged **unsafe** (every one-group case), truth safe: only abstract *connector* methods were
  known to stop a class;
* **vLLM frees what ``finished_sending`` holds after ``update_connector_output``** (scheduler.py ~3218-3235).
  ``PublishedEventsConnector``'s workers report a request as soon as it finishes, and its scheduler side takes the
  id back out of ``connector_output.finished_sending`` until every rank's worker metadata acknowledged the
  request's jobs. The model frees on ``get_finished``'s report: it was judged **unsafe** with one group and as a
  MultiConnector child, where the key says safe."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_source
from deferdump.tools.mro.tla import ModelBounds

from test_mro_blind_round6 import HEADER, PROTOCOL


def _verdicts(hooks: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``Proto`` (PR #989's protocol, safe) with ``hooks`` added, judged with one KV-cache group."""
    source = "from abc import abstractmethod\n" + HEADER + textwrap.dedent(PROTOCOL.format(
        hooks=textwrap.indent(textwrap.dedent(hooks), "    ")))
    judge = Judge(build_hierarchy(read_source(source, "<t>")), ModelRunner(ModelBounds(), 60))
    report = judge.judge("Proto", cases=["single"])
    return {j.context.key: (j.verdict, j.reasons) for j in report.judgements}


def test_a_connector_leaving_an_abstract_helper_undefined_cannot_be_built() -> None:
    abstract = _verdicts("""
@abstractmethod
def _reportable(self, closing):
    raise NotImplementedError
""")
    single, reasons = abstract["single"]
    assert single == "unknown" and any("Proto._reportable is an @abstractmethod Proto does not override" in r
                                       for r in reasons), abstract["single"]
    # the opposite: the name bound again after the abstract def (here by unpacking) leaves the class buildable
    for defined in ("def _reportable(self, closing):\n    return closing\n",
                    "@abstractmethod\ndef _reportable(self, closing):\n    raise NotImplementedError\n"
                    "_reportable, _other = (lambda self, c: c), 1\n"):
        assert _verdicts(defined)["single"][0] == "safe", defined


def test_a_scheduler_side_that_rewrites_finished_sending_makes_the_case_undecided() -> None:
    for rewrite in ("connector_output.finished_sending = self._hold(connector_output.finished_sending)",
                    "connector_output.finished_sending -= self._pending",
                    "connector_output.finished_sending.difference_update(self._pending)",
                    "sent = connector_output.finished_sending\nsent -= self._pending",
                    "self._filter(connector_output)"):
        verdict, reasons = _verdicts(f"""
def update_connector_output(self, connector_output):
{textwrap.indent(rewrite, "    ")}
""")["single"]
        assert verdict == "unknown" and any("vLLM frees what the output's finished_sending holds" in r
                                            for r in reasons), (rewrite, verdict, reasons)
    # the opposite: reading the reports (a copy, a log line, a forward to the parent) changes nothing
    for reads in ("self._seen |= set(connector_output.finished_sending or ())",
                  "logger.debug('sent %s', connector_output.finished_sending)",
                  "super().update_connector_output(connector_output)"):
        assert _verdicts(f"""
def update_connector_output(self, connector_output):
    {reads}
""")["single"][0] == "safe", reads
