"""`deferdump mro` on the connectors written for `deferdump watch` (tests/fixtures/watch), never shown to the
reading rules: whatever it says, never the opposite of what the class does in real vLLM (where the watch
decides each: tests/vllm/test_vllm_watch.py, tests/vllm/test_vllm_watch_styles.py)."""
from __future__ import annotations

import pytest

from deferdump.tools.mro.judge import ModelRunner, judge_files
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES

pytestmark = pytest.mark.slow  # TLC runs: tests/conftest.py starts it early

WATCH = FIXTURES / "watch"
#: the class, and the verdict that would be wrong (the watch shows the class safe / unsafe in real vLLM)
CASES = [
    ("watch_test_connectors.py", "AsyncSaveConnector", "unsafe"),
    ("watch_test_connectors.py", "FreeBeforeCopyConnector", "safe"),
    ("futures_connectors.py", "FuturesEagerFreeConnector", "safe"),
]


@pytest.mark.parametrize(("source", "cls", "wrong"), CASES)
def test_no_verdict_opposite_to_the_real_run(source: str, cls: str, wrong: str) -> None:
    verdict = judge_files([WATCH / source], only=[cls], runner=ModelRunner(ModelBounds(), timeout=300)).connectors[cls]
    assert verdict.verdict != wrong, verdict
    if verdict.verdict == "unknown":  # today: each case names what the rules cannot read
        assert all(j.reasons for j in verdict.judgements if j.verdict == "unknown")
