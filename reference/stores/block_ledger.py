"""Bookkeeping of a bounded block store: completed blocks in LRU order, and what running tasks hold.

A store may evict only *completed* blocks that no running task touches (a running dump may still be
writing them, a running load may still be reading them). The ledger makes that rule one place: a dump
*reserves* a slot for every block it may add and *pins* every hash it names; a load pins the hashes it
reads; eviction picks the least recently used unpinned block; a dump that cannot get its slots even
after evicting everything evictable is refused with `StoreFull` before anything changed.

Invariant (capacity set): `len(completed) + reserved_total <= capacity`.
The ledger is not thread-safe: its store calls it under the store's lock.
"""
from __future__ import annotations

import collections
import itertools
import dataclasses
from collections.abc import Collection, Iterable, Sequence

from deferdump.reference.stores.base import StoreFull


@dataclasses.dataclass
class _Hold:
    """What one running task holds: pins per hash and slots not yet used."""

    pins: Collection[bytes]  # each hash once; `release` unpins them
    reserved: int


class BlockLedger:
    """Completed blocks (hash -> stored size) in LRU order plus the pins and reservations of running tasks."""

    def __init__(self, capacity_blocks: int | None) -> None:
        if capacity_blocks is not None and (
            isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int) or capacity_blocks < 1
        ):
            raise ValueError(f"capacity_blocks must be a positive integer or None, got {capacity_blocks!r}")
        self.capacity_blocks = capacity_blocks
        self._completed: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # oldest first
        self._pins: collections.Counter[bytes] = collections.Counter()
        self._holds: dict[int, _Hold] = {}
        self._reserved_total = 0
        self.bytes = 0

    # ------------------------------------------------------------------ reads
    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._completed

    def __len__(self) -> int:
        return len(self._completed)

    def size_of(self, block_hash: bytes) -> int:
        return self._completed[block_hash]

    def hashes(self) -> list[bytes]:
        """Completed hashes, least recently used first."""
        return list(self._completed)

    @property
    def reserved(self) -> int:
        return self._reserved_total

    def is_pinned(self, block_hash: bytes) -> bool:
        return block_hash in self._pins  # `release` deletes counts that reach zero

    # --------------------------------------------------------------- changes
    def add_existing(self, block_hash: bytes, size: int) -> None:
        """Register a block found on the back-end (start-up scan, another instance's write), as newest.

        Capacity is restored by `shrink_to_capacity` or by the next `reserve_dump`, which evicts the excess.
        """
        if block_hash in self._completed:
            return
        self._completed[block_hash] = size
        self.bytes += size

    def shrink_to_capacity(self) -> list[bytes]:
        """Evict LRU unpinned blocks until completed + reserved fit the capacity; returns the evicted."""
        if self.capacity_blocks is None:
            return []
        excess = len(self._completed) + self._reserved_total - self.capacity_blocks
        return self._evict(excess) if excess > 0 else []

    def reserve_dump(self, task_id: int, block_hashes: Sequence[bytes]) -> list[bytes]:
        """Pin the dump's hashes and reserve slots for those not stored; returns the hashes evicted for room.

        Raises `StoreFull` (and changes nothing) when the slots cannot be found. The victims are the least
        recently used completed blocks that no task pins and the dump does not name, found in one scan that
        stops at the last one needed (this runs inside `dump`, on the forward's thread).
        """
        wanted = set(block_hashes)
        completed = self._completed
        new = len(wanted) - len(completed.keys() & wanted)  # C-level: probes the dict once per wanted hash
        evicted: list[bytes] = []
        if self.capacity_blocks is not None:
            free = self.capacity_blocks - len(completed) - self._reserved_total
            needed = new - free
            if needed > 0:
                unpinned = itertools.filterfalse(self._pins.__contains__, completed)
                evicted = list(itertools.islice(itertools.filterfalse(wanted.__contains__, unpinned), needed))
                if len(evicted) < needed:  # the scan ran out: `evicted` holds every evictable block
                    raise StoreFull(
                        f"store full: dump needs {new} new block slot(s), {max(free, 0)} free and "
                        f"{len(evicted)} evictable of capacity {self.capacity_blocks}"
                    )
                for block_hash in evicted:
                    self.bytes -= completed.pop(block_hash)
        self._pin(task_id, wanted, new)
        self._reserved_total += new
        return evicted

    def pin_load(self, task_id: int, block_hashes: Iterable[bytes]) -> None:
        """Keep the hashes a load reads from being evicted until `release(task_id)`."""
        self._pin(task_id, set(block_hashes), 0)

    def commit(self, task_id: int, block_hash: bytes, size: int) -> bool:
        """Record a block a dump finished writing; False (nothing changed but LRU) if it was already stored."""
        hold = self._holds[task_id]
        if block_hash in self._completed:
            self._completed.move_to_end(block_hash)
            return False
        if hold.reserved > 0:
            hold.reserved -= 1
            self._reserved_total -= 1
        self._completed[block_hash] = size
        self.bytes += size
        return True

    def touch(self, block_hash: bytes) -> None:
        if block_hash in self._completed:
            self._completed.move_to_end(block_hash)

    def release(self, task_id: int) -> None:
        """The task stopped: drop its pins and return its unused slots."""
        hold = self._holds.pop(task_id, None)
        if hold is None:
            return
        for block_hash in hold.pins:
            self._pins[block_hash] -= 1
            if self._pins[block_hash] <= 0:
                del self._pins[block_hash]
        self._reserved_total -= hold.reserved

    def discard(self, block_hash: bytes) -> bool:
        """Forget a completed block (found corrupt or missing); True if it was there."""
        size = self._completed.pop(block_hash, None)
        if size is None:
            return False
        self.bytes -= size
        return True

    # --------------------------------------------------------------- helpers
    def _pin(self, task_id: int, hashes: set[bytes], reserved: int) -> None:
        self._holds[task_id] = _Hold(hashes, reserved)
        self._pins.update(hashes)  # one C-level count per hash (a `+=` per key runs Counter.__missing__)

    def _evict(self, count: int) -> list[bytes]:
        # `h not in pins`, not `pins[h] == 0`: a Counter miss calls Python-level __missing__, and this scan
        # over every stored block runs inside `dump` on the forward's thread; stop at `count`.
        victims = list(itertools.islice((h for h in self._completed if h not in self._pins), count))
        for block_hash in victims:
            self.discard(block_hash)
        return victims
