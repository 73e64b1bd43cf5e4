"""Assertions shared by the `deferdump mro` tests."""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner, MroReport
from deferdump.tools.mro.run.runner import RunBudget
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds

__all__ = ["QUICK_RUN", "QUIET_METHODS", "RUN_TIMEOUT", "assert_safe_but_on_sliding_window", "edited_label",
           "judge_cases"]

#: The connector methods a `--run` test class leaves doing nothing (no loads, nothing per layer), as class-body source
#: at one level of indentation: a class that defines the rest of its protocol around them can be built and run.
QUIET_METHODS = """
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass
    def start_load_kv(self, forward_context, **kwargs):
        pass
    def wait_for_layer_load(self, layer_name):
        pass
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass
"""

#: Seconds the `--run` tests allow one replay or exploration child (`run_report`'s ``timeout``; the CLI's default is
#: 60). What they check is what the class does, not how fast: on a loaded machine (`make test`'s workers beside other
#: work) 300 sampled replays took over 60 s and a case that should end ``diverged`` ended ``not_runnable`` ("did not
#: end within 60 s"), failing two tests of stop 53's code here. A class that truly blocks still ends there.
RUN_TIMEOUT = 300.0

#: The `--run` budget of tests whose cases either find their hazard early or must find none: a case that finds none
#: spends its whole budget (the CLI's 300 sampled and 200 explored schedules took most of the `--run` tests' time,
#: docs/testing.md "Where make test's time goes"), and a smaller one checks the same claims on fewer schedules.
QUICK_RUN = RunBudget(sampled=60, explored=40)


def judge_cases(paths: Sequence[Path], cases: Mapping[str, Collection[str]]) -> MroReport:
    """The report ``judge_files`` gives, judging only the named cases (context keys: ``single``, ``hybrid``…) of
    the named classes (``Judge.judge``'s ``cases``). For `--run` tests that check a few cases of a file: running a
    case costs TLC's sampling, the replays and the explorer (half a minute and more), every case of a file many
    minutes."""
    hierarchy = build_hierarchy(read_files(list(paths), None), sources=[str(p) for p in paths])
    judge = Judge(hierarchy, ModelRunner(ModelBounds(), 300))
    return MroReport(hierarchy, {cls: judge.judge(cls, keys) for cls, keys in cases.items()}, 0, 0, 0.0)


def assert_safe_but_on_sliding_window(judgement: Any) -> None:
    """PR #989's protocol without a fence, off the HMA path: safe in every case with a full-attention group,
    unsafe only on a model whose every layer is sliding-window (vLLM keeps that group without `SupportsHMA`
    and frees running requests' out-of-window blocks under the deferred dumps)."""
    cases = {j.context.key: j.verdict for j in judgement.judgements}
    assert judgement.verdict == "unsafe", cases
    assert judgement.context is not None and judgement.context.case == "hybrid", cases
    assert judgement.context.path != "hma" and judgement.violated == "NoOverwriteWhileDumpingInv", cases
    assert all(verdict == "safe" for key, verdict in cases.items() if not key.startswith("hybrid")), cases


def edited_label(tmp_path: Path, source: Path, edit: tuple[str, str], cls: str, owner: str,
                 method: str) -> tuple[str, tuple[str, ...]]:
    """The label (and its reasons) of ``owner``'s ``method`` as ``cls`` runs it, in a copy of ``source`` with one
    edit (``old``, which must be there, replaced once by ``new``): a rule's case and its opposite in one file."""
    text = source.read_text(encoding="utf-8")
    assert edit[0] in text, edit[0]
    path = tmp_path / source.name
    path.write_text(text.replace(*edit, 1), encoding="utf-8")
    label = Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 60)).reader.label(cls, owner, method)
    return label.label, label.reasons
