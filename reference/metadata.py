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

    def has_load(self) -> bool:
        return bool(self.load_hashes)

    def has_dump(self) -> bool:
        return bool(self.dump_hashes)


@dataclasses.dataclass(frozen=True)
class DeferDumpMetadata:
    """One step's metadata (UCM `UCMConnectorMetadata` + `preempted_req_ids`)."""

    request_meta: dict[str, RequestDispatchMeta] = dataclasses.field(default_factory=dict)
    preempted_req_ids: frozenset[str] = frozenset()
    extra_async_saves: dict[str, int] = dataclasses.field(default_factory=dict)

    def dump_req_ids(self) -> frozenset[str]:
        """Requests this step gives a non-empty dump slice: what both tracking sets add."""
        return frozenset(req_id for req_id, meta in self.request_meta.items() if meta.has_dump())
