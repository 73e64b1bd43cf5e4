"""`deferdump mro` on connectors written in other styles, wrappers that call a different inner method, and
synchronous saves: each judged as its behaviour warrants (or unknown with the reason), with real TLC."""
from __future__ import annotations

from pathlib import Path

import pytest

from deferdump.tools.mro.behaviour import EffectReader
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import ModelRunner, judge_files
from deferdump.tools.mro.source import read_source
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES as ALL_FIXTURES
from support.mro import assert_safe_but_on_sliding_window

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

FIXTURES = ALL_FIXTURES / "mro"


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(ModelBounds(), timeout=300)


@pytest.fixture(scope="module")
def styles(runner: ModelRunner):
    return judge_files([FIXTURES / "styles.py"], runner=runner).connectors


@pytest.mark.parametrize(
    ("cls", "verdict"),
    [
        ("EarlyReturns", "safe"),
        ("HelperChains", "safe"),
        ("LockedTracking", "safe"),
        ("LockedForgetful", "unsafe"),
        ("ComprehensionFilters", "safe"),
        ("SetterTracking", "safe"),
        ("SetterForgetful", "unsafe"),
        ("GetattrWrapper", "unsafe"),
        ("ThreadedSave", "unknown"),
        ("SyncSave", "safe"),
    ],
)
def test_each_style_is_judged_as_its_behaviour_warrants(styles, cls: str, verdict: str) -> None:
    judgement = styles[cls]
    if verdict == "safe" and cls != "SyncSave":  # deferred dumps, no fence, not SupportsHMA
        assert_safe_but_on_sliding_window(judgement)
        return
    assert judgement.verdict == verdict, (judgement.violated, judgement.reasons)
    if verdict != "safe":
        assert judgement.deciding is not None and judgement.deciding.counterexample is not None


def test_labels_behind_the_style_verdicts(styles) -> None:
    def label(cls: str, key: str) -> str:
        return next(j.labels[key] for j in styles[cls].judgements if key in j.labels)

    assert label("SetterTracking", "SetterTracking.build_connector_meta") == "track"  # via the setter
    assert label("SetterForgetful", "SetterForgetful.build_connector_meta") == "notrack"
    assert label("LockedTracking", "LockedTracking.request_finished") == "delay_if_tracked"
    assert label("ComprehensionFilters", "ComprehensionFilters.get_finished") == "wait_finished"
    assert label("SyncSave", "SyncSave.save_kv_layer") == "sync_save"
    assert label("SyncSave", "SyncSave.wait_for_save") == "base"  # a bare return
    assert any("threading.Thread" in r for r in styles["ThreadedSave"].reasons)
    # the base's request_finished runs, never __getattr__: Python only asks __getattr__ for what the MRO lacks
    assert styles["GetattrWrapper"].resolves["request_finished"] == "KVConnectorBase_V1"


def test_independent_ucm_shaped_wrapper_is_safe_with_one_group_and_unsafe_on_a_hybrid_model(
    runner: ModelRunner,
) -> None:
    """The wrapper calls the inner request_finished with block_ids[0] (right with one KV-cache group), but it
    is SupportsHMA: vLLM keeps the hybrid manager on and frees sliding-window blocks of running requests
    under the inner class's unfenced deferred dumps."""
    judgement = judge_files([FIXTURES / "ucm_independent.py"], runner=runner).connectors
    assert {name: j.verdict for name, j in judgement.items()} == {
        "StoreBackedConnector": "unsafe", "PerLayerConnector": "unsafe", "OuterStoreConnector": "unsafe"
    }
    assert_safe_but_on_sliding_window(judgement["StoreBackedConnector"])
    assert_safe_but_on_sliding_window(judgement["PerLayerConnector"])
    outer = judgement["OuterStoreConnector"]
    assert {j.context.path for j in outer.judgements} == {"hma", "multi"}
    assert all(j.labels["OuterStoreConnector.request_finished_all_groups"] == "forward_request_finished"
               for j in outer.judgements)
    by_case = {(j.context.case, j.context.path): j.verdict for j in outer.judgements}
    assert by_case[("single", "hma")] == by_case[("single", "multi")] == "safe"
    assert by_case[("hybrid", "hma")] == "unsafe"
    assert outer.violated == "NoOverwriteWhileDumpingInv" and outer.context is not None
    assert outer.context.case == "hybrid"
    cases = outer.to_json()["cases"]
    assert cases[f"hybrid[{outer.context.inner}]"]["counterexample"]["property"] == "NoOverwriteWhileDumpingInv"


