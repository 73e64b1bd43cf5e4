"""`BlockLedger.reserve_dump` finds its victims in one scan that stops at the last one needed; it must
reserve, pin, evict and refuse exactly as the per-key algorithm it replaced (kept below as the oracle)."""
from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings, strategies as st

from deferdump.reference.stores.base import StoreFull
from deferdump.reference.stores.block_ledger import BlockLedger


class PerKeyLedger:
    """The previous reservation, hash by hash: count every evictable block, pin, then evict."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.completed: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self.pins: collections.Counter[bytes] = collections.Counter()
        self.holds: dict[int, tuple[list[bytes], int]] = {}
        self.reserved = 0

    def reserve_dump(self, task_id: int, block_hashes: Sequence[bytes]) -> list[bytes]:
        wanted = set(block_hashes)
        new = [h for h in wanted if h not in self.completed]
        if self.capacity is not None:
            free = self.capacity - len(self.completed) - self.reserved
            if len(new) > free:
                evictable = sum(1 for h in self.completed if h not in self.pins and h not in wanted)
                if len(new) > free + evictable:
                    raise StoreFull(
                        f"store full: dump needs {len(new)} new block slot(s), {max(free, 0)} free and "
                        f"{evictable} evictable of capacity {self.capacity}"
                    )
                self._pin(task_id, wanted, 0)
                victims = list(itertools.islice((h for h in self.completed if h not in self.pins), len(new) - free))
                for h in victims:
                    del self.completed[h]
                self.holds[task_id] = (self.holds[task_id][0], len(new))
                self.reserved += len(new)
                return victims
        self._pin(task_id, wanted, len(new))
        self.reserved += len(new)
        return []

    def _pin(self, task_id: int, hashes: set[bytes], reserved: int) -> None:
        self.holds[task_id] = (sorted(hashes), reserved)
        for h in hashes:
            self.pins[h] += 1

    def commit(self, task_id: int, block_hash: bytes) -> None:
        pins, reserved = self.holds[task_id]
        if block_hash in self.completed:
            self.completed.move_to_end(block_hash)
            return
        if reserved > 0:
            self.holds[task_id] = (pins, reserved - 1)
            self.reserved -= 1
        self.completed[block_hash] = 1

    def release(self, task_id: int) -> None:
        pins, reserved = self.holds.pop(task_id)
        for h in pins:
            self.pins[h] -= 1
            if self.pins[h] <= 0:
                del self.pins[h]
        self.reserved -= reserved


def _h(i: int) -> bytes:
    return bytes([i]) * 4


def _same(ledger: BlockLedger, oracle: PerKeyLedger) -> None:
    assert ledger.hashes() == list(oracle.completed)
    assert ledger.reserved == oracle.reserved
    assert all(ledger.is_pinned(h) == (h in oracle.pins) for h in map(_h, range(12)))
    assert len(ledger) == len(oracle.completed) and ledger.bytes == len(oracle.completed)


# one step: ("dump", hashes) starts a dump, ("commit", k) commits the k-th running dump's next hash,
# ("release", k) ends the k-th running dump
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("dump"), st.lists(st.integers(0, 7), min_size=0, max_size=5)),
        st.tuples(st.just("commit"), st.integers(0, 5)),
        st.tuples(st.just("release"), st.integers(0, 5)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.sampled_from([None, 2, 3, 5]), steps=_steps)
def test_reservation_matches_the_per_key_algorithm(capacity: int | None, steps: list[tuple[str, object]]) -> None:
    ledger, oracle = BlockLedger(capacity), PerKeyLedger(capacity)
    running: list[tuple[int, list[bytes]]] = []  # (task id, hashes still to commit)
    task_ids = itertools.count(1)
    for kind, arg in steps:
        if kind == "dump":
            hashes = [_h(i) for i in arg]  # type: ignore[union-attr]
            task_id = next(task_ids)
            try:
                expected = oracle.reserve_dump(task_id, hashes)
            except StoreFull as refusal:
                with pytest.raises(StoreFull) as raised:
                    ledger.reserve_dump(task_id, hashes)
                assert str(raised.value) == str(refusal)
            else:
                assert ledger.reserve_dump(task_id, hashes) == expected
                running.append((task_id, list(dict.fromkeys(hashes))))
        elif running:
            task_id, todo = running[int(arg) % len(running)]  # type: ignore[call-overload]
            if kind == "commit" and todo:
                block_hash = todo.pop(0)
                oracle.commit(task_id, block_hash)
                ledger.commit(task_id, block_hash, 1)
            elif kind == "release":
                running.remove((task_id, todo))
                oracle.release(task_id)
                ledger.release(task_id)
        _same(ledger, oracle)


def test_a_hash_reserved_by_a_running_dump_takes_a_second_slot_and_is_never_evicted() -> None:
    ledger = BlockLedger(3)
    assert ledger.reserve_dump(1, [_h(1)]) == []  # running: h1 reserved and pinned, not stored yet
    ledger.reserve_dump(2, [_h(2)])
    ledger.commit(2, _h(2), 1)
    ledger.release(2)
    assert ledger.reserve_dump(3, [_h(1), _h(3)]) == [_h(2)]  # h1 not stored: a slot each; only h2 can go
    assert ledger.reserved == 3 and ledger.is_pinned(_h(1))
    with pytest.raises(StoreFull, match="needs 1 new block slot.*0 free and 0 evictable"):
        ledger.reserve_dump(4, [_h(4)])
    assert ledger.reserved == 3 and not ledger.is_pinned(_h(4)), "a refusal changes nothing"


def test_a_refused_reservation_counts_every_evictable_block_and_changes_nothing() -> None:
    ledger = BlockLedger(4)
    for i in range(4):
        ledger.reserve_dump(i, [_h(i)])
        ledger.commit(i, _h(i), 1)
        ledger.release(i)
    ledger.reserve_dump(10, [_h(0)])  # h0 stored and pinned by a running dump: not evictable
    before = (ledger.hashes(), ledger.reserved)
    with pytest.raises(StoreFull, match=r"needs 4 new block slot\(s\), 0 free and 2 evictable of capacity 4"):
        ledger.reserve_dump(11, [_h(1), _h(5), _h(6), _h(7), _h(8)])  # h1 is named: kept, not a victim
    assert (ledger.hashes(), ledger.reserved) == before
    assert not ledger.is_pinned(_h(5))
    assert ledger.reserve_dump(12, [_h(5), _h(6)]) == [_h(1), _h(2)], "least recently used, unpinned first"
