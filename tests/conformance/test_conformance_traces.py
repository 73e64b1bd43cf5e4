"""Every generated trace of every conformance model, replayed on the reference connector, one test per model.

The traces are edge covers of the shipped manifest's CI conformance models and of the small fixture
configs (tests/fixtures/conformance/deferdump). Nothing runs TLC at collection: the ``cover_traces``
session fixture fills the on-disk trace cache (support.tracecache, keyed by the spec's content) for
every model at once, and each model's test replays all its traces. A failure names every diverging
trace with its step, action and state diff.
"""
from __future__ import annotations

import pytest

from support.conformance import (
    conformance_model_names,
    deferdump_traces,
    generated,
    graph_summary,
    loaded_traces,
    prefetch_covers,
    shipped_loaded_traces,
)
from deferdump.conformance.replay import replay_loaded

MODELS = conformance_model_names()  # the manifest only: no TLC at collection


@pytest.fixture(scope="session")
def cover_traces() -> None:
    """Every model's edge cover, from the trace cache, generated where missing (TLC runs in parallel)."""
    prefetch_covers(MODELS)


@pytest.mark.parametrize("model", MODELS)
def test_every_trace_conforms(cover_traces: None, model: str) -> None:
    files = deferdump_traces(model)
    report = replay_loaded(loaded_traces(model), coverage=False, shrink=False)
    assert report.ok, (f"{model}: {len(report.failed)} of {len(files)} trace(s) diverged\n"
                       + "\n".join(divergence.describe() for divergence in report.failed))
    assert report.traces == report.passed == len(files) > 0
    assert min(generated(model).lengths) >= 2 and report.steps >= len(files)  # every trace takes a step


@pytest.mark.parametrize("model", MODELS)
def test_cover_traces_take_every_edge_and_action(cover_traces: None, model: str) -> None:
    """The edge cover reaches every edge and action of the model's state graph (each trace above replays it)."""
    result = generated(model)
    graph = graph_summary(model)
    assert result.covered_edges == result.edges == graph["edges"]
    labels = set(graph["action_labels"])
    assert {"schedule", "execute_model", "update_from_output", "engine_step", "task_complete"} & labels
    assert result.traces == len(result.files) and max(result.lengths) >= 2


def test_shipped_covers_reach_the_protocol_core_target(cover_traces: None) -> None:
    """Conformance alone (the shipped models' edge covers, as `deferdump verify` replays them)
    takes >= 95 % of the protocol core's branches; the arcs left are named in docs/conformance.md."""
    from support.conformance import manifest_conformance_entries
    from deferdump.conformance.corecov import core_for_variants, measure_core_coverage
    from deferdump.conformance.verify import VARIANT_NAMES

    traces = shipped_loaded_traces()
    core = core_for_variants({VARIANT_NAMES[e.variant] for e in manifest_conformance_entries()})
    report, measured = measure_core_coverage(lambda: replay_loaded(traces, shrink=False, coverage=False), core)
    assert report.ok
    assert measured.branch_coverage is not None and measured.branch_coverage >= 0.95, measured.missed
    # left (docs/conformance.md): leftover layer loads, and a load failure under policy "recompute" (no
    # conformance model plays one; tests/reference/test_reference_failed_load_dumps.py drives those arcs)
    left = ("LayerWiseConnector.clear_connector_metadata", "DirectConnector._dumping_requests")
    assert all(any(name in line for name in left) for line in measured.missed), measured.missed
