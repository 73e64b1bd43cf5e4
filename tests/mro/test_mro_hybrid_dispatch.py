"""A SupportsHMA wrapper whose inner class for hybrid layouts may be one the analysed files do not define:
the hybrid-model violation found with the local inner class is `unknown` (that inner class may never serve a
hybrid model), while the same wrapper with every inner class analysed stays `unsafe` (corpus:
`wrapper_over_deferred.py`). Real TLC."""
from __future__ import annotations

import pytest

from deferdump.tools.mro.judge import ModelRunner, judge_files
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES

pytestmark = pytest.mark.slow


def test_hybrid_case_with_an_unanalysed_alternative_inner_is_unknown_not_unsafe() -> None:
    report = judge_files([FIXTURES / "mro" / "hybrid_dispatch.py"], only=["LayoutDispatchWrapper"],
                         runner=ModelRunner(ModelBounds(), timeout=300))
    outer = report.connectors["LayoutDispatchWrapper"]
    cases = {j.context.key: j for j in outer.judgements}
    hybrid = cases["hybrid[LocalDeferred]"]
    assert hybrid.verdict == "unknown" and hybrid.violated == "NoOverwriteWhileDumpingInv"
    assert any("WindowAwareConnector" in r and "hybrid" in r for r in hybrid.reasons)
    assert hybrid.counterexample is not None  # the trace it would take, shown, not claimed
    assert cases["single[LocalDeferred]"].verdict == "safe"
    assert outer.verdict == "unknown"


def test_the_same_wrapper_with_every_inner_analysed_stays_unsafe_on_a_hybrid_model() -> None:
    report = judge_files([FIXTURES / "mro" / "corpus" / "wrapper_over_deferred.py"], only=["HMAWrapper"],
                         runner=ModelRunner(ModelBounds(), timeout=300))
    outer = report.connectors["HMAWrapper"]
    assert (outer.verdict, outer.violated) == ("unsafe", "NoOverwriteWhileDumpingInv")
    assert outer.context is not None and outer.context.case == "hybrid"
