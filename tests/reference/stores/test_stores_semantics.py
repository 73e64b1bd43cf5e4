"""Task semantics every store shares (store_base, UCM §9): check never consumes, wait erases, a failed
task raises only after it stopped, lookup counts only completed leading blocks."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from deferdump.reference.testing.manual_store import ManualStore
from deferdump.reference.stores.base import LoadError, ReadyPayload, StoreError, StoreTask, TaskNotFound
from deferdump.reference.stores.memory import MemoryStore
from support.stores import STORE_KINDS, StoreHarness, make_harness, rows, settle


def _harness(kind: str, tmp_path: Path) -> Iterator[StoreHarness]:
    made = make_harness(kind, tmp_path)
    yield made
    for payload in made._payloads.values():
        payload.open()  # never leave a worker blocked on a gate
    made.store.close()


@pytest.fixture(params=STORE_KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
    yield from _harness(request.param, tmp_path)


@pytest.fixture(params=[kind for kind in STORE_KINDS if kind != "manual"])
def blocking_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
    """Stores whose `wait` blocks on a running task (ManualStore refuses instead, by design)."""
    yield from _harness(request.param, tmp_path)


def _wait_in_thread(store, task: StoreTask, timeout: float | None = None) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = store.wait(task, timeout)
        except Exception as exc:  # recorded for the assertion
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_check_never_consumes_and_second_wait_raises(harness: StoreHarness) -> None:
    store = harness.store
    task = harness.dump([b"a", b"b"], rows(2))
    for _ in range(3):
        assert store.check(task) is False
    assert store.stats().pending == 1
    harness.release(task)
    settle(store, task)
    for _ in range(3):
        assert store.check(task) is True
    assert store.wait(task) is None
    with pytest.raises(TaskNotFound):
        store.wait(task)
    with pytest.raises(TaskNotFound):
        store.check(task)
    stats = store.stats()
    assert stats.pending == 0 and stats.dumps_submitted == 1 and stats.dumps_completed == 1


def test_unknown_task_is_task_not_found(harness: StoreHarness) -> None:
    stranger = StoreTask.new("dump", [b"z"])
    with pytest.raises(TaskNotFound):
        harness.store.check(stranger)
    with pytest.raises(TaskNotFound):
        harness.store.wait(stranger)


def test_failed_task_is_finished_for_check_and_raises_from_wait(harness: StoreHarness) -> None:
    store = harness.store
    task = harness.dump([b"a"], rows(1), fail=True)
    assert store.check(task) is False
    harness.release(task)
    settle(store, task)
    assert store.check(task) is True
    with pytest.raises(StoreError) as info:
        store.wait(task)
    assert not isinstance(info.value, TaskNotFound)
    with pytest.raises(TaskNotFound):
        store.wait(task)
    assert store.lookup_prefix([b"a"]) == 0
    stats = store.stats()
    assert stats.dumps_failed == 1 and stats.pending == 0 and stats.blocks == 0


def test_wait_on_running_failed_task_raises_only_after_the_transfer_stopped(harness: StoreHarness) -> None:
    store = harness.store
    task = harness.dump([b"a"], rows(1), fail=True)
    if not harness.blocking_wait:
        with pytest.raises(StoreError, match="would block"):
            store.wait(task)
        assert isinstance(store, ManualStore) and store.outstanding_tasks() == [task]
        harness.release(task)
        with pytest.raises(StoreError, match="simulated device copy failure"):
            store.wait(task)
        return
    thread, outcome = _wait_in_thread(store, task)
    thread.join(0.15)
    assert thread.is_alive() and outcome == {}, "wait returned while the transfer was still running"
    harness.release(task)
    thread.join(10)
    assert isinstance(outcome.get("error"), StoreError)
    assert not isinstance(outcome["error"], TaskNotFound)
    assert store.stats().pending == 0


def _capture_waited_jobs(store: object, monkeypatch: pytest.MonkeyPatch) -> list:
    """The jobs a ThreadedStore's `wait` looks up from now on (white box: a job's cancel flag is set exactly
    when its wait timed out). FaultyStore's slow-task delay here is at most the wait's timeout, so its
    wait hands the timeout to the inner store."""
    inner = getattr(store, "inner", store)
    jobs: list = []
    lookup = inner._job

    def capture(task: StoreTask):  # type: ignore[no-untyped-def]
        job = lookup(task)
        jobs.append(job)
        return job

    monkeypatch.setattr(inner, "_job", capture)
    return jobs


def _until(condition, what: str, limit_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    """Poll for a state the test needs (not a timing assertion: the limit only turns a hang into a failure)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


