"""[watch] Verdicts on connectors written in another style than the watch's own test connectors
(tests/fixtures/watch/futures_connectors.py: the HMA interface, per-layer `concurrent.futures` tasks, a
flush-on-reuse design beside the delayed free). Correct ones are `ok`; each broken one is not.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from deferdump.tools.watch.verdict import CONTRACT, HANG, MISMATCH, OK

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "watch"
sys.path.insert(0, str(FIXTURES))  # the connectors' module, as a user's would be importable


def _inner(name: str, store: Path) -> dict[str, Any]:
    return {"kv_connector": name, "kv_connector_module_path": "futures_connectors", "kv_role": "kv_both",
            "kv_connector_extra_config": {"dir": str(store)}}



def _run(scenario: str, inner: dict[str, Any], work: Path, baselines: Path):
    from deferdump.tools.watch.resolve import resolve_inner
    from deferdump.tools.watch.runner import run

    _, hma = resolve_inner(inner)
    assert hma, "the family is written against SupportsHMA: the watch must pick its HMA wrapper"
    work.mkdir(parents=True, exist_ok=True)
    return run({"scenario": scenario, "inner": inner, "hma": hma, "scribble": True, "work_dir": str(work),
                "hang_after": 60, "baseline_cache": str(baselines)})


@pytest.mark.parametrize("name", ["FuturesDelayedFreeConnector", "FlushOnReuseConnector"])
def test_correct_connectors_of_either_design_are_ok_under_preemption(name: str, tmp_path: Path,
                                                                    baselines: Path) -> None:
    store = tmp_path / "store"
    result = _run("preempt", _inner(name, store), tmp_path / "w", baselines)
    assert result.verdict == OK, result
    assert len(list(store.glob("*.pt"))) >= 10, "it stored blocks (what round 3 loads)"


@pytest.mark.parametrize("name", ["FuturesEagerFreeConnector", "FuturesReportOnSubmitConnector",
                                  "FlushTooLateConnector"])
def test_copies_after_the_blocks_were_handed_on_are_not_ok(name: str, tmp_path: Path, baselines: Path) -> None:
    result = _run("preempt", _inner(name, tmp_path / "store"), tmp_path / "w", baselines)
    assert result.verdict in (MISMATCH, CONTRACT), result


@pytest.mark.parametrize(("name", "verdicts"), [("FuturesDelayedFreeConnector", (OK,)),
                                               ("FuturesOneTableConnector", (MISMATCH, CONTRACT))])
def test_hybrid_model_needs_each_groups_own_blocks(name: str, verdicts: tuple[str, ...], tmp_path: Path,
                                                  baselines: Path) -> None:
    """On the tiny hybrid model a connector that takes the full-attention group's block ids for every layer
    reads and writes the sliding-window layers at the wrong blocks; the one that keeps each group's ids is ok."""
    result = _run("sliding_window", _inner(name, tmp_path / "store"), tmp_path / "w", baselines)
    assert result.verdict in verdicts, result


def test_correct_asynchronous_loads_are_ok(tmp_path: Path, baselines: Path) -> None:
    """Round two's prompts hit the store and wait in WAITING_FOR_REMOTE_KVS until their loads are done."""
    result = _run("prefix", _inner("FuturesAsyncLoadConnector", tmp_path / "store"), tmp_path / "w", baselines)
    assert result.verdict == OK, result


def test_a_receive_reported_before_the_load_wrote_is_not_ok(tmp_path: Path, baselines: Path) -> None:
    result = _run("prefix", _inner("FuturesEarlyRecvConnector", tmp_path / "store"), tmp_path / "w", baselines)
    assert result.verdict in (MISMATCH, CONTRACT), result


@pytest.mark.parametrize(("name", "holders"), [
    ("FuturesLostReportConnector", ("requests still holding blocks: r0-p0", "finished_")),
    ("FuturesNeverRecvConnector", ("requests still holding blocks: r1-p0", "waiting_for_remote_kvs")),
])
def test_a_report_that_never_comes_is_a_hang(name: str, holders: tuple[str, str], tmp_path: Path, baselines: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A send dropped from the reports (round one's finished requests keep their blocks) or a receive
    never reported (round two's requests wait for their KV). The watchdog ends its process: a child, as
    `deferdump watch` runs every scenario."""
    from deferdump.tools.watch.session import run_scenario

    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))
    result = run_scenario("prefix", _inner(name, tmp_path / "store"), hma=True, scribble=True, timeout=900,
                          hang_after=10, work_root=tmp_path, baseline_cache=baselines)
    assert result.verdict == HANG, result
    assert all(text in result.detail for text in holders), result.detail