def test_its_no_forward_twin_is_unsafe_on_the_hma_path_with_the_counterexample(runner: ModelRunner) -> None:
    outer = judge_files([FIXTURES / "ucm_independent_no_forward.py"], runner=runner,
                        only=["OuterStoreConnector"]).connectors["OuterStoreConnector"]
    assert (outer.verdict, outer.violated) == ("unsafe", "NoUnexpectedReportInv")
    assert outer.context is not None and outer.context.path == "hma"
    trace = outer.to_json()["counterexample"]
    assert trace["property"] == "NoUnexpectedReportInv" and len(trace["trace"]) >= 2


def _wrapper(call: str, inner_extra: str = "") -> str:
    return f"""
class Inner(KVConnectorBase_V1):
    def build_connector_meta(self, out):
        self._async_dump_req_ids.update(out.saving)
        return out
    def request_finished(self, request, block_ids):
        if request.request_id in self._async_dump_req_ids:
            self._async_dump_req_ids.discard(request.request_id)
            return True, None
        return False, None
{inner_extra}

class Outer(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, c, r):
        self.inner = Inner(c, r)
    def request_finished_all_groups(self, request, block_ids):
        return self.inner.{call}
"""


@pytest.mark.parametrize(
    ("call", "inner_extra", "label"),
    [
        # the same method: a plain forward, resolved along the inner MRO by the model
        ("request_finished_all_groups(request, block_ids)",
         "    def request_finished_all_groups(self, request, block_ids):\n"
         "        return self.request_finished(request, block_ids[0])", "forward"),
        # the alias: the call the code makes, the inner request_finished
        ("request_finished(request, block_ids[0])", "", "forward_request_finished"),
        # a method the inner class lacks: AttributeError at run time, never judged as a forward
        ("request_finished_all_groups(request, block_ids)", "", "unknown"),
    ],
)
def test_a_wrapper_is_labelled_by_the_inner_method_it_calls(call: str, inner_extra: str, label: str) -> None:
    hierarchy = build_hierarchy(read_source(_wrapper(call, inner_extra), "<test>"))
    found = EffectReader(hierarchy).forward_label("Outer", "request_finished_all_groups", "Inner")
    assert found.label == label
    if label == "unknown":
        assert "Inner does not define" in found.reasons[0]


def test_isinstance_guards_pick_the_branch_the_inner_class_takes() -> None:
    source = _wrapper("request_finished(request, block_ids[0])").replace(
        "        return self.inner.request_finished(request, block_ids[0])",
        "        if isinstance(self.inner, SupportsHMA):\n"
        "            return self.inner.request_finished_all_groups(request, block_ids)\n"
        "        return self.inner.request_finished(request, block_ids[0])",
    )
    hma_inner = source.replace("class Inner(KVConnectorBase_V1):", "class Inner(KVConnectorBase_V1, SupportsHMA):")
    plain = EffectReader(build_hierarchy(read_source(source, "<t>")))
    assert plain.forward_label("Outer", "request_finished_all_groups", "Inner").label == "forward_request_finished"
    hma = EffectReader(build_hierarchy(read_source(hma_inner, "<t>")))
    # an HMA inner takes the first branch; its request_finished_all_groups is SupportsHMA's abstract one
    assert hma.forward_label("Outer", "request_finished_all_groups", "Inner").label == "forward"
