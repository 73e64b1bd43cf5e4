"""Hybrid models with asynchronous loads under conformance: HybridAsyncLoadConformance's edge cover on the
reference connector (`load_async`, two KV-cache groups).

The cover itself is replayed by test_conformance_traces.py (every shipped conformance model). Here: replay
catches implementation mutants of the hybrid receive side, each with a divergence that names what broke.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from support.conformance import loaded_traces, prefetch_covers, rank_calls, steps_of
from deferdump.conformance.replay import replay_loaded
from deferdump.reference.connectors import DirectConnector
from deferdump.reference.groups import group_key
from deferdump.tools.tlc.values import ItfTrace

pytestmark = pytest.mark.slow

MODEL = "HybridAsyncLoadConformance"
_ORIGINAL_ROWS = DirectConnector._group_rows
_ORIGINAL_ERROR = DirectConnector._record_async_load_error


@pytest.fixture(scope="module")
def traces() -> tuple[ItfTrace, ...]:
    prefetch_covers([MODEL])
    return loaded_traces(MODEL)


def first_group_only(self, keys: Sequence[bytes], block_ids: Sequence[int], group_block_ids: Any):
    """The sliding-window group's blocks are never loaded (nor dumped): only the full-attention rows."""
    return _ORIGINAL_ROWS(self, keys, block_ids, ())


def null_block_loaded(self, keys: Sequence[bytes], block_ids: Sequence[int], group_block_ids: Any):
    """The out-of-window positions are loaded too: into vLLM's null block, which every request shares."""
    rows = [(0, list(keys), list(block_ids))]
    for group, ids in enumerate(group_block_ids, start=1):
        rows.append((group, [group_key(key, group) for key in keys][:len(ids)], list(ids)))
    return rows


def failure_as_block_errors(self, req_id: str, block_ids: Sequence[int], exc: BaseException) -> None:
    """A failed load reported as block errors, which vLLM 0.32 refuses on a hybrid model (it raises)."""
    self._record_load_error(block_ids, exc)


MUTANTS = [
    pytest.param("_group_rows", first_group_only, "start_load_kv submitted loads", id="sliding-window-group-not-loaded"),
    pytest.param("_group_rows", null_block_loaded, "null block", id="null-block-loaded"),
    pytest.param("_record_async_load_error", failure_as_block_errors, "get_transfer_results: failed_recving",
                 id="failure-reported-as-block-errors"),
]


def test_the_cover_replays_and_loads_both_groups(traces: tuple[ItfTrace, ...]) -> None:
    report = replay_loaded(traces, stop_first=True, shrink=False, coverage=True)
    assert not report.failed, report.failed[0].describe()
    loads = [call for trace in traces for state in trace.states for phase in steps_of(state["action"])
             for _, call in rank_calls(phase, "start_load_kv")]
    blocks = {b for call in loads for _, b in call["submitted"]}
    assert len(blocks) == 3, "the cover never loads the three real blocks of a hybrid hit"


@pytest.mark.parametrize("method, mutant, diff_mentions", MUTANTS)
def test_hybrid_receive_mutant_is_caught(traces, monkeypatch, method, mutant, diff_mentions) -> None:
    monkeypatch.setattr(DirectConnector, method, mutant)
    report = replay_loaded(traces, stop_first=True, shrink=False, coverage=False)
    assert len(report.failed) == 1, f"the mutant survived every {MODEL} trace"
    divergence = report.failed[0]
    assert any(diff_mentions in line for line in divergence.diff), divergence.describe()

