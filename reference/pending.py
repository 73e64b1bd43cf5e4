"""One submitted, not yet waited dump task on a worker rank (UCM `PendingDumpTask`)."""
from __future__ import annotations

import dataclasses

from deferdump.reference.stores.base import BlockPayload, StoreTask


@dataclasses.dataclass
class PendingDumpTask:
    """A dump task plus what must happen when it is waited.

    `request_ids` decide which `get_finished`/`handle_preemptions` call waits it; `event_handle` is
    released exactly once after the wait (then set to 0, as UCM does); `payload` is kept so the wait can
    make sure the device copy stopped reading the source blocks, whatever the store did.
    """

    task: StoreTask
    request_ids: frozenset[str]
    payload: BlockPayload  # every submitted task has one: the submit fails if the device read does
    event_handle: int = 0
    block_ids: tuple[int, ...] = ()
    layer_name: str | None = None
    checksums: tuple[int, ...] | None = None  # verify_dumps: source blocks at submit
    nbytes: int = 0
    submitted_at: float = 0.0

    def overlaps(self, request_ids: set[str] | frozenset[str]) -> bool:
        return not self.request_ids.isdisjoint(request_ids)


@dataclasses.dataclass
class LoadPart:
    """One store load task of an asynchronous load: the blocks (of one KV-cache group) it fills."""

    task: StoreTask | None  # None: the submit failed (the part is a failure once the load is finished)
    block_ids: tuple[int, ...]
    layer_names: tuple[str, ...] | None = None  # hybrid: the group's layers; None = every layer


@dataclasses.dataclass
class PendingLoad:
    """One request's asynchronous load on a worker rank: its store tasks, waited and written into the KV
    blocks only in `get_finished`, which then reports the request in finished_recving.

    vLLM holds the blocks (the request waits in WAITING_FOR_REMOTE_KVS, or, aborted, has its free delayed)
    until that report, so nothing writes them after they are freed.
    """

    req_id: str
    parts: list[LoadPart]
    finished: bool = False  # the request finished (aborted) while the load ran

    def block_ids(self) -> frozenset[int]:
        return frozenset(b for part in self.parts for b in part.block_ids)
