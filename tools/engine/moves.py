"""The environment's moves in the simulated engine: what vLLM's scheduler does not decide itself.

Which running request is preempted although blocks remain (priority preemption), which live requests the
clients abort at the end of a step, and which token a finished forward samples. Bench and soak draw them
from a seeded policy (`SeededMoves`); a property test scripts them (`ScriptedMoves`: Hypothesis chooses
the victim of the next preemption and aborts requests between steps through `SimScheduler.abort`).
Dump task completion and failures are the store's moves (`ManualStore`, `FaultyStore`), not these.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from deferdump.tools.engine.scheduler import SimRequest, WorkloadConfig


class Moves(Protocol):
    def preempt(self, running: Sequence[SimRequest]) -> SimRequest | None:
        """At the start of `schedule()`: a running request to preempt, or None."""

    def aborts(self, live: Sequence[SimRequest]) -> list[SimRequest]:
        """At the end of `update`: the waiting or running requests the clients abort now."""

    def sample(self, request: SimRequest) -> int:
        """The token `request` samples after its last computed token."""


class SeededMoves:
    """`preempt_prob` per step, `abort_prob` per live request and step, uniform tokens; one seeded RNG."""

    def __init__(self, config: WorkloadConfig) -> None:
        self._config = config
        self._rng = random.Random(config.seed)

    def preempt(self, running: Sequence[SimRequest]) -> SimRequest | None:
        if running and self._rng.random() < self._config.preempt_prob:
            return self._rng.choice(running)
        return None

    def aborts(self, live: Sequence[SimRequest]) -> list[SimRequest]:
        return [request for request in live if self._rng.random() < self._config.abort_prob]

    def sample(self, request: SimRequest) -> int:
        return self._rng.randrange(1, 50_000)


class ScriptedMoves:
    """Moves a test decides: `preempt_next` names the next victim; no aborts at step end (the test calls
    `abort`); tokens are a fixed function of the request's tokens (`vocab` bounds them)."""

    def __init__(self, vocab: int = 50) -> None:
        self.vocab = vocab
        self.preempt_next: str | None = None

    def preempt(self, running: Sequence[SimRequest]) -> SimRequest | None:
        wanted, self.preempt_next = self.preempt_next, None
        return next((request for request in running if request.req_id == wanted), None)

    def aborts(self, live: Sequence[SimRequest]) -> list[SimRequest]:
        return []

    def sample(self, request: SimRequest) -> int:
        return (sum(request.tokens) * 31 + len(request.tokens)) % self.vocab
