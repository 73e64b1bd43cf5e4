"""Splitting a tier of models into N balanced, deterministic parts (``deferdump check --shard K/N``)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deferdump.reference.errors import UserError

if TYPE_CHECKING:
    from deferdump.tools.tlc.manifest import ModelEntry

__all__ = ["START_COST_STATES", "Shard", "ShardError", "model_weight", "shard_models"]

START_COST_STATES = 6000
"""A TLC run's fixed cost (JVM start, parsing: about 1.2 s) in states of search (about 5,000 states/s)."""

UNKNOWN_STATES = 200_000
"""The weight of a model whose count is not recorded: assume it is big (a deep model)."""


class ShardError(UserError):
    """A shard outside 1..N, or text that is not K/N."""


@dataclass(frozen=True)
class Shard:
    """Part ``index`` (1-based) of ``count`` parts."""

    index: int = 1
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 1 <= self.index <= self.count:
            raise ShardError(f"shard must be K/N with 1 <= K <= N, not {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"K/N"`` -> Shard(K, N)."""
        index, sep, count = text.partition("/")
        if not sep or not index.strip().isdigit() or not count.strip().isdigit():
            raise ShardError(f"shard must look like K/N (e.g. 1/2), not {text!r}")
        return cls(int(index), int(count))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def model_weight(entry: ModelEntry) -> int:
    """The expected cost of checking a model: its recorded distinct states plus the start-up cost."""
    states = entry.distinct_states if entry.distinct_states is not None else UNKNOWN_STATES
    return states + START_COST_STATES


def shard_models(entries: Sequence[ModelEntry], shard: Shard) -> list[ModelEntry]:
    """The models of ``shard``, in the order given: the heaviest model goes to the lightest part so far
    (ties: the lower part, then the model name), so the parts' weights differ by at most one model and
    the split depends only on the names and recorded counts, never on the machine."""
    loads = [0] * shard.count
    part_of: dict[str, int] = {}
    for entry in sorted(entries, key=lambda e: (-model_weight(e), e.name)):
        part = min(range(shard.count), key=lambda p: (loads[p], p))
        loads[part] += model_weight(entry)
        part_of[entry.name] = part
    return [entry for entry in entries if part_of[entry.name] == shard.index - 1]
