"""ManualStore: tasks end only when the test says so, and every check/wait is recorded."""
from __future__ import annotations

import pytest
import torch

from deferdump.reference.testing.manual_store import ManualStore
from deferdump.reference.stores.base import LoadError, ReadyPayload, StoreError, SubmitError, TaskNotFound


def _payload(n: int, nbytes: int = 8, fill: int = 7) -> ReadyPayload:
    return ReadyPayload(torch.full((n, nbytes), fill, dtype=torch.uint8))


def test_task_runs_until_completed_and_wait_erases_it() -> None:
    store = ManualStore()
    task = store.dump([b"a", b"b"], _payload(2))
    assert store.pending_tasks() == [task]
    assert not store.check(task) and not store.check(task)
    assert store.lookup_prefix([b"a", b"b"]) == 0
    with pytest.raises(StoreError, match="would block"):
        store.wait(task)
    assert store.outstanding_tasks() == [task]  # a refused wait erases nothing
    store.complete(task)
    assert store.finished(task) and store.check(task)
    assert store.pending_tasks() == [] and store.outstanding_tasks() == [task]
    assert store.lookup_prefix([b"a", b"b", b"c"]) == 2
    assert store.wait(task) is None
    with pytest.raises(TaskNotFound):
        store.wait(task)
    with pytest.raises(TaskNotFound):
        store.check(task)
    assert store.checked == [task, task, task] and store.waited == [task]
    assert store.stats().pending == 0 and store.stats().dumps_completed == 1


def test_auto_complete_on_wait_drains_the_transfer() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    dump = store.dump([b"x"], _payload(1, fill=3))
    store.wait(dump)
    load = store.load([b"x"])
    data = store.wait(load)
    assert data is not None and data.tolist() == [[3] * 8]
    assert store.stats().pending == 0


def test_failed_task_raises_from_wait_only_and_stores_nothing() -> None:
    store = ManualStore()
    task = store.dump([b"a"], _payload(1))
    store.fail(task, message="disk on fire")
    assert store.check(task)
    with pytest.raises(StoreError, match="disk on fire"):
        store.wait(task)
    with pytest.raises(TaskNotFound):
        store.wait(task)
    assert store.lookup_prefix([b"a"]) == 0
    assert store.stats().dumps_failed == 1 and store.stats().pending == 0


def test_load_of_missing_block_is_a_load_error_naming_it() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    task = store.load([b"missing"])
    with pytest.raises(LoadError) as info:
        store.wait(task)
    assert info.value.bad_hashes == (b"missing",)


def test_submit_and_check_fault_hooks() -> None:
    store = ManualStore()
    store.submit_fail_next = 1
    with pytest.raises(SubmitError):
        store.dump([b"a"], _payload(1))
    assert store.outstanding_tasks() == [] and store.stats().dumps_submitted == 0
    task = store.dump([b"a"], _payload(1))
    store.check_fail = True
    with pytest.raises(StoreError, match="injected check failure"):
        store.check(task)
    assert store.outstanding_tasks() == [task]
    store.check_fail = False
    store.complete(task)
    with pytest.raises(StoreError, match="already finished"):
        store.complete(task)
    store.wait(task)


def test_payload_copy_failure_fails_the_dump() -> None:
    class BrokenPayload:
        def done(self) -> bool:
            return True

        def result(self) -> torch.Tensor:
            raise RuntimeError("copy stream died")

    store = ManualStore()
    task = store.dump([b"a"], BrokenPayload())
    store.complete(task)
    with pytest.raises(StoreError, match="copy stream died"):
        store.wait(task)
    assert store.lookup_prefix([b"a"]) == 0


def test_seeded_blocks_are_found_and_loaded_without_a_submitted_task() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    rows = {b"k1": torch.full((6,), 7, dtype=torch.uint8), b"k2": torch.arange(6, dtype=torch.uint8)}
    store.seed(rows)
    rows[b"k1"].fill_(0)  # seeding copies: the caller's tensor is not the stored one
    assert store.submitted == [] and store.stored_hashes() == {b"k1", b"k2"}
    assert store.lookup_prefix([b"k1", b"k2", b"k3"]) == 2
    data = store.wait(store.load([b"k1", b"k2"]))
    assert data is not None and data[0].tolist() == [7] * 6 and data[1].tolist() == list(range(6))


@pytest.mark.parametrize("row", [torch.zeros(2, 3, dtype=torch.uint8), torch.zeros(6, dtype=torch.float32)])
def test_seed_refuses_rows_that_are_not_1d_bytes(row: torch.Tensor) -> None:
    store = ManualStore()
    with pytest.raises(ValueError, match="1-D uint8"):
        store.seed({b"ok": torch.zeros(6, dtype=torch.uint8), b"k": row})
    assert store.stored_hashes() == frozenset()
