"""Merging shard results: one run's results, or a clear error (duplicates, conflicts, missing parts)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deferdump.tools.tlc.merge import MergeError, load_results, merge_results


def _result(model: str, status: str = "pass", distinct: int | None = 9, **extra: Any) -> dict[str, Any]:
    return {"model": model, "status": status, "kind": None if status == "pass" else "invariant",
            "property": None if status == "pass" else "SafeInv", "distinct_states": distinct,
            "generated_states": 13, "depth": 5, "seconds": 1.0, "trace": [], "loop_index": None,
            "message": None, "expected_ok": status == "pass", **extra}


def _sim(model: str, shard: str, status: str = "pass", batch_index: int = 0, **extra: Any) -> dict[str, Any]:
    return _result(model, status, None, mode="simulate", seed=7, depth_bound=50, behaviours=500, batches=1,
                   shard=shard, budget_spent=False, batch_seed=1, batch_index=batch_index, **extra)


def test_model_checked_shards_merge_into_the_selection_order() -> None:
    merged = merge_results([("a", [_result("B", shard="1/2")]), ("b", [_result("A", shard="2/2")])],
                           expected_models=["A", "B"])
    assert [item["model"] for item in merged] == ["A", "B"]


def test_a_duplicate_and_a_conflict_are_errors() -> None:
    with pytest.raises(MergeError, match="duplicate result: A in a and b"):
        merge_results([("a", [_result("A")]), ("b", [_result("A")])])
    with pytest.raises(MergeError, match="conflicting results for A: pass with 9 distinct states in a, pass with 10"):
        merge_results([("a", [_result("A")]), ("b", [_result("A", distinct=10)])])
    with pytest.raises(MergeError, match="both model-checked and simulated"):
        merge_results([("a", [_result("A")]), ("b", [_sim("A", "1/1")])])


def test_missing_shards_and_missing_models_are_errors() -> None:
    with pytest.raises(MergeError, match="missing shards: 2/3, 3/3"):
        merge_results([("a", [_result("A", shard="1/3")])])
    with pytest.raises(MergeError, match="missing models: C"):
        merge_results([("a", [_result("A"), _result("B")])], expected_models=["A", "B", "C"])
    with pytest.raises(MergeError, match="not in the selection: B"):
        merge_results([("a", [_result("A"), _result("B")])], expected_models=["A"])


def test_simulation_shards_fold_and_the_earliest_violation_wins() -> None:
    parts = [("a", [_sim("M", "1/3")]), ("b", [_sim("M", "2/3", "violation", batch_index=4)]),
             ("c", [_sim("M", "3/3", "violation", batch_index=2)])]
    [merged] = merge_results(parts, judge=lambda _m, item: item["status"] == "violation")
    assert merged["status"] == "violation" and merged["batch_index"] == 2 and merged["behaviours"] == 1500
    assert merged["expected_ok"] is True and merged["generated_states"] == 39
    [passed] = merge_results([("a", [_sim("M", "1/2")]), ("b", [_sim("M", "2/2")])])
    assert passed["status"] == "pass" and "no violation in 1,000 behaviours" in passed["message"]
    with pytest.raises(MergeError, match="different seed"):
        merge_results([("a", [_sim("M", "1/2")]), ("b", [{**_sim("M", "2/2"), "seed": 8}])])
    with pytest.raises(MergeError, match="different ladder"):  # one shard run with --fixed-depth
        merge_results([("a", [_sim("M", "1/2", ladder=True)]), ("b", [_sim("M", "2/2", ladder=False)])])
    with pytest.raises(MergeError, match="duplicate result: M shard 1/2"):
        merge_results([("a", [_sim("M", "1/2")]), ("b", [_sim("M", "1/2")]), ("c", [_sim("M", "2/2")])])


def test_files_that_are_not_check_results_are_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "obj.json").write_text("{}")
    (tmp_path / "short.json").write_text(json.dumps([{"model": "A"}]))
    with pytest.raises(MergeError, match="bad JSON"):
        load_results(tmp_path / "bad.json")
    with pytest.raises(MergeError, match="expected the JSON list"):
        load_results(tmp_path / "obj.json")
    with pytest.raises(MergeError, match="lacks status"):
        load_results(tmp_path / "short.json")
    with pytest.raises(MergeError, match="no such file"):
        load_results(tmp_path / "absent.json")
