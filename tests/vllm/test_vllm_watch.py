"""[watch] The watching wrapper in real vLLM: transparent when nothing is on; verdicts on connectors it has
never seen (vLLM's ExampleConnector, and the test connectors in tests/fixtures/watch).

In-process scenarios go through `runner.run` (the same code a `deferdump watch` child runs); the hang case
needs a child process (the watchdog ends its process), so it goes through `session.run_scenario`.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from deferdump.tools.watch.config import watch_transfer_config
from deferdump.tools.watch.scenarios import SCENARIOS, engine_kwargs, run_workload
from deferdump.tools.watch.verdict import CRASH, HANG, MISMATCH, OK

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "watch"
sys.path.insert(0, str(FIXTURES))  # the test connectors' module, as a user's would be importable

from deferdump.reference.testing.tinymodel import write_tiny_model  # noqa: E402


def _example(store: Path, name: str = "ExampleConnector", module: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"kv_connector": name, "kv_role": "kv_both",
                              "kv_connector_extra_config": {"shared_storage_path": str(store)}}
    if module:
        config["kv_connector_module_path"] = module
    return config


def _test_connector(name: str, store: Path) -> dict[str, Any]:
    return {"kv_connector": name, "kv_connector_module_path": "watch_test_connectors", "kv_role": "kv_both",
            "kv_connector_extra_config": {"dir": str(store)}}


def _run(scenario: str, inner: dict[str, Any], work: Path, baselines: Path, *, scribble: bool = True,
         hma: bool = False):
    from deferdump.tools.watch.runner import run

    work.mkdir(parents=True, exist_ok=True)
    return run({"scenario": scenario, "inner": inner, "hma": hma, "scribble": scribble, "work_dir": str(work),
                "hang_after": 60, "baseline_cache": str(baselines)})



def test_every_connector_method_is_forwarded() -> None:
    """A method vLLM adds to the base class would fall through to the base's default: a wrapper that
    silently changes the inner connector's behaviour. Only the role and the metadata accessors stay the base's."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    from deferdump.tools.watch.wrapper import WatchConnector

    own = {"_cache_hit_source", "role", "_get_connector_metadata", "has_connector_metadata"}
    assert [name for name in vars(KVConnectorBase_V1)
            if not name.startswith("__") and name not in vars(WatchConnector) and name not in own] == []


def test_example_connector_prefix_and_several_victims_ok(tmp_path: Path, baselines: Path) -> None:
    """vLLM's ExampleConnector (synchronous saves): repeated prompts are served bitwise equal, scribble on,
    also when every running request is preempted at once (`preempt` is the scenario where it crashes)."""
    prefix = _run("prefix", _example(tmp_path / "store-a"), tmp_path / "a", baselines)
    assert (prefix.verdict, prefix.detail) == (OK, "6 outputs bitwise equal to a run without a connector")
    victims = _run("several_victims", _example(tmp_path / "store-b"), tmp_path / "b", baselines)
    assert victims.verdict == OK, victims


def test_example_connector_crashes_on_a_resume_served_from_its_files(tmp_path: Path, baselines: Path) -> None:
    """The bug the third-party note records: the `preempt` scenario's second round resumes a preempted
    request whose prompt blocks vLLM evicted, so ExampleConnector loads it, from a file it names after
    prompt + output (example_connector.py ~354-383) while it saved it under the prompt alone: FileNotFoundError."""
    result = _run("preempt", _example(tmp_path / "store"), tmp_path / "w", baselines)
    assert result.verdict == CRASH, result
    assert "FileNotFoundError" in result.detail and "safetensors" in result.detail, result.detail


@pytest.mark.parametrize("fence, verdict", [("none", MISMATCH), ("freed", OK)])
def test_reference_connector_hybrid_fence(fence: str, verdict: str, tmp_path: Path, baselines: Path) -> None:
    """#989 as merged (`hybrid_fence: none`) dumps window-freed blocks after vLLM handed them on: not ok;
    with the fence the same run (same adversarial copy device, scribble on) is ok."""
    inner = {"kv_connector": "DeferDumpConnector", "kv_connector_module_path": "deferdump.reference.vllm",
             "kv_role": "kv_both",
             "kv_connector_extra_config": {"store": "memory", "hybrid_fence": fence, "test_late_copy": "hold"}}
    result = _run("sliding_window", inner, tmp_path / "w", baselines, hma=True)
    assert result.verdict == verdict, result


