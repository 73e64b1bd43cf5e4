"""A model's config at more requests: the same switches with ``Req`` and ``Block`` grown together.

The simulation tier runs each mutant at the bounds the exhaustive tiers cannot reach (3 requests): the
mutant's own cfg with every request added together with its prompt blocks, so the pool is as tight as in
the original (the same number of spare blocks) and every switch and invariant stays as it was.
"""
from __future__ import annotations

import re

from deferdump.reference.errors import UserError

__all__ = ["ScaleError", "scaled_config"]


class ScaleError(UserError):
    """The cfg does not list ``Req``, ``Block`` or ``PromptBlocks`` as this module expects."""


_SET = r"^(\s*{name}\s*=\s*)\{{([^}}]*)\}}"


def _members(cfg_text: str, name: str) -> tuple[re.Match[str], list[str]]:
    match = re.search(_SET.format(name=name), cfg_text, re.MULTILINE)
    if match is None:
        raise ScaleError(f"the cfg assigns no set to {name}")
    return match, [item.strip() for item in match.group(2).split(",") if item.strip()]


def scaled_config(cfg_text: str, requests: int) -> str:
    """``cfg_text`` with ``requests`` requests ``r1..rN`` and ``PromptBlocks`` (ConnectorContract: ``Need``) more
    blocks per added request."""
    req_match, reqs = _members(cfg_text, "Req")
    if requests < len(reqs):
        raise ScaleError(f"the cfg has {len(reqs)} requests already, more than {requests}")
    # DeferDump's models name a prompt's blocks PromptBlocks; ConnectorContract's name them Need
    prompt = re.search(r"^\s*(?:PromptBlocks|Need)\s*=\s*(\d+)", cfg_text, re.MULTILINE)
    if prompt is None:
        raise ScaleError("the cfg assigns no PromptBlocks (or Need)")
    names = [f"r{i}" for i in range(1, requests + 1)]
    text = cfg_text[:req_match.start(2)] + ", ".join(names) + cfg_text[req_match.end(2):]
    block_match, blocks = _members(text, "Block")
    more = (requests - len(reqs)) * int(prompt.group(1))
    grown = blocks + [f"b{i}" for i in range(len(blocks) + 1, len(blocks) + more + 1)]
    return text[:block_match.start(2)] + ", ".join(grown) + text[block_match.end(2):]
