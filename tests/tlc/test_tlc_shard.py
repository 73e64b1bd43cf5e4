"""Splitting a tier into shards: a partition, balanced by recorded states, independent of the machine."""
from __future__ import annotations

import pytest

from deferdump.tools.tlc.manifest import load_manifest
from deferdump.tools.tlc.shard import Shard, ShardError, model_weight, shard_models


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_the_shards_of_a_tier_partition_it_and_balance_its_weight(count: int) -> None:
    tier = load_manifest().select(tier="ci")
    parts = [shard_models(tier, Shard(k, count)) for k in range(1, count + 1)]
    names = [entry.name for part in parts for entry in part]
    assert sorted(names) == sorted(entry.name for entry in tier) and len(set(names)) == len(names)
    loads = [sum(model_weight(entry) for entry in part) for part in parts]
    assert max(loads) - min(loads) <= max(model_weight(entry) for entry in tier)
    for part in parts:  # each part keeps the manifest's order
        order = [entry.name for entry in tier if entry in part]
        assert [entry.name for entry in part] == order
    assert parts == [shard_models(list(reversed(tier)), Shard(k, count))[::-1] for k in range(1, count + 1)]


def test_the_heaviest_models_go_to_different_shards() -> None:
    deep = load_manifest().select(tier="deep")
    first, second = shard_models(deep, Shard(1, 2)), shard_models(deep, Shard(2, 2))
    heaviest = sorted(deep, key=lambda entry: -model_weight(entry))[:2]
    assert (heaviest[0] in first) != (heaviest[1] in first)
    assert first and second


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "a/b", "2", "1/2/3", "-1/2"])
def test_bad_shards_are_refused(text: str) -> None:
    with pytest.raises(ShardError):
        Shard.parse(text)


def test_a_shard_parses_and_prints_back() -> None:
    assert Shard.parse("2/3") == Shard(2, 3) and str(Shard(2, 3)) == "2/3"
