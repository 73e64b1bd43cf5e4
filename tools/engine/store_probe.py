"""A pass-through store that records what the connector asked of it, for the invariant checker.

The step loop puts one `ProbeStore` between each worker connector and the shared store. It learns which
tasks `check` reported finished, and which tasks were waited in which phase of the step (the loop says
which phase it is in). That is how the loop observes, without touching connector code, whether
`wait_for_save` ever waited an unfinished task (`NoWaitInWaitForSaveInv`) and which tasks `handle_preemptions`
waited (`PreemptWaitsOnlyPreemptedInv`). With `wrap_payload` set, each dump's payload is wrapped on its
way to the store (the content oracle checks the bytes the store consumes).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from deferdump.reference.stores.base import BlockPayload, KVStore, StagedRows, StoreStats, StoreTask


class ProbeStore(KVStore):
    """Forwards every call to `inner`; records finished checks and per-phase waits."""

    def __init__(
        self, inner: KVStore, wrap_payload: Callable[[Sequence[bytes], BlockPayload], BlockPayload] | None = None
    ) -> None:
        self.inner = inner
        self._wrap_payload = wrap_payload
        self.phase = ""
        self._checked_finished: set[int] = set()
        self.waits: list[tuple[str, int, bool]] = []  # (phase, task id, check had said finished)

    def lookup_prefix(self, block_hashes: Sequence[bytes]) -> int:
        return self.inner.lookup_prefix(block_hashes)

    def dump(self, block_hashes: Sequence[bytes], payload: BlockPayload) -> StoreTask:
        if self._wrap_payload is not None:
            payload = self._wrap_payload(block_hashes, payload)
        return self.inner.dump(block_hashes, payload)

    def staging(self, num_rows: int, row_nbytes: int) -> StagedRows | None:
        return self.inner.staging(num_rows, row_nbytes)

    def load(self, block_hashes: Sequence[bytes]) -> StoreTask:
        return self.inner.load(block_hashes)

    def check(self, task: StoreTask) -> bool:
        finished = self.inner.check(task)
        if finished:
            self._checked_finished.add(task.task_id)
        return finished

    def wait(self, task: StoreTask, timeout: float | None = None) -> torch.Tensor | None:
        self.waits.append((self.phase, task.task_id, task.task_id in self._checked_finished))
        self._checked_finished.discard(task.task_id)
        return self.inner.wait(task, timeout)

    def take_waits(self) -> list[tuple[str, int, bool]]:
        """The waits recorded since the last call (the list is reset)."""
        waits, self.waits = self.waits, []
        return waits

    def stats(self) -> StoreStats:
        return self.inner.stats()

    def close(self) -> None:
        """The shared store is closed by its owner, not through one rank's probe."""
