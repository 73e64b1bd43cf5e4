"""vLLM-free views of the objects the connector reads.

The vLLM adapter builds these from `Request` and `SchedulerOutput`; tests and the conformance replay
build them directly. Keeping the protocol core on these views is what lets it run without vLLM.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RequestView:
    """A request as the scheduler side sees it at lookup/finish time."""

    req_id: str
    token_ids: tuple[int, ...]  # all tokens known now (prompt, plus outputs for a resumed request)
    num_prompt_tokens: int


@dataclasses.dataclass(frozen=True)
class NewRequestView:
    """A request scheduled for the first time in a step (vLLM `NewRequestData`)."""

    req_id: str
    token_ids: tuple[int, ...]
    num_prompt_tokens: int
    block_ids: tuple[int, ...]  # every block of the request, prefix-cache hits included
    num_computed_tokens: int
    num_scheduled_tokens: int
    group_block_ids: tuple[tuple[int, ...], ...] = ()  # hybrid: the other KV-cache groups' block lists


@dataclasses.dataclass(frozen=True)
class CachedRequestView:
    """A request scheduled again (continuing, or resumed after preemption: V1 `CachedRequestData`)."""

    req_id: str
    new_block_ids: tuple[int, ...]  # blocks allocated in this step (all blocks when resumed)
    resumed_from_preemption: bool
    num_computed_tokens: int  # computed before this step: what vLLM frees the sliding window on
    num_scheduled_tokens: int
    new_group_block_ids: tuple[tuple[int, ...], ...] = ()  # hybrid: the other groups' new blocks


@dataclasses.dataclass(frozen=True)
class StepView:
    """One `SchedulerOutput`, reduced to what `build_connector_meta` reads."""

    new_requests: tuple[NewRequestView, ...] = ()
    cached_requests: tuple[CachedRequestView, ...] = ()
    finished_req_ids: frozenset[str] = frozenset()
    preempted_req_ids: frozenset[str] = frozenset()
