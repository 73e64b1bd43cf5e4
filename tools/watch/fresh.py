"""Which blocks vLLM just handed out from its free pool: the scribble adversary's targets.

A new or resumed request's blocks start with its local prefix-cache hits (live contents vLLM reuses);
every later block, and every block added to a running request, came from the free pool, so its old
contents are dead to vLLM (a connector still reading them breaks the block-lifetime contract). vLLM's
null block 0 (a position outside a sliding window) is never a target.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence


def fresh_blocks(groups: Sequence[Sequence[int]], local_hit_blocks: int) -> list[int]:
    """The blocks of `groups` (one list per KV-cache group, position-aligned) after the first
    `local_hit_blocks` positions, without the null block."""
    fresh: set[int] = set()
    for blocks in groups:
        fresh.update(block for block in list(blocks)[local_hit_blocks:] if block != 0)
    return sorted(fresh)


def step_fresh_blocks(new: Sequence[tuple[str, Sequence[Sequence[int]]]],
                      cached: Sequence[tuple[str, bool, Sequence[Sequence[int]]]],
                      local_hits: Mapping[str, int], block_size: int) -> list[int]:
    """Every block handed out from the free pool this step.

    `new`: (request id, per-group blocks) of newly scheduled requests; `cached`: (request id, resumed,
    per-group new blocks) of the others; `local_hits`: the local prefix-cache hit in tokens vLLM last
    told `get_num_new_matched_tokens` per request. A new or resumed request without a known hit is
    skipped whole (scribbling a live prefix block would be a false alarm; missing one only weakens the
    adversary).
    """
    fresh: set[int] = set()
    for req, groups in new:
        if req in local_hits:
            fresh.update(fresh_blocks(groups, local_hits[req] // block_size))
    for req, resumed, groups in cached:
        if not resumed:
            fresh.update(fresh_blocks(groups, 0))
        elif req in local_hits:
            fresh.update(fresh_blocks(groups, local_hits[req] // block_size))
    return sorted(fresh)
