"""Every generated trace of every conformance model, replayed on the reference connector as its own test.

The traces are edge covers of the shipped manifest's CI conformance models and of the small fixture
configs (tests/fixtures/conformance/deferdump); they are generated once per session
(support.conformance.deferdump_traces). A failing trace shows up as ``test_trace_conforms[<model>/<file>]``
with the divergence (step, action, diff) as the message.
"""
from __future__ import annotations

import pytest

from support.conformance import (
    LOADER,
    all_deferdump_traces,
    conformance_entry,
    conformance_model_names,
    generated,
)
from deferdump.conformance.drivers import default_driver_factory
from deferdump.conformance.replay import load_traces, replay_loaded
from deferdump.conformance.tracegen import model_graph



def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "trace_file" in metafunc.fixturenames:
        files = all_deferdump_traces()
        metafunc.parametrize("trace_file", files, ids=[f"{p.parent.name}/{p.name}" for p in files])


def test_trace_conforms(trace_file):
    (trace, _), = load_traces([trace_file], default_driver_factory, LOADER)
    report = replay_loaded([trace], coverage=False, shrink=False)
    assert report.ok, "\n".join(divergence.describe() for divergence in report.failed)
    assert report.steps >= 1


@pytest.mark.parametrize("model", conformance_model_names())
def test_cover_traces_take_every_edge_and_action(model):
    """The edge cover reaches every edge and action of the model's state graph (each trace above replays it)."""
    result = generated(model)
    graph = model_graph(conformance_entry(model))
    assert result.covered_edges == result.edges == graph.num_edges
    labels = graph.action_labels()
    assert {"schedule", "execute_model", "update_from_output", "engine_step", "task_complete"} & labels
    assert result.traces == len(result.files) and max(result.lengths) >= 2


def test_shipped_covers_reach_the_protocol_core_target():
    """Conformance alone (the shipped models' edge covers, as `deferdump verify` replays them)
    takes >= 95 % of the protocol core's branches; the one arc left is named in docs/conformance.md."""
    from support.conformance import manifest_conformance_entries, shipped_deferdump_traces
    from deferdump.conformance.corecov import core_for_variants, measure_core_coverage
    from deferdump.conformance.verify import VARIANT_NAMES

    loaded = load_traces(shipped_deferdump_traces(), default_driver_factory, LOADER)
    for _, driver in loaded:
        driver.close()
    traces = [trace for trace, _ in loaded]
    core = core_for_variants({VARIANT_NAMES[e.variant] for e in manifest_conformance_entries()})
    report, measured = measure_core_coverage(lambda: replay_loaded(traces, shrink=False, coverage=False), core)
    assert report.ok
    assert measured.branch_coverage is not None and measured.branch_coverage >= 0.95, measured.missed
    assert all("LayerWiseConnector.clear_connector_metadata" in line for line in measured.missed), measured.missed
