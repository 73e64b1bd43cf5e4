"""Judging connector source with the protocol model: real TLC on generated class tables.

One TLC runner is shared by the module, so identical (table, context) runs are checked once."""
from __future__ import annotations

from pathlib import Path

import pytest

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Context, Judge, ModelRunner, judge_files
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES as ALL_FIXTURES
from support.mro import assert_safe_but_on_sliding_window

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

FIXTURES = ALL_FIXTURES / "mro"
SAFETY_VIOLATIONS = {"NoOverwriteWhileDumpingInv", "NoUnexpectedReportInv", "ReportOnceInv"}


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(ModelBounds(), timeout=300)


def _judge(fixture: str, runner: ModelRunner, *classes: str):
    return judge_files([FIXTURES / fixture], only=list(classes), runner=runner).connectors


def test_ucm_cp_resolves_build_connector_meta_to_direct_and_is_safe_with_a_full_attention_group(
        runner: ModelRunner) -> None:
    verdict = _judge("ucm_shaped.py", runner, "UCMCPConnector")["UCMCPConnector"]
    assert verdict.resolves["build_connector_meta"] == "UCMDirectConnector"
    assert_safe_but_on_sliding_window(verdict)
    # not SupportsHMA: its sliding-window case is a model whose every layer is sliding-window, on the non-HMA
    # path; it saves layer by layer, so two layers are checked too
    assert [j.context.key for j in verdict.judgements] == ["single", "multi", "hybrid", "mla", "layerwise"]
    assert verdict.judgements[2].context.path == "non_hma"
    assert verdict.judgements[0].labels["UCMDirectConnector.build_connector_meta"] == "track"


def test_cp_override_without_tracking_is_unsafe(runner: ModelRunner) -> None:
    verdict = _judge("cp_override_no_track.py", runner, "UCMCPConnector")["UCMCPConnector"]
    assert verdict.resolves["build_connector_meta"] == "UCMCPConnector"
    assert verdict.verdict == "unsafe"
    assert verdict.violated in SAFETY_VIOLATIONS
    assert verdict.context == Context("non_hma")


def test_wrapper_without_request_finished_forward_is_unsafe_only_beside_a_delaying_sibling(
    runner: ModelRunner,
) -> None:
    hierarchy = build_hierarchy(read_files([FIXTURES / "outer_no_forward.py"]))
    judge = Judge(hierarchy, runner)
    assert hierarchy.resolves("UCMConnector")["request_finished"] == "KVConnectorBase_V1"
    top = judge.judge_context("UCMConnector", Context("hma", "UCMDirectConnector"), [])
    multi = judge.judge_context("UCMConnector", Context("multi", "UCMDirectConnector"), [])
    assert top.verdict == "safe"  # the HMA path uses the forwarded request_finished_all_groups
    assert multi.verdict == "unsafe" and multi.violated in SAFETY_VIOLATIONS
    # the inner classes are not SupportsHMA: the isinstance test sends the call to the inner request_finished
    assert multi.labels["UCMConnector.request_finished_all_groups"] == "forward_request_finished"


def test_wrapper_is_judged_once_per_inner_class_its_init_may_pick(runner: ModelRunner) -> None:
    verdict = _judge("wrapper_multi_inner.py", runner, "Wrapper")["Wrapper"]
    by_inner = {}
    for judgement in verdict.judgements:
        if judgement.context.case != "hybrid":
            by_inner.setdefault(judgement.context.inner, set()).add(judgement.verdict)
    assert by_inner == {"LayerWise": {"safe"}, "Direct": {"safe"}, "Forgetful": {"unsafe"}}
    assert verdict.verdict == "unsafe" and verdict.context is not None
    assert verdict.context.inner == "Forgetful"
    assert {j.context.path for j in verdict.judgements} == {"hma", "multi"}
    # the wrapper is SupportsHMA, so vLLM may run it on a hybrid model: no inner class fences its deferred
    # dumps against the sliding-window frees
    hybrid = {j.context.inner: (j.verdict, j.violated) for j in verdict.judgements if j.context.case == "hybrid"}
    assert hybrid["LayerWise"] == hybrid["Direct"] == ("unsafe", "NoOverwriteWhileDumpingInv")
    assert hybrid["Forgetful"][0] == "unsafe" and hybrid["Forgetful"][1] in SAFETY_VIOLATIONS


def test_override_that_does_not_call_super_is_unsafe(runner: ModelRunner) -> None:
    verdicts = _judge("override_no_super.py", runner, "LoggingConnector", "PoliteLoggingConnector")
    assert verdicts["LoggingConnector"].verdict == "unsafe"
    assert verdicts["LoggingConnector"].violated in SAFETY_VIOLATIONS
    assert_safe_but_on_sliding_window(verdicts["PoliteLoggingConnector"])


def test_super_with_a_class_argument_skips_a_level(runner: ModelRunner) -> None:
    verdicts = _judge("super_skip.py", runner, "CPSkipping", "CPPlainSuper")
    assert_safe_but_on_sliding_window(verdicts["CPSkipping"])
    assert verdicts["CPPlainSuper"].verdict == "unsafe"


def test_diamonds_follow_the_instance_mro(runner: ModelRunner) -> None:
    verdicts = _judge("diamond.py", runner, "ReplanningFirst", "CooperativeFirst", "Cooperative")
    assert verdicts["ReplanningFirst"].resolves["build_connector_meta"] == "Replanning"
    assert verdicts["CooperativeFirst"].resolves["build_connector_meta"] == "Cooperative"
    assert verdicts["ReplanningFirst"].verdict == "unsafe"
    assert_safe_but_on_sliding_window(verdicts["CooperativeFirst"])
    assert verdicts["Cooperative"].verdict == "unsafe"