def test_correct_async_connector_is_ok_under_preemption(tmp_path: Path, baselines: Path) -> None:
    result = _run("preempt", _test_connector("AsyncSaveConnector", tmp_path / "store"), tmp_path / "w", baselines)
    assert result.verdict == OK, result


@pytest.mark.parametrize("name", ["FreeBeforeCopyConnector", "ReportBeforeCopyConnector"])
def test_copy_after_the_blocks_were_handed_on_is_an_output_mismatch(name: str, tmp_path: Path, baselines: Path) -> None:
    """The copy reads blocks vLLM already gave another request (scribbled): round two loads garbage."""
    result = _run("preempt", _test_connector(name, tmp_path / "store"), tmp_path / "w", baselines)
    assert result.verdict == MISMATCH, result
    assert result.detail.startswith("prompt ")


def test_never_reporting_connector_is_a_hang(tmp_path: Path, baselines: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request's blocks stay held forever: the watchdog names it (in a child process: it ends it)."""
    from deferdump.tools.watch.session import run_scenario

    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))
    result = run_scenario("prefix", _test_connector("NeverReportsConnector", tmp_path / "store"), hma=False,
                          scribble=True, timeout=900, hang_after=10, work_root=tmp_path, baseline_cache=baselines)
    assert result.verdict == HANG, result
    assert "requests still holding blocks: r0-p0" in result.detail and "finished_" in result.detail


def test_wrapper_is_transparent_with_nothing_on(tmp_path: Path) -> None:
    """Same outputs and the very same connector calls, with and without the wrapper (no log, no scribble)."""
    import watch_test_connectors as fixtures
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    scenario = SCENARIOS["prefix"]
    model = write_tiny_model(tmp_path / "model")
    runs = []
    for wrapped in (False, True):
        fixtures.CALLS.clear()
        inner = _example(tmp_path / f"store-{wrapped}", "RecordingExampleConnector", "watch_test_connectors")
        transfer = watch_transfer_config(inner, hma=False) if wrapped else inner
        llm = LLM(**engine_kwargs(model, scenario), kv_transfer_config=transfer)
        try:
            outputs = run_workload(llm, scenario)
        finally:
            llm.llm_engine.engine_core.shutdown()
            cleanup_dist_env_and_memory()
        runs.append((outputs, list(fixtures.CALLS)))
    (plain_out, plain_calls), (wrapped_out, wrapped_calls) = runs
    assert plain_out == wrapped_out and len(plain_out) == 6
    assert any(name == "start_load_kv" for _, name, _ in plain_calls)
    assert [call for call in wrapped_calls if call[1] != "shutdown"] == [c for c in plain_calls if c[1] != "shutdown"]


def test_reporting_an_undelayed_request_is_a_contract_violation(tmp_path: Path, baselines: Path) -> None:
    """finished_sending for a request whose free was not delayed: the contract's first clause, named with
    its event, even though vLLM then asserts (the violation is the cause, the crash its consequence)."""
    result = _run("prefix", _test_connector("ReportsUndelayedConnector", tmp_path / "store"), tmp_path / "w", baselines)
    assert result.verdict == "contract_violation", result
    assert result.detail.startswith("SendingOnlyDelayedInv: ") and "update_connector_output" in result.detail


def test_reference_connector_with_asynchronous_loads_is_ok(tmp_path: Path, baselines: Path) -> None:
    """Requests parked for an asynchronous load: their blocks are scribbled when vLLM hands them out, not
    again when vLLM schedules them after the receive (the loaded prefix is live by then)."""
    inner = {"kv_connector": "DeferDumpConnector", "kv_connector_module_path": "deferdump.reference.vllm",
             "kv_role": "kv_both", "kv_connector_extra_config": {"store": "memory", "load_async": True}}
    result = _run("prefix", inner, tmp_path / "w", baselines, hma=True)
    assert result.verdict == OK, result
    import json

    events = [json.loads(line) for path in (tmp_path / "w" / "log").rglob("*") if path.is_file()
              for line in path.read_text().splitlines() if line.strip()]
    parked = [e for e in events if e["event"] == "get_num_new_matched_tokens" and e["load_async"] and e["matched"]]
    assert len(parked) == 3, "round two's three prompts were each loaded asynchronously"
