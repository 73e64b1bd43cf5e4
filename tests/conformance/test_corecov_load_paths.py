"""The asynchronous-load branches inside the protocol core's methods are counted in its coverage, and conformance
takes them: AsyncLoadConformance's edge cover (move `async_loads`) replays a parked request's load sent by
`build_connector_meta` and an abort answered by `request_finished` while the load runs, and the steps without them."""
from __future__ import annotations

import inspect

import pytest

from support.conformance import loaded_traces, prefetch_covers
from deferdump.conformance.corecov import core_for_variants, measure_core_coverage
from deferdump.conformance.replay import replay_loaded
from deferdump.reference import connectors

pytestmark = pytest.mark.slow

MODEL = "AsyncLoadConformance"
ASYNC_BRANCHES = (
    "for req_id, plan in self._request_plans.items():",  # build_connector_meta: a parked request's load
    "if request.req_id in self._recving_req_ids:",  # request_finished: an abort while the load runs
)


def _line(text: str) -> int:
    lines = inspect.getsource(connectors).splitlines()
    found = [number for number, line in enumerate(lines, start=1) if line.strip() == text]
    assert len(found) == 1, text
    return found[0]


def test_no_core_line_is_excluded_from_the_coverage() -> None:
    assert "corecov" not in inspect.getsource(connectors)


def test_the_async_load_cover_takes_both_arcs_of_each_async_branch_in_the_core() -> None:
    prefetch_covers([MODEL])
    traces = loaded_traces(MODEL)
    report, measured = measure_core_coverage(lambda: replay_loaded(traces, coverage=False, shrink=False),
                                             core_for_variants({"direct"}))
    assert report.ok and report.traces > 0
    for text in ASYNC_BRANCHES:
        number = _line(text)
        assert measured.statements > 100
        assert not [m for m in measured.missed if f"line {number} " in m or f"branch {number} ->" in m], measured.missed


def test_a_cover_without_async_loads_misses_them() -> None:
    """The check above can fail: LookupConformance (synchronous hits) never takes the parked-load arc."""
    prefetch_covers(["LookupConformance"])
    traces = loaded_traces("LookupConformance")
    _, measured = measure_core_coverage(lambda: replay_loaded(traces, coverage=False, shrink=False),
                                        core_for_variants({"direct"}))
    number = _line(ASYNC_BRANCHES[1])
    assert [m for m in measured.missed if f"branch {number} ->" in m or f"line {number + 1} " in m], measured.missed
