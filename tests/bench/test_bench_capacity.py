"""The bench's capacity figures: real TLC on fixture models standing in for AllFeatures and DirectDeep."""
from __future__ import annotations

from pathlib import Path

import pytest

from deferdump.tools.bench.capacity import measure_capacity
from support.manifests import fixture_manifest, fixture_model


def _manifest(tmp_path: Path, models: list[tuple[str, str, object, int | None]], tier: str = "ci") -> Path:
    return fixture_manifest(tmp_path, [fixture_model(*model, tier=tier) for model in models])


def test_the_figures_come_from_a_real_check_and_a_real_simulation(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, [("AllFeatures", "Counter", "pass", 9), ("DirectDeep", "Counter", "pass", 9)])
    figures = measure_capacity(120, manifest_path=manifest, simulated="DirectDeep", behaviours=40, depth=10, seed=2)
    assert figures["allfeatures_distinct_states"] == 9 and figures["allfeatures_expected_ok"] is True
    # the rates come from the unrounded seconds, the report's seconds are rounded: compare within rounding
    assert figures["allfeatures_states_per_s"] == pytest.approx(9 / figures["allfeatures_seconds"], rel=0.02)
    assert figures["simulation_behaviours"] == 40 and figures["simulation_seed"] == 2
    assert figures["simulation_behaviours_per_s"] == pytest.approx(40 / figures["simulation_seconds"], rel=0.02)


def test_a_failing_or_missing_model_gives_reasons_not_figures(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, [("AllFeatures", "Counter", "pass", 10), ("DirectDeep", "Walk", "pass", None)])
    figures = measure_capacity(120, manifest_path=manifest, simulated="DirectDeep", behaviours=40, depth=40)
    assert figures["allfeatures_distinct_states"] is None
    assert "manifest says 10" in figures["allfeatures_distinct_states_reason"]
    assert figures["simulation_behaviours_per_s"] is None
    assert figures["simulation_behaviours_per_s_reason"].startswith("DirectDeep: violation")
    absent = measure_capacity(120, manifest_path=_manifest(tmp_path / "x" if (tmp_path / "x").mkdir() is None
                                                           else tmp_path, []))
    assert absent["allfeatures_states_per_s"] is None and "unknown model" in absent["allfeatures_states_per_s_reason"]
    assert "unknown model" in absent["simulation_behaviours_per_s_reason"]


def test_a_sim_tier_model_is_simulated_not_checked(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, [("AllFeatures", "Counter", "pass", None)], tier="sim")
    figures = measure_capacity(120, manifest_path=manifest, behaviours=30, depth=10, seed=1)
    assert figures["allfeatures_distinct_states"] is None and "tier sim" in figures["allfeatures_seconds_reason"]
    assert figures["simulation_model"] == "AllFeatures" and figures["simulation_behaviours"] == 30
    assert figures["simulation_behaviours_per_s"] is not None
