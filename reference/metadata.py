"""Scheduler → worker metadata: picklable, because vLLM ships it to every worker process each step."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RequestDispatchMeta:
    """What one request loads and dumps in one step (UCM `RequestDispatchMeta`).

    Hashes and vLLM block ids are parallel for loads; for dumps too, except under context parallelism,
    where the scheduler's hash list holds `cp_world_size` hashes per block until each rank slices its own.
    """

    load_hashes: tuple[bytes, ...] = ()
    load_block_ids: tuple[int, ...] = ()
    dump_hashes: tuple[bytes, ...] = ()
    dump_block_ids: tuple[int, ...] = ()
    # Hybrid models: the other KV-cache groups' blocks of the same slices (group 1 first), each parallel
    # to the hashes; a null block (0) is a position the group no longer holds and is skipped.
    load_group_block_ids: tuple[tuple[int, ...], ...] = ()
    dump_group_block_ids: tuple[tuple[int, ...], ...] = ()
    # The load runs on the store threads beside the forward (config `load_async`): vLLM parks the request in
    # WAITING_FOR_REMOTE_KVS and schedules it only after the worker reports it in finished_recving.
    load_async: bool = False

    def has_load(self) -> bool:
        return bool(self.load_hashes)

    def has_dump(self) -> bool:
        return bool(self.dump_hashes)


@dataclasses.dataclass(frozen=True)
class DeferDumpMetadata:
    """One step's metadata (UCM `UCMConnectorMetadata` + `preempted_req_ids`, + `freed_block_ids`)."""

    request_meta: dict[str, RequestDispatchMeta] = dataclasses.field(default_factory=dict)
    preempted_req_ids: frozenset[str] = frozenset()
    extra_async_saves: dict[str, int] = dataclasses.field(default_factory=dict)
    # Hybrid models: blocks vLLM freed since the previous schedule (sliding-window frees of running
    # requests, finish and preemption frees). Any of them may be rewritten by this step's forward, so the
    # worker's fence waits the pending dumps that read one before the forward runs.
    freed_block_ids: frozenset[int] = frozenset()
    # Does this step run a forward (some request scheduled)? False: vLLM only polls the connector, e.g.
    # while every request waits for its asynchronous load (the worker then yields to the store's threads).
    forward: bool = True

    def dump_req_ids(self) -> frozenset[str]:
        """Requests this step gives a non-empty dump slice: what both tracking sets add."""
        return frozenset(req_id for req_id, meta in self.request_meta.items() if meta.has_dump())
