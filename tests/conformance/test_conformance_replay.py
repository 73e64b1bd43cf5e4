"""Replay engine on the Toy fixture: passing traces, a divergence with its diff, shrinking, coverage."""
from __future__ import annotations

import pytest

from support.conformance import RecordingFactory, ToyCounters, toy_manifest
from deferdump.conformance.diff import diff_value
from deferdump.conformance.replay import replay_paths
from deferdump.conformance.shrink import minimized_path
from deferdump.conformance.tracegen import generate_traces
from deferdump.tools.tlc.values import ModelValue, TlaFunction, TlaSet, Tup, load_itf


@pytest.fixture(scope="module")
def cover_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy-cover")
    return generate_traces(toy_manifest().get("Toy"), "cover", out, max_len=8).files


def test_correct_implementation_passes_with_full_coverage(cover_files):
    report = replay_paths(cover_files, driver_factory=RecordingFactory(), manifest=toy_manifest())
    assert report.ok and report.passed == report.traces == len(cover_files)
    assert report.edge_coverage == 1.0 and report.action_coverage == 1.0
    assert report.steps == sum(len(load_itf(f).states) - 1 for f in cover_files)
    data = report.to_json()
    assert set(data) >= {"traces", "passed", "failed", "steps", "seconds", "edge_coverage", "action_coverage"}
    assert data["models"][0]["model"] == "Toy"


def _broken_reset(self: ToyCounters) -> None:
    self.slots = [0, self.slots[1]]  # the mutant forgets the second counter


def test_divergence_names_file_step_action_and_diff_then_shrinks(cover_files, monkeypatch):
    monkeypatch.setattr(ToyCounters, "reset", _broken_reset)
    report = replay_paths(cover_files, driver_factory=RecordingFactory(), manifest=toy_manifest())
    assert not report.ok
    first = report.failed[0]
    trace = load_itf(first.file)
    assert trace.states[first.step]["action"]["name"] == "reset"
    assert first.action == '[name |-> "reset"]'
    (line,) = first.diff
    assert line.startswith("slots[2]: model 0, implementation ")
    # the shrunk trace sits beside the original, fails at its last step, and is no longer
    minimized = minimized_path(trace.path)
    assert first.minimized == str(minimized) and minimized.is_file()
    shrunk = load_itf(minimized)
    assert len(shrunk.states) - 1 == first.minimized_steps <= first.step
    assert shrunk.meta["shrunk_from"] == trace.path.name
    again = replay_paths([minimized], driver_factory=RecordingFactory(), coverage=False, shrink=False)
    assert [d.step for d in again.failed] == [len(shrunk.states) - 1]
    # reset needs a non-zero second slot: shortest is init -> inc(2) -> reset
    assert first.minimized_steps == 2


def test_stop_first_replays_nothing_after_the_first_failure(cover_files, monkeypatch):
    monkeypatch.setattr(ToyCounters, "reset", _broken_reset)
    factory = RecordingFactory()
    report = replay_paths(cover_files, driver_factory=factory, stop_first=True, shrink=False, coverage=False)
    assert len(report.failed) == 1
    assert report.skipped == report.traces - len([d for d in factory.drivers if d.resets])


def test_an_implementation_exception_is_a_divergence(cover_files, monkeypatch):
    def explode(self: ToyCounters, slot: int) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(ToyCounters, "inc", explode)
    report = replay_paths(cover_files[:1], driver_factory=RecordingFactory(), coverage=False, shrink=False)
    assert report.failed[0].step == 1
    assert report.failed[0].diff == ["implementation raised RuntimeError: boom"]


def test_diff_reads_per_key_and_per_element():
    r1, r2 = ModelValue("r1"), ModelValue("r2")
    model = TlaFunction([(0, TlaSet([r1])), (1, TlaSet([r1, r2]))])
    impl = TlaFunction([(0, TlaSet([r1])), (1, TlaSet([r2]))])
    assert diff_value("workerAsync", model, impl) == ["workerAsync[1]: only in model {r1}"]
    assert diff_value("x", Tup((1, 2)), Tup((1, 3))) == ["x[2]: model 2, implementation 3"]
    assert diff_value("x", True, 1) == ["x: model TRUE, implementation 1"]
    assert diff_value("x", TlaSet([r1]), TlaSet([r1])) == []


def test_a_spec_decode_trace_runs_get_finished_before_wait_for_save(monkeypatch):
    """With DeferFinalize the model records get_finished before wait_for_save in a rank's step; the
    driver calls the connector in the recorded order (vLLM's `defer_finalize` runner), step by step."""
    from support.conformance import deferdump_traces
    from deferdump.reference.connectors import DirectConnector

    calls: list[str] = []
    for name in ("get_finished", "wait_for_save"):
        original = getattr(DirectConnector, name)

        def spy(self, *args, _name=name, _original=original, **kwargs):
            if self.role.name == "WORKER":
                calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(DirectConnector, name, spy)
    report = replay_paths(deferdump_traces("SpecDecodeConformance")[:40], shrink=False, coverage=False)
    assert report.ok and calls
    assert calls[0::2] == ["get_finished"] * (len(calls) // 2) and calls[1::2] == ["wait_for_save"] * (len(calls) // 2)
