"""Every generated trace of every conformance model, replayed on the reference connector, one test per model.

The traces are edge covers of the shipped manifest's CI conformance models and of the small fixture
configs (tests/fixtures/conformance/deferdump). Nothing runs TLC at collection: the ``cover_traces``
session fixture fills the on-disk trace cache (support.tracecache, keyed by the spec's content) for
every model at once, and each model's test replays all its traces. A failure names every diverging
trace with its step, action and state diff.

Implementation mutants (monkeypatched, no flags in product code) live in this file too, so that one
xdist worker decodes the shipped traces once for both: conformance replay catches each one. The
edge-cover traces of the shipped CI conformance models (what ``deferdump verify`` replays, no test
fixture) are replayed, stopping at the first failing trace; the divergence must sit at the first step of
that trace where the mutated behaviour is observable, computed from the trace itself, and in the shipped
model expected to expose it (MLA ranks only exist in MLAConformance, preemption only in PreemptConformance,
store hits and untracked finishes only in the lookup models).
"""
from __future__ import annotations

import pytest

from support.conformance import (
    conformance_model_names,
    deferdump_traces,
    first_step,
    generated,
    graph_summary,
    loaded_traces,
    manifest_conformance_entries,
    prefetch_covers,
    rank_calls,
    shipped_loaded_traces,
)
from support.verify_report import verify_report
from deferdump.conformance.corecov import CORE_BRANCH_TARGET, CoreCoverage, core_for_variants, measure_core_coverage
from deferdump.conformance.replay import ReplayReport, replay_loaded
from deferdump.conformance.verify import VARIANT_NAMES
from deferdump.reference.connectors import DirectConnector, OuterConnector
from deferdump.tools.tlc.values import load_itf

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

MODELS = conformance_model_names()  # the manifest only: no TLC at collection


@pytest.fixture(scope="session")
def cover_traces() -> None:
    """Every model's edge cover, from the trace cache, generated where missing (TLC runs in parallel)."""
    prefetch_covers(MODELS)


@pytest.fixture(scope="module")
def shipped_replays(cover_traces: None) -> dict[str, ReplayReport]:
    """Each shipped model's traces replayed once (the per-model test reads its report)."""
    return {e.name: replay_loaded(loaded_traces(e.name), coverage=False, shrink=False)
            for e in manifest_conformance_entries()}


@pytest.mark.parametrize("model", MODELS)
def test_every_trace_conforms(shipped_replays: dict[str, ReplayReport], model: str) -> None:
    files = deferdump_traces(model)
    report = shipped_replays.get(model) or replay_loaded(loaded_traces(model), coverage=False, shrink=False)
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


def _measured_core_coverage() -> CoreCoverage:
    """The shipped models' edge covers replayed under coverage.py, as `deferdump verify` replays them."""
    entries = manifest_conformance_entries()
    shipped_loaded_traces()  # decoded before coverage starts: only the replay is measured
    core = core_for_variants({VARIANT_NAMES[e.variant] for e in entries})
    reports, measured = measure_core_coverage(
        lambda: {e.name: replay_loaded(loaded_traces(e.name), coverage=False, shrink=False) for e in entries}, core)
    assert set(reports) == {e.name for e in entries}
    assert all(report.ok and report.traces > 0 for report in reports.values())
    return measured


@pytest.mark.verify
def test_shipped_covers_reach_the_protocol_core_target(cover_traces: None) -> None:
    """Conformance alone (the shipped models' edge covers, as `deferdump verify` replays them)
    takes >= 95 % of the protocol core's branches; the arcs left are named in docs/conformance.md.
    Under `make verify`, judged on the coverage its `deferdump verify` run measured."""
    report = verify_report()
    if report is None:
        measured = _measured_core_coverage()
        branch_coverage, missed = measured.branch_coverage, measured.missed
    else:
        assert {row["model"] for row in report["conformance"]} == {e.name for e in manifest_conformance_entries()}
        assert all(row["ok"] and row["replay"]["traces"] > 0 for row in report["conformance"])
        branch_coverage, missed = report["core_coverage"]["branch_coverage"], report["core_coverage"]["missed"]
    assert branch_coverage is not None and branch_coverage >= CORE_BRANCH_TARGET, missed
    # left (docs/conformance.md): leftover layer loads, and a load failure under policy "recompute" (no
    # conformance model plays one; tests/reference/test_reference_failed_load_dumps.py drives those arcs)
    left = ("LayerWiseConnector.clear_connector_metadata", "DirectConnector._dumping_requests")
    assert all(any(name in line for name in left) for line in missed), missed


# ------------------------------------------------------------------ implementation mutants

def no_tracking(self, metadata):  # build_connector_meta without _track_async_dump_requests
    return None


def wrapper_drops_request_finished(self, request, block_ids):  # the pre-PR outer UCMConnector
    return False, None


def no_wait_on_preemption(self, meta_or_ids):  # base KVConnectorBase_V1.handle_preemptions
    return None


def report_before_wait(self, finished_req_ids):
    async_finished = set(finished_req_ids) & self._async_dump_req_ids
    if not async_finished:
        return None, None
    self._async_dump_req_ids -= async_finished  # reported, but the overlapping tasks stay pending
    return async_finished, None


def track_after_mla_return(self):
    self._poll_pending_dump_tasks()
    if not self._dumps_on_this_rank():
        return  # ranks other than 0 never track: they never report
    self._track_bound_dump_requests()
    req_ids, hashes, block_ids = self._dumping_requests()
    if hashes:
        self._submit_dump(self._store_keys(hashes), block_ids, req_ids, None)


