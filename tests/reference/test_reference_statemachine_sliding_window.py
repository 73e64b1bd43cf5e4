"""Property test on hybrid models: the real connector inside the simulated vLLM engine with a
full-attention and a sliding-window KV-cache group, where blocks that leave the window are freed while
their request runs and handed out again at once (vLLM 0.32's `remove_skipped_blocks`, docs/engine.md).

With the default fence (`hybrid_fence="freed"`) every invariant holds and every stored byte is right;
with the coarse fence ("all_on_free") the safety invariants hold and only its known cost shows (waits of
tasks that read no freed block: `PreemptWaitsOnlyPreemptedInv`, as the spec's SlidingWindowDrainOverWaits
finds); with no fence ("none", UCM #989 as merged) the same search finds the overwrite, in the invariant
watch and in the bytes the late-copy device hands the store.
"""
from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

import pytest

from deferdump.reference.invariants import InvariantViolation
from support.statemachine import SlidingWindowMachine, hybrid_machine

TestSlidingWindowProtocol = SlidingWindowMachine.TestCase

_AllOnFree = hybrid_machine("all_on_free", tolerated=("PreemptWaitsOnlyPreemptedInv",))
TestSlidingWindowCoarseFence = _AllOnFree.TestCase
TestSlidingWindowCoarseFence.settings = settings(TestSlidingWindowCoarseFence.settings, max_examples=500)


def test_without_the_fence_the_search_finds_the_overwrite() -> None:
    test = hybrid_machine("none").TestCase("runTest")
    test.settings = settings(
        max_examples=500, stateful_step_count=30, deadline=None, phases=[Phase.generate], database=None,
        suppress_health_check=list(HealthCheck),
    )
    with pytest.raises(InvariantViolation) as caught:
        test.runTest()
    found = str(caught.value)
    assert "NoOverwriteWhileDumpingInv" in found or "StoredBytes" in found, found
