"""The capacity figures of ``deferdump bench``: the all-features model's size and speed, and how many
random behaviours per second the simulation tier explores (docs/capacity.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from deferdump.reference.errors import UserError
from deferdump.tools.tlc.manifest import SIMULATED_ONLY, check_model, load_manifest, simulate_model
from deferdump.tools.tlc.simulate import SimulationPlan

__all__ = ["ALL_FEATURES", "SIMULATED", "capacity_skipped", "measure_capacity"]

ALL_FEATURES = "AllFeatures"
"""The CI-tier model with every feature switched on."""

SIMULATED = "AllFeatures"
"""The model whose simulation gives the behaviours-per-second figure (the simulation tier's widest model)."""

_FIGURES = ("allfeatures_distinct_states", "allfeatures_seconds", "allfeatures_states_per_s",
            "simulation_behaviours_per_s")


def capacity_skipped(reason: str) -> dict[str, Any]:
    """The capacity figures of a bench that does not measure them."""
    return {**{key: None for key in _FIGURES}, **{f"{key}_reason": reason for key in _FIGURES}}


def measure_capacity(timeout_s: float, *, manifest_path: Path | None = None, model: str = ALL_FEATURES,
                     simulated: str = SIMULATED, behaviours: int = 1000, depth: int = 100,
                     seed: int = 0) -> dict[str, Any]:
    """Check ``model`` exhaustively (one TLC worker) and simulate ``behaviours`` behaviours of ``simulated``.

    Every figure is a number or None with a ``<figure>_reason``."""
    figures: dict[str, Any] = {key: None for key in _FIGURES}
    try:
        manifest = load_manifest(manifest_path)
    except UserError as error:
        return capacity_skipped(f"manifest: {error}")

    try:
        entry = manifest.get(model)
    except UserError as error:
        entry = None
        for key in _FIGURES[:3]:
            figures[f"{key}_reason"] = str(error)
    if entry is not None and entry.tier == SIMULATED_ONLY:
        for key in _FIGURES[:3]:
            figures[f"{key}_reason"] = f"{model} is in tier sim: too big to check exhaustively (docs/capacity.md)"
    elif entry is not None:
        outcome = check_model(entry, workers=1, timeout=timeout_s)
        result = outcome.result
        figures.update({"allfeatures_model": model, "allfeatures_status": result.status.value,
                        "allfeatures_expected_ok": outcome.expected_ok,
                        "allfeatures_generated_states": result.generated_states,
                        "allfeatures_search_seconds": None if result.search_seconds is None
                        else round(result.search_seconds, 3)})
        if result.distinct_states is not None and outcome.expected_ok:
            figures["allfeatures_distinct_states"] = result.distinct_states
            figures["allfeatures_seconds"] = round(result.seconds, 3)
            figures["allfeatures_states_per_s"] = round(result.distinct_states / result.seconds, 1)
        else:
            reason = f"{model}: {outcome.summary or result.status.value}"
            for key in _FIGURES[:3]:
                figures[f"{key}_reason"] = reason

    try:
        sim_entry = manifest.get(simulated)
    except UserError as error:
        figures["simulation_behaviours_per_s_reason"] = str(error)
        return figures
    sim = simulate_model(sim_entry, SimulationPlan(depth=depth, seed=seed, num=behaviours,
                                                   time_budget=timeout_s))
    stats = sim.simulation
    assert stats is not None
    figures.update({"simulation_model": simulated, "simulation_behaviours": stats.behaviours,
                    "simulation_depth": depth, "simulation_seed": seed,
                    "simulation_seconds": round(sim.result.seconds, 3),
                    "simulation_generated_states": sim.result.generated_states})
    if sim.result.status.value == "pass" and stats.behaviours > 0:
        figures["simulation_behaviours_per_s"] = round(stats.behaviours / sim.result.seconds, 2)
    else:
        figures["simulation_behaviours_per_s_reason"] = (f"{simulated}: {sim.result.status.value}: "
                                                         f"{sim.result.message}")
    return figures