def test_timed_out_wait_drains_the_transfer_before_raising(blocking_harness: StoreHarness,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    harness = blocking_harness
    store = harness.store
    task = harness.dump([b"a"], rows(1))
    jobs = _capture_waited_jobs(store, monkeypatch)
    thread, outcome = _wait_in_thread(store, task, timeout=0.02)
    # release only once the wait has timed out (before: a fixed 0.2 s, and a waiter that a loaded machine
    # had not yet run saw the task done and returned it instead of timing out)
    _until(lambda: bool(jobs) and jobs[0].cancel.is_set(), "the wait timed out")
    assert thread.is_alive(), "a timed-out wait must keep draining until the transfer stopped"
    harness.release(task)
    thread.join(10)
    assert isinstance(outcome.get("error"), StoreError) and "timed out" in str(outcome["error"])
    with pytest.raises(TaskNotFound):
        store.wait(task)
    assert store.lookup_prefix([b"a"]) == 0, "a timed-out dump must not be committed"
    assert store.stats().pending == 0


def test_lookup_prefix_counts_only_completed_leading_blocks(harness: StoreHarness) -> None:
    store = harness.store
    task = harness.dump([b"a", b"b"], rows(2))
    assert store.lookup_prefix([b"a", b"b"]) == 0
    harness.release(task)
    settle(store, task)
    assert store.lookup_prefix([b"a", b"b", b"c"]) == 2
    assert store.lookup_prefix([b"c", b"a"]) == 0
    assert store.lookup_prefix([b"a", b"c", b"b"]) == 1
    assert store.lookup_prefix([]) == 0
    running = harness.dump([b"c"], rows(1, seed=2))
    assert store.lookup_prefix([b"a", b"b", b"c"]) == 2
    harness.release(running)
    settle(store, running)
    assert store.lookup_prefix([b"a", b"b", b"c"]) == 3
    store.wait(task)
    store.wait(running)


def test_load_returns_stored_bytes_and_names_missing_blocks(harness: StoreHarness) -> None:
    data = rows(3, nbytes=32, seed=5)
    harness.dump_now([b"x", b"y", b"z"], data)
    loaded = harness.load_now([b"z", b"x"])
    assert loaded is not None and torch.equal(loaded, data[[2, 0]])
    with pytest.raises(LoadError) as info:
        harness.load_now([b"x", b"missing"])
    assert info.value.bad_hashes == (b"missing",)
    assert harness.store.stats().pending == 0


def test_stats_pending_counts_submitted_not_yet_waited(harness: StoreHarness) -> None:
    store = harness.store
    tasks = [harness.dump([bytes([i + 1])], rows(1, seed=i)) for i in range(3)]
    assert store.stats().pending == 3
    for task in tasks:
        harness.release(task)
    for task in tasks:
        settle(store, task)
    assert store.stats().pending == 3, "finishing is not waiting: pending counts un-waited tasks"
    for count, task in enumerate(tasks, start=1):
        store.wait(task)
        assert store.stats().pending == 3 - count


def test_dump_of_an_already_stored_hash_is_deduplicated(harness: StoreHarness) -> None:
    first = rows(1, seed=1)
    harness.dump_now([b"k"], first)
    harness.dump_now([b"k"], rows(1, seed=2))
    assert harness.store.stats().blocks == 1
    loaded = harness.load_now([b"k"])
    assert loaded is not None and torch.equal(loaded, first)


def test_closed_store_refuses_new_tasks_after_draining(blocking_harness: StoreHarness) -> None:
    harness = blocking_harness
    task = harness.dump([b"a"], rows(1))
    closer = threading.Thread(target=harness.store.close)
    closer.start()
    time.sleep(0.05)
    harness.release(task)
    closer.join(10)
    assert not closer.is_alive()
    assert harness.store.check(task) is True, "close drains running tasks"
    harness.store.wait(task)
    with pytest.raises(StoreError, match="closed"):
        harness.store.dump([b"b"], rows(1))


@pytest.mark.parametrize("bad", [b"", "text", 7, bytearray(b"x")])
def test_a_dump_naming_a_bad_hash_is_refused_before_anything_starts(bad: object) -> None:
    with MemoryStore(4) as store:
        with pytest.raises(ValueError, match="non-empty bytes"):
            store.dump([b"ok", bad], ReadyPayload(torch.zeros((2, 4), dtype=torch.uint8)))  # type: ignore[list-item]
        assert store.stats().pending == 0 and store.stats().dumps_submitted == 0


def test_a_hash_of_a_bytes_subclass_is_accepted() -> None:
    class Key(bytes):
        pass

    with MemoryStore(4) as store:
        store.wait(store.dump([Key(b"k1"), b"k2"], ReadyPayload(torch.ones((2, 4), dtype=torch.uint8))))
        assert store.lookup_prefix([b"k1", b"k2"]) == 2
