"""Assertions shared by the `deferdump mro` tests."""
from __future__ import annotations

from typing import Any

__all__ = ["assert_safe_but_on_sliding_window"]


def assert_safe_but_on_sliding_window(judgement: Any) -> None:
    """PR #989's protocol without a fence, off the HMA path: safe in every case with a full-attention group,
    unsafe only on a model whose every layer is sliding-window (vLLM keeps that group without `SupportsHMA`
    and frees running requests' out-of-window blocks under the deferred dumps)."""
    cases = {j.context.key: j.verdict for j in judgement.judgements}
    assert judgement.verdict == "unsafe", cases
    assert judgement.context is not None and judgement.context.case == "hybrid", cases
    assert judgement.context.path != "hma" and judgement.violated == "NoOverwriteWhileDumpingInv", cases
    assert all(verdict == "safe" for key, verdict in cases.items() if not key.startswith("hybrid")), cases
