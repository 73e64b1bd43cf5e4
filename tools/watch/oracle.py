"""The output oracle: greedy tokens and logprobs served through a connector, bitwise equal to a run without one.

Greedy decoding on CPU is deterministic, and with random weights (std 0.2) the outputs depend on every
stored K/V: a block a connector loaded wrong, or one it saved after vLLM rewrote it, shows up as a
different token or logprob. Logprobs are compared as the exact IEEE double (`float.hex`), never with a
tolerance.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

#: A prompt's output: (token id, its logprob) per generated token.
Output = Sequence[tuple[int, float]]


def first_mismatch(expected: Mapping[str, Output], got: Mapping[str, Output]) -> str | None:
    """None when every prompt of `expected` has a bitwise equal output in `got`; else one line naming the
    first prompt (in `expected`'s order) that differs and its first differing token."""
    for prompt, want in expected.items():
        have = got.get(prompt)
        if have is None:
            return f"prompt {prompt}: no output with the connector"
        for index, (w, h) in enumerate(zip(want, have)):
            if w[0] != h[0] or float(w[1]).hex() != float(h[1]).hex():
                return (f"prompt {prompt}: token {index}: expected {w[0]} (logprob {w[1]!r}), "
                        f"got {h[0]} (logprob {h[1]!r})")
        if len(want) != len(have):
            return f"prompt {prompt}: {len(have)} tokens, expected {len(want)}"
    return None
