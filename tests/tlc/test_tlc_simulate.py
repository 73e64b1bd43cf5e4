"""TLC's random simulation in batches: real TLC on fixture specs; repeatable by seed, counted, bounded."""
from __future__ import annotations

import dataclasses

import pytest

from deferdump.tools.tlc import simulate as simulate_module
from deferdump.tools.tlc.bridge import Kind, Status, TlcResult, run_tlc
from deferdump.tools.tlc.shard import Shard
from deferdump.tools.tlc.simulate import (SimulationPlan, SimulationUsageError, batch_depth, batch_seed, simulate,
                                          simulation_config)
from support import FIXTURES as ALL_FIXTURES

FIXTURES = ALL_FIXTURES / "tla"


def _walk(seed: int) -> tuple[object, object]:
    return simulate(FIXTURES / "Walk.tla", None, SimulationPlan(depth=40, seed=seed, num=200, batch=100))


def test_the_same_seed_finds_the_same_counterexample_and_another_seed_another() -> None:
    first, first_stats = _walk(11)
    again, again_stats = _walk(11)
    other, _ = _walk(12)
    assert first.status is Status.VIOLATION and first.property == "FarInv"
    assert [(s.action, dict(s.values)) for s in first.trace] == [(s.action, dict(s.values)) for s in again.trace]
    # not compared: TLC 2.15's "states generated" of a run stopped by a violation depends on timing
    assert first_stats == again_stats and first_stats.batch_seed == 11 and first_stats.batch_index == 0
    last = first.trace[-1].values
    assert last["x"] + last["y"] == 7  # the first state past the bound
    assert [dict(s.values) for s in other.trace] != [dict(s.values) for s in first.trace]


def _spy_batches(monkeypatch: pytest.MonkeyPatch, *, drop_count_of: int | None = None) -> list[TlcResult]:
    """Record each batch's TLC result; ``drop_count_of``: that batch's count goes missing, as when TLC 2.15's
    reporter thread misses a short batch."""
    batches: list[TlcResult] = []

    def run(*args: object, **kwargs: object) -> TlcResult:
        result = run_tlc(*args, **kwargs)  # type: ignore[arg-type]
        if len(batches) == drop_count_of:
            result = dataclasses.replace(result, generated_states=None)
        batches.append(result)
        return result

    monkeypatch.setattr(simulate_module, "run_tlc", run)
    return batches


def test_a_correct_spec_counts_every_behaviour_of_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = _spy_batches(monkeypatch)
    result, stats = simulate(FIXTURES / "Counter.tla", None, SimulationPlan(depth=10, seed=3, num=250, batch=100))
    assert result.status is Status.PASS and result.distinct_states is None
    assert (stats.behaviours, stats.batches, stats.budget_spent) == (250, 3, False)
    counts = [batch.generated_states for batch in batches]
    assert len(counts) == 3
    if None in counts:  # TLC printed no count for a batch (see the next test)
        assert result.generated_states is None
    else:
        assert result.generated_states == sum(counts) and sum(counts) >= 250  # type: ignore[arg-type]
    assert "no violation in 250 behaviours" in (result.message or "")