def test_unclassifiable_definition_is_unknown_with_the_reason(runner: ModelRunner) -> None:
    verdict = _judge("unknown_policy.py", runner, "PolicyConnector")["PolicyConnector"]
    single = verdict.judgements[0]
    assert single.context.key == "single" and single.verdict == "unknown"
    assert single.violated in SAFETY_VIOLATIONS
    assert any("request_finished decides the delay" in r for r in single.reasons)
    # whatever the policy answers, a model whose every layer is sliding-window frees a running request's
    # out-of-window blocks under its unfenced deferred dumps: that case decides
    assert (verdict.verdict, verdict.violated, verdict.context.case) == (
        "unsafe", "NoOverwriteWhileDumpingInv", "hybrid")


def test_identical_runs_are_cached_within_one_judge() -> None:
    fresh = ModelRunner(ModelBounds(), timeout=300)
    judge_files([FIXTURES / "override_no_super.py"], only=["PoliteLoggingConnector"], runner=fresh)
    runs = fresh.runs
    again = judge_files([FIXTURES / "override_no_super.py"], only=["PoliteLoggingConnector"], runner=fresh)
    assert fresh.runs == runs and again.tlc_runs == 0 and again.cached_runs == runs


def test_liveness_option_catches_a_get_finished_that_never_reports(runner: ModelRunner) -> None:
    """Reporting nothing overwrites no dump (safety holds) but never frees the delayed blocks."""
    hierarchy = build_hierarchy(read_files([FIXTURES / "silent_get_finished.py"]))
    safety = Judge(hierarchy, runner).judge_context("Silent", Context("non_hma"), [])
    live = Judge(hierarchy, ModelRunner(ModelBounds(), timeout=300, liveness=True)).judge_context(
        "Silent", Context("non_hma"), []
    )
    assert safety.verdict == "safe"
    assert (live.verdict, live.violated) == ("unsafe", "DelayedEventuallyFreedProp")
    assert live.labels["Silent.get_finished"] == "base"


def test_a_case_tlc_cannot_finish_in_time_is_unknown_and_the_run_goes_on() -> None:
    """A timeout decides nothing: that case is `unknown` naming the time and how to decide it, and the
    other classes are still judged (it used to end the whole run with one error line)."""
    hurried = ModelRunner(ModelBounds(), timeout=0.05)  # less than a JVM start
    verdicts = judge_files([FIXTURES / "ucm_shaped.py"], only=["UCMCPConnector", "UCMDirectConnector"],
                           runner=hurried).connectors
    for name in ("UCMCPConnector", "UCMDirectConnector"):
        verdict = verdicts[name]
        assert verdict.verdict == "unknown", verdict
        for judgement in verdict.judgements:
            assert judgement.verdict == "unknown" and judgement.counterexample is None
            (reason,) = judgement.reasons
            assert "did not finish" in reason and "within 0.05 s" in reason and "--timeout" in reason


def test_a_class_that_raises_in_a_method_of_every_step_is_never_unsafe(runner: ModelRunner, tmp_path) -> None:
    """UCM #989's UCMPDConnector: Direct's unfenced deferred dumps, but `get_finished` raises. vLLM calls it in
    every step, so no run gets past its first step and none reuses a block: unknown in every case (the
    sliding-window case called it unsafe before this rule, with a counterexample the class never reaches)."""
    source = tmp_path / "raising.py"
    source.write_text('''
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


class Deferred(KVConnectorBase_V1):
    def build_connector_meta(self, scheduler_output):
        self._async_dump_req_ids.update(scheduler_output.saving)
        return scheduler_output

    def request_finished(self, request, block_ids):
        if request.request_id in self._async_dump_req_ids:
            self._async_dump_req_ids.discard(request.request_id)
            return True, None
        return False, None

    def wait_for_save(self):
        self._pending.append(self.store.dump_data(self._get_connector_metadata().blocks))


class Disaggregated(Deferred):
    def get_finished(self, finished_req_ids):
        raise RuntimeError("use the prefill instance")
''')
    verdict = judge_files([source], only=["Disaggregated"], runner=runner).connectors["Disaggregated"]
    assert {j.context.key: j.verdict for j in verdict.judgements} == {
        "single": "unknown", "multi": "unknown", "hybrid": "unknown", "mla": "unknown"}
    assert all(any("vLLM calls get_finished in every step" in r for r in j.reasons) for j in verdict.judgements)


def test_judging_named_cases_judges_those_and_refuses_a_case_the_class_has_not(runner: ModelRunner) -> None:
    """``Judge.judge(cls, cases)``: the named cases, each as in a whole judgement (PR #989's protocol without a
    fence: unsafe only on the all-sliding-window model); a case the class is never run in is an error, not an
    empty (safe) judgement."""
    from deferdump.tools.mro.errors import MroError

    path = FIXTURES / "ucm_shaped.py"
    judge = Judge(build_hierarchy(read_files([path], None), sources=[str(path)]), runner)
    whole = {j.context.key: j.verdict for j in judge.judge("UCMCPConnector").judgements}
    named = judge.judge("UCMCPConnector", ["hybrid", "single"])
    assert {j.context.key: j.verdict for j in named.judgements} == {"single": whole["single"], "hybrid": "unsafe"}
    assert (named.verdict, named.context.key) == ("unsafe", "hybrid")
    with pytest.raises(MroError, match=r"UCMCPConnector is not judged in hybrid\[X\]: its cases are single, multi"):
        judge.judge("UCMCPConnector", ["hybrid[X]"])
