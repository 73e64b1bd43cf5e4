"""KV-cache groups (vLLM's hybrid KV-cache manager): which layers each group's block ids address, and
which group's blocks leave a sliding window while the request runs.

With one group (every full-attention model) nothing here changes the connector. With several (a hybrid
model: full attention + sliding window), a request has one block list per group; block id `b` of group
`g` addresses only group `g`'s layers, so each group's blocks are dumped from (and loaded into) its own
layers under its own store keys. vLLM's null block is id 0: a sliding-window list shows a freed block as 0.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from deferdump.reference.hashing import _derive
from deferdump.reference.stores.base import BlockPayload

NULL_BLOCK = 0  # vLLM's null block (BlockPool.null_block.block_id); never read or written


@dataclasses.dataclass(frozen=True)
class KVGroup:
    """One KV-cache group: its layers (None: every registered layer) and its sliding window in tokens
    (None: full attention, whose blocks are freed only at finish or preemption)."""

    layer_names: tuple[str, ...] | None = None
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.sliding_window is not None and (
            isinstance(self.sliding_window, bool) or not isinstance(self.sliding_window, int) or self.sliding_window < 1
        ):
            raise ValueError(f"sliding_window must be a positive integer, got {self.sliding_window!r}")


SINGLE_GROUP: tuple[KVGroup, ...] = (KVGroup(),)


def group_key(key: bytes, group: int) -> bytes:
    """The store key of group `group`'s block under a block key (group 0 keeps the key itself)."""
    return key if group == 0 else _derive(key, b"group", group)


def skipped_blocks(num_computed_tokens: int, sliding_window: int, block_size: int) -> int:
    """How many leading blocks vLLM frees once `num_computed_tokens` are computed
    (`SlidingWindowManager.get_num_skipped_tokens` = computed - window + 1, whole blocks only)."""
    return max(0, num_computed_tokens - sliding_window + 1) // block_size


class GroupPayload:
    """One dump task's bytes read from several groups' layers: the parts' rows, in group order."""

    def __init__(self, parts: Sequence[BlockPayload]) -> None:
        self.parts = tuple(parts)

    def done(self) -> bool:
        return all(part.done() for part in self.parts)

    def result(self) -> torch.Tensor:
        return torch.cat([part.result() for part in self.parts])
