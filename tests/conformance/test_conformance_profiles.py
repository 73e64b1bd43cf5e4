"""Implementation profiles: every shipped trace conforms under each one, and each takes its own connector path.

The profiles (conformance/profiles.py) change settings the model's observable state must not depend on;
the tests replay real cover traces of the shipped models under each profile and measure, with the same
coverage.py machinery as ``deferdump verify``, that cycling them reaches the connector branches the
default configuration leaves out.
"""
from __future__ import annotations

import pytest

from support.conformance import DecodedLoader, deferdump_traces
from deferdump.conformance.corecov import core_for_variants, measure_core_coverage
from deferdump.conformance.deferdump_driver import DeferDumpDriver, ModelConstants
from deferdump.conformance.drivers import default_driver_factory
from deferdump.conformance.profiles import DEFAULT_PROFILE, PROFILES, ImplProfile, profile_for
from deferdump.conformance.replay import load_traces, replay_loaded
from deferdump.reference.connectors import CPConnector
from deferdump.tools.tlc.values import ItfTrace

SAMPLE = 24  # traces per model: a multiple of len(PROFILES), so every profile runs on each model


def _preempts(trace: ItfTrace) -> bool:
    return any(len(phase.get("preempted", ())) > 0 for state in trace.states[1:]
               for phase in (state["action"]["phases"] if state["action"]["name"] == "engine_step"
                             else [state["action"]]))


@pytest.fixture(scope="module")
def sample() -> list[ItfTrace]:
    """The first traces of the one-rank chunked model and the preempting traces of PreemptConformance."""
    loaded = load_traces([*deferdump_traces("DirectChunkedConformance")[:SAMPLE],
                          *deferdump_traces("PreemptConformance")], default_driver_factory,
                         DecodedLoader(["DirectChunkedConformance", "PreemptConformance"]))
    for _, driver in loaded:
        driver.close()
    traces = [trace for trace, _ in loaded]
    chunked = traces[:SAMPLE]
    preempting = [t for t in traces[SAMPLE:] if _preempts(t)][:SAMPLE]
    assert len(preempting) == SAMPLE
    return chunked + preempting


def test_profiles_cycle_by_trace_index(sample):
    assert {profile_for(trace).name for trace in sample} == {profile.name for profile in PROFILES}
    index = sample[5].meta["trace"]
    assert profile_for(sample[5]) == PROFILES[index % len(PROFILES)]


@pytest.mark.parametrize("profile", PROFILES, ids=[p.name for p in PROFILES])
def test_every_sampled_trace_conforms_under_each_profile(sample, profile: ImplProfile):
    def factory(trace: ItfTrace) -> DeferDumpDriver:
        return DeferDumpDriver(ModelConstants.from_trace(trace), profile)

    report = replay_loaded(sample, driver_factory=factory, coverage=False, shrink=False)
    assert report.ok, "\n".join(d.describe() for d in report.failed)
    assert report.steps > 2 * SAMPLE


def test_profile_settings_reach_the_connectors(sample):
    by_name = {p.name: p for p in PROFILES}
    chunked = ModelConstants.from_trace(sample[0])
    cp = DeferDumpDriver(chunked, by_name["cp-direct+set-api"])
    cp.reset(sample[0].states[0])
    assert isinstance(cp.workers[0].inner, CPConnector) and not cp.workers[0].inner.config.use_layerwise
    quiet = DeferDumpDriver(chunked, by_name["no-event-sync"])
    assert "live" not in quiet.observed and quiet.config.verify_dumps and not quiet.config.enable_event_sync
    assert "live" in DeferDumpDriver(chunked, DEFAULT_PROFILE).observed


def test_cycling_profiles_reaches_branches_the_default_leaves_out(sample):
    core = core_for_variants({"direct", "cp"})

    def fixed(trace: ItfTrace) -> DeferDumpDriver:
        return DeferDumpDriver(ModelConstants.from_trace(trace), DEFAULT_PROFILE)

    def run(factory):
        return measure_core_coverage(lambda: replay_loaded(sample, driver_factory=factory, shrink=False), core)

    default_report, default_core = run(fixed)
    cycled_report, cycled_core = run(default_driver_factory)
    assert default_report.ok and cycled_report.ok
    gained = set(default_core.missed) - set(cycled_core.missed)
    assert cycled_core.covered_branches > default_core.covered_branches
    for where in ("handle_preemptions", "_release_dump_event_handle", "_submit_dump",
                  "CPConnector.wait_for_save", "CPConnector.save_kv_layer"):
        assert any(where in line for line in gained), (where, sorted(gained))
