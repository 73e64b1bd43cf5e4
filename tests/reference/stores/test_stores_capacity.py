"""Bounded stores: LRU eviction of completed, unpinned blocks only; a dump that cannot fit is refused at
submit with `StoreFull`, counted, and leaves nothing behind (no task, no bytes, no file)."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from deferdump.reference.stores.file import FileStore
from deferdump.reference.stores.memory import MemoryStore
from deferdump.reference.stores.base import ReadyPayload, StoreError, StoreFull
from deferdump.reference.stores.threaded import ThreadedStore
from support.stores import GatedPayload, rows, settle


def _h(name: str) -> bytes:
    return name.encode()


def _resident(store: ThreadedStore) -> tuple[int, int]:
    """What the store really holds: (blocks, bytes) in memory or on disk."""
    if isinstance(store, MemoryStore):
        return store.stats().blocks, store.resident_bytes()
    assert isinstance(store, FileStore)
    assert list(store.directory.rglob("*.tmp")) == []
    return store.disk_usage()


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ThreadedStore]:
    made: ThreadedStore = (
        MemoryStore(capacity_blocks=4) if request.param == "memory" else FileStore(tmp_path, capacity_blocks=4)
    )
    yield made
    made.close()


def _dump_now(store: ThreadedStore, *names: str, seed: int = 0) -> None:
    store.wait(store.dump([_h(n) for n in names], ReadyPayload(rows(len(names), seed=seed))))


def test_full_store_refuses_counts_and_leaks_nothing(store: ThreadedStore) -> None:
    running = GatedPayload(rows(3))
    task = store.dump([_h("a"), _h("b"), _h("c")], running)  # 3 slots reserved by a running dump
    before = store.stats()
    with pytest.raises(StoreFull, match="store full"):
        store.dump([_h("d"), _h("e")], ReadyPayload(rows(2)))
    after = store.stats()
    assert after.refused_full == before.refused_full + 1
    assert after.pending == 1 and after.dumps_submitted == before.dumps_submitted
    assert _resident(store) == (after.blocks, after.bytes) == (0, 0)
    running.open()
    store.wait(task)
    assert _resident(store) == (3, store.stats().bytes)
    assert store.lookup_prefix([_h("d")]) == 0


def test_dump_larger_than_capacity_is_refused(store: ThreadedStore) -> None:
    with pytest.raises(StoreFull):
        store.dump([_h(str(i)) for i in range(5)], ReadyPayload(rows(5)))
    assert store.stats().refused_full == 1 and store.stats().pending == 0
    assert _resident(store) == (0, 0)


def test_least_recently_used_completed_block_is_evicted(store: ThreadedStore) -> None:
    _dump_now(store, "a", "b", "c", "d")
    assert store.lookup_prefix([_h("a")]) == 1  # a is now the most recently used
    _dump_now(store, "e", seed=1)
    assert store.lookup_prefix([_h("b")]) == 0, "b was the least recently used"
    assert store.lookup_prefix([_h("a"), _h("c"), _h("d"), _h("e")]) == 4
    assert store.stats().evicted == 1
    blocks, nbytes = _resident(store)
    assert (blocks, nbytes) == (store.stats().blocks, store.stats().bytes) == (4, store.stats().bytes)


def test_blocks_held_by_running_tasks_are_never_evicted(store: ThreadedStore) -> None:
    _dump_now(store, "a", "b")
    pinning = GatedPayload(rows(1))
    dedupe = store.dump([_h("a")], pinning)  # a running dump names a: a is pinned
    reserving = GatedPayload(rows(1))
    fresh = store.dump([_h("x")], reserving)  # one slot reserved
    _dump_now(store, "c", seed=2)  # 2 completed + 1 reserved + 1 new = 4: no eviction yet
    _dump_now(store, "d", seed=3)  # must evict b (a is pinned, x is not completed)
    assert store.lookup_prefix([_h("b")]) == 0
    assert store.lookup_prefix([_h("a")]) == 1
    with pytest.raises(StoreFull):  # a pinned, c/d evictable… but 3 completed + 1 reserved, needs 2 more
        store.dump([_h("y"), _h("z"), _h("w")], ReadyPayload(rows(3)))
    pinning.open()
    reserving.open()
    store.wait(dedupe)
    store.wait(fresh)
    assert store.lookup_prefix([_h("x")]) == 1
    assert store.stats().blocks <= 4
    assert _resident(store) == (store.stats().blocks, store.stats().bytes)


def test_failed_dump_returns_its_reserved_slots(store: ThreadedStore) -> None:
    failing = GatedPayload(rows(4), fail=True)
    task = store.dump([_h(str(i)) for i in range(4)], failing)
    with pytest.raises(StoreFull):
        store.dump([_h("late")], ReadyPayload(rows(1)))
    failing.open()
    settle(store, task)
    _dump_now(store, "late")  # the failed dump's slots came back
    assert store.stats().dumps_failed == 1 and store.stats().blocks == 1
    assert _resident(store) == (1, store.stats().bytes)


@pytest.mark.parametrize("fail", [False, True])
def test_memory_store_frees_evicted_rows_on_its_worker_not_in_dump(fail: bool) -> None:
    with MemoryStore(capacity_blocks=4, workers=1) as store:
        _dump_now(store, "a", "b", "c", "d", seed=1)
        evicted_before = store.stats().evicted
        running = GatedPayload(rows(2, seed=2), fail=fail)
        task = store.dump([_h("e"), _h("f")], running)  # evicts "a" and "b" at submit
        try:
            stats = store.stats()
            assert stats.evicted == evicted_before + 2 and store.lookup_prefix([_h("a")]) == 0
            assert store.resident_bytes() == stats.bytes == 2 * 16  # the index is exact at submit
            assert store.releasing_bytes() == 2 * 16  # unindexed, not yet freed: dump() did not pay for it
        finally:
            running.open()
        if fail:
            with pytest.raises(StoreError):
                store.wait(task)
        else:
            store.wait(task)
        assert store.releasing_bytes() == 0  # the job freed them first, whatever its outcome
        assert _resident(store) == (store.stats().blocks, store.stats().bytes)
        _dump_now(store, "a", seed=3)  # re-dump of an evicted hash: holds its new bytes, not the evicted ones
        assert torch.equal(store.wait(store.load([_h("a")])), rows(1, seed=3))


def test_memory_store_capacity_must_be_positive() -> None:
    for bad in (0, -1, None, 2.0):
        with pytest.raises(ValueError, match="capacity_blocks"):
            MemoryStore(capacity_blocks=bad)  # type: ignore[arg-type]


# --------------------------------------------------------------- property-based
CAPACITY = 4
NAMES = [bytes([0xE0 + i]) * 4 for i in range(7)]


def capacity_machine(kind: str) -> type[RuleBasedStateMachine]:
    class BoundedStore(RuleBasedStateMachine):
        """Random dumps against a 4-block store: refusals exactly when the ledger rule says so, pinned
        blocks never evicted, blocks + reserved slots within capacity, bytes held equal bytes counted."""

        def __init__(self) -> None:
            super().__init__()
            self.tmp = Path(tempfile.mkdtemp(prefix="deferdump-capacity-"))
            self.store: ThreadedStore = (
                MemoryStore(capacity_blocks=CAPACITY) if kind == "memory" else FileStore(self.tmp, capacity_blocks=CAPACITY)
            )
            self.running: dict[int, tuple[object, GatedPayload, set[bytes], int]] = {}  # id -> task, gate, names, slots
            self.refusals = 0

        def present(self) -> set[bytes]:
            return {h for h in NAMES if self.store.lookup_prefix([h]) == 1}

        @rule(names=st.lists(st.sampled_from(NAMES), min_size=1, max_size=3), fails=st.booleans())
        def dump(self, names: list[bytes], fails: bool) -> None:
            before = self.present()
            wanted = set(names)
            new = wanted - before
            reserved = sum(slots for *_, slots in self.running.values())
            pinned = set().union(*(held for _, _, held, _ in self.running.values()))
            evictable = len(before - pinned - wanted)
            must_refuse = len(new) > CAPACITY - len(before) - reserved + evictable
            gate = GatedPayload(rows(len(names)), fail=fails)
            try:
                task = self.store.dump(names, gate)
            except StoreFull:
                assert must_refuse
                self.refusals += 1
                assert self.present() == before, "a refused dump changes nothing"
                return
            assert not must_refuse
            after = self.present()
            assert after <= before and (before & (pinned | wanted)) <= after, "only unpinned blocks are evicted"
            self.running[task.task_id] = (task, gate, wanted, len(new))

        @precondition(lambda self: self.running)
        @rule(data=st.data())
        def finish(self, data: st.DataObject) -> None:
            task_id = data.draw(st.sampled_from(sorted(self.running)))
            task, gate, wanted, _ = self.running.pop(task_id)
            gate.open()
            settle(self.store, task)
            try:
                self.store.wait(task)
                assert wanted <= self.present()
            except StoreError:
                assert gate.fail

        @invariant()
        def within_capacity_and_nothing_leaked(self) -> None:
            stats = self.store.stats()
            reserved = sum(slots for *_, slots in self.running.values())
            assert stats.blocks + reserved <= CAPACITY
            assert stats.refused_full == self.refusals
            assert stats.pending == len(self.running)
            assert _resident(self.store) == (stats.blocks, stats.bytes)

        def teardown(self) -> None:
            for _, gate, _, _ in self.running.values():
                gate.open()
            self.store.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    return BoundedStore


TestBoundedMemoryStore = capacity_machine("memory").TestCase
TestBoundedMemoryStore.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestBoundedFileStore = capacity_machine("file").TestCase
TestBoundedFileStore.settings = settings(max_examples=15, stateful_step_count=20, deadline=None)