def test_a_batch_without_a_count_makes_the_sum_unknown_not_short(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = _spy_batches(monkeypatch, drop_count_of=1)
    result, stats = simulate(FIXTURES / "Counter.tla", None, SimulationPlan(depth=10, seed=3, num=250, batch=100))
    assert result.status is Status.PASS and stats.behaviours == 250 and len(batches) == 3
    assert result.generated_states is None


def test_a_budget_that_ends_inside_the_first_batch_is_an_error_not_a_pass() -> None:
    plan = SimulationPlan(depth=100, seed=1, num=10**9, batch=10**9, time_budget=3)
    result, stats = simulate(FIXTURES / "BigCycle.tla", None, plan)
    assert result.status is Status.ERROR and result.kind is Kind.TIMEOUT
    assert "no verdict" in (result.message or "") and "larger --time-budget" in (result.message or "")
    assert (stats.behaviours, stats.batches, stats.budget_spent, stats.batch_index) == (0, 0, True, 0)


def test_shards_split_the_batches_without_overlap() -> None:
    whole = list(SimulationPlan(seed=5, num=2300, batch=500).batches())
    parts = [list(SimulationPlan(seed=5, num=2300, batch=500, shard=Shard(k, 3)).batches()) for k in (1, 2, 3)]
    assert whole == [(0, 500), (1, 500), (2, 500), (3, 500), (4, 300)]
    assert sorted(b for part in parts for b in part) == whole
    assert parts[1] == [(1, 500), (4, 300)]
    assert len({batch_seed(5, index) for index in range(50)}) == 50 and batch_seed(5, 0) == 5
    assert batch_seed(5, 3) == batch_seed(5, 3) != batch_seed(6, 3)


@pytest.mark.parametrize(("settings", "message"), [
    ({"num": None, "time_budget": None}, "needs --num or --time-budget"),
    ({"num": 10, "depth": 0}, "depth"),
    ({"num": 0}, "num must"),
    ({"num": 5, "seed": -1}, "seed must"),
    ({"time_budget": -2.0}, "time budget"),
])
def test_plans_that_cannot_work_are_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(SimulationUsageError, match=message):
        SimulationPlan(**settings)  # type: ignore[arg-type]


def test_a_parse_error_is_reported_not_simulated() -> None:
    result, stats = simulate(FIXTURES / "ParseError.tla", None, SimulationPlan(num=10))
    assert result.status is Status.ERROR and result.kind is Kind.PARSE and stats.behaviours == 0


def test_a_shard_without_a_batch_is_an_error() -> None:
    plan = SimulationPlan(num=100, batch=500, shard=Shard(2, 2))
    with pytest.raises(SimulationUsageError, match="shard 2/2 has no batch: 100 behaviours make 1 batch"):
        simulate(FIXTURES / "Counter.tla", None, plan)


def test_batch_depths_climb_a_ruler_sequence_up_to_the_depth_given() -> None:
    assert [batch_depth(100, index) for index in range(16)] == [8, 16, 8, 32, 8, 16, 8, 64,
                                                                8, 16, 8, 32, 8, 16, 8, 100]
    assert [batch_depth(20, index) for index in range(4)] == [8, 16, 8, 20]
    assert [batch_depth(5, index) for index in range(3)] == [5, 5, 5]
    assert [batch_depth(100, index, ladder=False) for index in range(3)] == [100, 100, 100]


def _spy_depths(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    depths: list[int] = []

    def run(*args: object, **kwargs: object) -> TlcResult:
        extra = list(kwargs["extra_args"])  # type: ignore[call-overload]
        depths.append(int(extra[extra.index("-depth") + 1]))
        return run_tlc(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(simulate_module, "run_tlc", run)
    return depths


@pytest.mark.parametrize(("ladder", "expected"), [(True, [8, 16, 8, 32, 8]), (False, [40] * 5)])
def test_tlc_runs_each_batch_at_its_depth(monkeypatch: pytest.MonkeyPatch, ladder: bool,
                                          expected: list[int]) -> None:
    depths = _spy_depths(monkeypatch)
    result, stats = simulate(FIXTURES / "Counter.tla", None,
                             SimulationPlan(depth=40, seed=3, num=50, batch=10, ladder=ladder))
    assert result.status is Status.PASS and depths == expected
    assert stats.batch_depth == expected[-1] and stats.depth == 40


def test_a_violation_replays_from_its_batch_seed_and_batch_depth() -> None:
    """What the JSON says replays the counterexample: TLC with the batch's seed and depth gives the same trace."""
    plan = SimulationPlan(depth=40, seed=11, num=2000, batch=100)
    result, stats = simulate(FIXTURES / "Walk.tla", None, plan)
    assert result.status is Status.VIOLATION and stats.batch_index is not None
    assert stats.batch_depth == batch_depth(40, stats.batch_index) and stats.batch_seed == batch_seed(11, stats.batch_index)
    again = run_tlc(FIXTURES / "Walk.tla", None, workers=1, extra_args=[
        "-simulate", "num=100", "-depth", str(stats.batch_depth), "-seed", str(stats.batch_seed)])
    assert again.property == result.property == "FarInv"
    assert [dict(s.values) for s in again.trace] == [dict(s.values) for s in result.trace]


def test_a_simulation_leaves_the_models_symmetry_out() -> None:
    """SYMMETRY costs a simulation every permutation per state and merges nothing: it is dropped, from a cfg
    file and from a generated one. A SYMMETRY naming no definition stops model checking at once, and a
    simulation of the same cfg runs."""
    broken = (FIXTURES / "Counter.cfg").read_text(encoding="utf-8") + "\nSYMMETRY NoSuchPermutations\n"
    checked = run_tlc(FIXTURES / "Counter.tla", "CounterSym.cfg", extra_modules={"CounterSym.cfg": broken})
    assert checked.status is Status.ERROR
    plan = SimulationPlan(depth=10, seed=1, num=20, batch=10)
    result, stats = simulate(FIXTURES / "Counter.tla", "CounterSym.cfg", plan,
                             extra_modules={"CounterSym.cfg": broken})
    assert result.status is Status.PASS and stats.behaviours == 20
    config, modules = simulation_config(FIXTURES / "Counter.tla", "CounterSym.cfg", {"CounterSym.cfg": broken})
    assert config == "CounterSym_nosymmetry.cfg" and "SYMMETRY" not in modules[config]
    assert modules["CounterSym.cfg"] == broken  # the caller's files are left as they were
    # a cfg without SYMMETRY is run as given
    assert simulation_config(FIXTURES / "Counter.tla", None, {}) == (None, {})
