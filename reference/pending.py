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
