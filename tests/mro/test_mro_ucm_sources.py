"""`deferdump mro` on UCM's own connector sources, which are not copied into this repository: the test runs
when `DEFERDUMP_UCM_SOURCES` names a folder holding one sub-folder per stage (docs/mro.md, "UCM's
connectors", shows how to fill it: `git show` for the stage before #989, the search tools or raw GitHub for
#989 and later), and is skipped otherwise. Each stage's classes get the verdicts recorded in docs/mro.md."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner, judge_files
from deferdump.tools.mro.source import read_files
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
        "UCMPDConnector": "unknown",  # get_finished raises NotImplementedError: no run gets past its first step
        "UCMMockConnector": "safe",  # Direct's
        "UCMConnector": "unknown",  # a non-HMA wrapper: unknown where it holds LayerWise or CP
    }),
    # PR #989's deferred dumps, as in the fork version the notes call POST-A (search-tool file id 60890770966):
    # wait_for_save submits and tracks, request_finished delays tracked requests, get_finished and
    # handle_preemptions wait the tasks of the requests they name
    # Each class is safe with a full-attention group and unsafe on a model whose every layer is sliding-window
    # (not SupportsHMA, so vLLM keeps that one sliding-window group and frees running requests' blocks under
    # the unfenced deferred dumps)
    "pr989": (("ucm_connector.py",), {
        "UCMDirectConnector": "unsafe",  # the PR's protocol: safe in single, multi, MLA; the sliding-window case
        "UCMLayerWiseConnector": "unsafe",  # per-layer tasks join the same pending list (two layers safe too)
        "UCMCPConnector": "unsafe",  # LayerWise's or Direct's saves; Direct's tracking
        # an expected verdict: get_finished raises NotImplementedError, the class cannot run (a crash, never a reuse)
        "UCMPDConnector": "unknown",
        "UCMMockConnector": "unsafe",  # Direct's
        "UCMLiteConnector": "unsafe",  # Direct's, plus a fake-pointer dump waited in the lookup
        # SupportsHMA wrapper: on a hybrid model the deferred inner dumps are unfenced, but __init__ may pick
        # UCMFAWAConnector / the HLA classes (other files) for hybrid layouts: unknown, never unsafe
        "UCMConnector": "unknown",
    }),
    # later: upstream hma_connector.py @04ad9662 (UCMFAWAConnector, SupportsHMA) over the #989-era base; it
    # waits its sliding-window (WA) dump in wait_for_save, keeps the full-attention (FA) one, delays every
    # finished request (request_finished_all_groups returns True) and reports every finished id after
    # waiting the tasks that name it. The model has no labels for "delay all" / "report all": unknown.
    "later": (("ucm_connector.py", "hma_connector.py"), {
        "UCMDirectConnector": "unsafe",  # as at #989
        "UCMLayerWiseConnector": "unsafe",
        "UCMCPConnector": "unsafe",
        "UCMPDConnector": "unknown",  # as at #989 (an expected verdict, not a gap)
        "UCMMockConnector": "unsafe",
        "UCMLiteConnector": "unsafe",
        "UCMFAWAConnector": "unknown",
        "UCMConnector": "unknown",  # around FAWA unknown; hybrid around Direct: the HLA classes are not analysed
    }),
}


#: stage -> (class, case key in ``--json``) -> verdict, for the cases that decide a row of docs/mro.md.
CASES: dict[str, dict[tuple[str, str], str]] = {
    "pr989": {
        ("UCMDirectConnector", "single"): "safe",
        ("UCMDirectConnector", "multi"): "safe",
        ("UCMDirectConnector", "mla"): "safe",
        ("UCMDirectConnector", "hybrid"): "unsafe",  # a model whose every layer is sliding-window
        ("UCMConnector", "single[UCMDirectConnector]"): "safe",
        ("UCMConnector", "hybrid[UCMDirectConnector]"): "unknown",  # FAWA / HLA may take hybrid layouts
        ("UCMLayerWiseConnector", "layerwise"): "safe",
    },
    "later": {
        ("UCMConnector", "single[UCMDirectConnector]"): "safe",
        ("UCMConnector", "hybrid[UCMDirectConnector]"): "unknown",  # the HLA classes may take hybrid layouts
        ("UCMConnector", "hybrid[UCMFAWAConnector]"): "unknown",
        ("UCMFAWAConnector", "hybrid"): "unknown",
        ("UCMFAWAConnector", "multi"): "unknown",  # a reader says unsafe: see docs/mro.md
    },
}

SKIP = ("DEFERDUMP_UCM_SOURCES is not set: UCM's sources are read, never copied here; fill a folder with one "
        "sub-folder per stage (pre/, pr989/, later/) as docs/mro.md, \"UCM's connectors\", shows, and point "
        "DEFERDUMP_UCM_SOURCES at it")


@pytest.mark.skipif(ROOT is None, reason=SKIP)
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
    cases = {(cls, j.context.key): j for cls, c in report.connectors.items() for j in c.judgements}
    for key, verdict in CASES.get(stage, {}).items():
        assert cases[key].verdict == verdict, (key, cases[key].verdict, cases[key].reasons)
    for judgement in report.connectors.values():
        stops = all(any("in every step" in r for r in j.reasons) for j in judgement.judgements)
        if judgement.verdict != "safe" and not stops:  # a class that cannot run has no counterexample to show
            assert judgement.deciding is not None and judgement.deciding.counterexample is not None


def _labels(path: Path) -> dict[tuple[str, str | None, str], list[tuple[str, str, str]]]:
    """Every definition label of every connector, for each inner class and with and without a hybrid model."""
    hierarchy = build_hierarchy(read_files([path]))
    judge = Judge(hierarchy, ModelRunner(ModelBounds(), timeout=300))
    out: dict[tuple[str, str | None, str], list[tuple[str, str, str]]] = {}
    for cls in hierarchy.connectors:
        inners, reasons = judge.inner_choices(cls)
        for inner in inners:
            for case in ("single", "hybrid"):
                out[(cls, inner, case)] = sorted(
                    (l.owner, l.method, l.label) for l in judge._labels(cls, inner, reasons, case))
    return out


@pytest.mark.skipif(ROOT is None, reason=SKIP)
def test_module_level_code_outside_connector_classes_changes_no_label(tmp_path: Path) -> None:
    """Why excerpts suffice (docs/mro.md): the full `pre` file and the same file without its module-level
    functions and non-connector classes (KVCacheLayout, RequestHasher) get the same labels everywhere."""
    assert ROOT is not None
    full = Path(ROOT) / "pre" / "ucm_connector.py"
    tree = ast.parse(full.read_text())
    tree.body = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and not (isinstance(n, ast.ClassDef) and n.name in ("KVCacheLayout", "RequestHasher"))]
    trimmed = tmp_path / "ucm_connector.py"
    trimmed.write_text(ast.unparse(tree))
    assert len(trimmed.read_text()) < len(full.read_text())
    assert _labels(trimmed) == _labels(full)
