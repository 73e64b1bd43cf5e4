"""`deferdump mro` on UCM's own connector sources, which are not copied into this repository: the test runs
when `DEFERDUMP_UCM_SOURCES` names a folder holding one sub-folder per stage (docs/mro.md, "UCM's
connectors", shows how to fill it with `git show`), and is skipped otherwise. Each stage's classes get the
verdicts recorded in docs/mro.md."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from deferdump.tools.mro.judge import ModelRunner, judge_files
from deferdump.tools.mro.tla import ModelBounds

pytestmark = pytest.mark.slow

ROOT = os.environ.get("DEFERDUMP_UCM_SOURCES")

#: stage folder -> the files judged together -> connector class -> verdict (docs/mro.md, "UCM's connectors").
STAGES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    # before #989 (upstream cdd44067): synchronous dumps, wait_for_save waits its own tasks
    "pre": (("ucm_connector.py",), {
        "UCMDirectConnector": "safe",  # wait_for_save submits one task and waits it in the same call
        "UCMLayerWiseConnector": "unknown",  # its wait loop sits in a try: one failed wait ends it early
        "UCMCPConnector": "unknown",  # the LayerWise saves when use_layerwise
        "UCMPDConnector": "safe",  # Direct's synchronous save; get_finished raises
        "UCMMockConnector": "safe",  # Direct's
        "UCMConnector": "unknown",  # a non-HMA wrapper: unknown where it holds LayerWise or CP
    }),
}


@pytest.mark.skipif(ROOT is None, reason="DEFERDUMP_UCM_SOURCES is not set: UCM's sources are read, never copied here")
@pytest.mark.parametrize("stage", sorted(STAGES))
def test_ucm_stage_gets_the_recorded_verdicts(stage: str) -> None:
    assert ROOT is not None
    files, expected = STAGES[stage]
    paths = [Path(ROOT) / stage / name for name in files]
    missing = [str(p) for p in paths if not p.is_file()]
    assert not missing, f"materialize the stage first (docs/mro.md): {missing}"
    report = judge_files(paths, runner=ModelRunner(ModelBounds(), timeout=300))
    verdicts = {cls: j.verdict for cls, j in report.connectors.items()}
    assert verdicts == expected, {cls: (j.verdict, j.violated, j.context and j.context.key, j.reasons)
                                  for cls, j in report.connectors.items()}
    for judgement in report.connectors.values():
        if judgement.verdict != "safe":
            assert judgement.deciding is not None and judgement.deciding.counterexample is not None
