"""A bounded in-memory block store: asynchronous like a real store, evicting least recently used blocks.

It is what the connector uses when no directory is configured and what soak tests run by default: the
asynchrony (a worker thread that first waits for the device copy, then stores the bytes) is what makes
the deferred-free question real, the bound is what makes `StoreFull` and eviction reachable.

Rows live in a `RowPool` and are offered as `staging`: a device gathers a dump straight into the rows this
store then keeps, one copy per byte into reused memory; a payload from elsewhere is copied into pool rows.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from deferdump.reference.stores.base import StagedRows
from deferdump.reference.stores.row_pool import RowPool
from deferdump.reference.stores.threaded import BadBlock, ThreadedStore


class MemoryStore(ThreadedStore):
    """Blocks in host memory, at most `capacity_blocks` of them; only completed, unpinned blocks are evicted."""

    def __init__(self, capacity_blocks: int, *, workers: int = 2) -> None:
        if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int) or capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be a positive integer, got {capacity_blocks!r}")
        super().__init__(capacity_blocks, workers=workers, name="memory-store")
        self._blocks: dict[bytes, torch.Tensor] = {}
        self._evicted: list[bytes] = []  # evicted hashes still indexed, unindexed by the next job (`_reclaim`)
        self._dropped: list[torch.Tensor] = []  # unindexed rows, given back by the next job on a worker
        self._blocks_lock = threading.Lock()
        self.pool = RowPool()

    def staging(self, num_rows: int, row_nbytes: int) -> StagedRows | None:
        if num_rows < 1 or row_nbytes < 1:
            return None
        return self.pool.stage(num_rows, row_nbytes)

    def _write_block(self, block_hash: bytes, row: torch.Tensor) -> int:
        # A staged row is kept as it is; any other row is copied (the payload's buffer may be reused by its
        # owner once the task ends).
        kept = self.pool.keep(row) if row.numel() else row.clone()
        with self._blocks_lock:
            replaced = self._blocks.get(block_hash)
            self._blocks[block_hash] = kept
            if replaced is not None:
                self._dropped.append(replaced)
        return kept.numel()

    def _read_block(self, block_hash: bytes) -> torch.Tensor:
        with self._blocks_lock:
            row = self._blocks.get(block_hash)
        if row is None:
            raise BadBlock("bytes missing from memory", corrupt=True)
        return row

    def _drop_block(self, block_hash: bytes) -> None:
        """Unindex now (a corrupt block: under the lock, by key); free on a worker (`_reclaim`)."""
        with self._blocks_lock:
            row = self._blocks.pop(block_hash, None)
            if row is not None:
                self._dropped.append(row)

    def _drop_blocks(self, block_hashes: Sequence[bytes]) -> None:
        """A dump's evicted blocks: only noted here, on the forward's thread (`dump`); the next job unindexes
        and frees them (`_reclaim`), which cost `dump`'s caller one dict pop per block, and freeing ~28 evicted
        2 MiB rows ~1.5-4.7 ms.

        Why no reader sees the evicted bytes meanwhile: the ledger forgot them already (lookups and loads
        ask it first), and no job writes an evicted hash before it ran `_reclaim`: a running dump pins its
        hashes, so only a later dump can write it again, and its job starts with `_reclaim`, which unindexes
        every eviction noted before under the same lock as the writes."""
        with self._blocks_lock:
            self._evicted.extend(block_hashes)

    def _reclaim(self) -> None:
        with self._blocks_lock:
            evicted, self._evicted = self._evicted, []
            dropped, self._dropped = self._dropped, []
            for block_hash in evicted:
                row = self._blocks.pop(block_hash, None)
                if row is not None:
                    dropped.append(row)
        for row in dropped:  # the rows go back to the pool here, on the worker, outside the store's lock
            if row.numel():
                self.pool.give_back(row)

    def releasing_bytes(self) -> int:
        """Bytes of dropped blocks not yet freed (0 once the job after the evicting dump started)."""
        with self._blocks_lock:
            evicted = [self._blocks[h] for h in set(self._evicted) if h in self._blocks]
            return sum(row.numel() for row in self._dropped + evicted)

    def resident_bytes(self) -> int:
        """Bytes of the blocks held, dropped ones aside (stats().bytes must equal it: the leak check of the
        full-store tests)."""
        with self._blocks_lock:
            evicted = set(self._evicted)
            return sum(row.numel() for block_hash, row in self._blocks.items() if block_hash not in evicted)