def release_only_on_success(self, pending):
    self._store.wait(pending.task, self.config.wait_timeout_s)  # a raising wait skips the release
    if pending.payload is not None and self._device is not None:
        self._device.settle(pending.payload)
    self._release_dump_event_handle(pending)


def delay_every_request(self, request, block_ids):  # LMCache MP's answer: (True, None) whatever was saved
    self._async_dump_req_ids.discard(request.req_id)
    return True, None


_ORIGINAL_AFTER_ALLOC = DirectConnector.update_state_after_alloc


def hit_never_loaded(self, request, block_ids, num_external_tokens, *groups):  # the announced hit is not loaded
    return _ORIGINAL_AFTER_ALLOC(self, request, block_ids, 0, *groups)


def shutdown_without_drain(self):  # the KVConnectorBase_V1 default: shutdown does nothing
    return None


def _shutdown_waits(phase):
    return phase["name"] == "shutdown" and any(len(records) > 0 for records in phase["ranks"].values())


def _call(phase, name):
    """The phase's call record named ``name`` (async-load phases record more calls before it)."""
    return next(call for call in phase["calls"] if call["name"] == name)


def _untracked_finish(phase):
    if phase["name"] != "update_from_output":
        return False
    call = _call(phase, "request_finished")
    return len(call["reqs"]) > len(call["ucm_delayed"])


def _hit(phase):
    return phase["name"] == "schedule" and any(a["hit"] for a in phase["allocated"])


def _tracks(phase):
    return phase["name"] == "schedule" and len(_call(phase, "build_connector_meta")["tracked"]) > 0


def _delays(phase):
    return phase["name"] == "update_from_output" and len(_call(phase, "request_finished")["ucm_delayed"]) > 0


def _preempt_waits(phase):
    return any(len(call["waited"]) > 0 for _, call in rank_calls(phase, "handle_preemptions"))


def _finish_waits(phase):
    return any(len(call["waited"]) > 0 for _, call in rank_calls(phase, "get_finished"))


def _non_dumping_rank_tracks(phase):
    return any(rank != 0 and len(call["tracked"]) > 0 for rank, call in rank_calls(phase, "wait_for_save"))


def _failed_wait(phase):
    records = [r for name, key in (("handle_preemptions", "waited"), ("get_finished", "waited"),
                                   ("wait_for_save", "reaped")) for _, call in rank_calls(phase, name)
               for r in call[key]]
    return any(record["outcome"] == "error" for record in records)


SHIPPED = {"DirectConformance", "LayerWiseConformance", "CPConformance", "DirectChunkedConformance",
           "MLAConformance", "PreemptConformance", "LookupConformance", "CPLookupConformance"}
LOOKUPS = {"LookupConformance", "CPLookupConformance"}  # the only models with store hits and short prompts
"""Models that may expose a mutant every shipped model exercises (the first trace in manifest order wins)."""

MUTANTS = [
    pytest.param(DirectConnector, "_track_async_dump_requests", no_tracking, _tracks, "schedAsync", SHIPPED,
                 id="no-tracking-in-build_connector_meta"),
    pytest.param(OuterConnector, "request_finished", wrapper_drops_request_finished, _delays,
                 "request_finished(r", SHIPPED, id="wrapper-not-forwarding-request_finished"),
    pytest.param(DirectConnector, "handle_preemptions", no_wait_on_preemption, _preempt_waits,
                 "handle_preemptions waited tasks", {"PreemptConformance"}, id="no-wait-in-handle_preemptions"),
    pytest.param(DirectConnector, "get_finished", report_before_wait, _finish_waits, "get_finished", SHIPPED,
                 id="report-before-wait"),
    pytest.param(DirectConnector, "wait_for_save", track_after_mla_return, _non_dumping_rank_tracks,
                 "workerAsync", {"MLAConformance"}, id="worker-set-after-mla-return"),
    pytest.param(DirectConnector, "_wait_pending_dump_task", release_only_on_success, _failed_wait, "live", SHIPPED,
                 id="event-not-released-on-wait-error"),
    pytest.param(DirectConnector, "request_finished", delay_every_request, _untracked_finish,
                 "request_finished(r", LOOKUPS, id="request_finished-delays-untracked-requests"),
    pytest.param(DirectConnector, "update_state_after_alloc", hit_never_loaded, _hit,
                 "load slices", LOOKUPS, id="store-hit-never-loaded"),
    pytest.param(DirectConnector, "shutdown", shutdown_without_drain, _shutdown_waits,
                 "shutdown waited tasks", {"ShutdownConformance"}, id="shutdown-without-drain"),
]


@pytest.fixture(scope="module")
def traces():
    """Every shipped conformance model's cover trace, decoded and validated once per session."""
    return shipped_loaded_traces()


@pytest.mark.parametrize("owner, method, mutant, observable, diff_mentions, models", MUTANTS)
def test_mutant_is_caught_at_the_first_observable_step(traces, monkeypatch, owner, method, mutant,
                                                       observable, diff_mentions, models):
    monkeypatch.setattr(owner, method, mutant)
    report = replay_loaded(traces, stop_first=True, shrink=False, coverage=False)
    assert len(report.failed) == 1, "the mutant survived every shipped conformance trace"
    divergence = report.failed[0]
    trace = load_itf(divergence.file)
    assert trace.meta["model"] in models, divergence.describe()
    step = first_step(trace, observable)
    assert step is not None and divergence.step == step, divergence.describe()
    assert any(diff_mentions in line for line in divergence.diff), divergence.describe()
