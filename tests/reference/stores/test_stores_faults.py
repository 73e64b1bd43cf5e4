"""FaultConfig validation and FaultyStore: injected rates honoured (fixed seed), every fault path leaves
no task pending in the inner store, an injected wait failure reports only after the transfer stopped."""
from __future__ import annotations

import math
import threading
import time

import pytest

from deferdump.reference.stores.faults import FaultConfig, FaultyStore
from deferdump.reference.testing.manual_store import ManualStore
from deferdump.reference.stores.memory import MemoryStore
from deferdump.reference.stores.base import ReadyPayload, StoreError, SubmitError, TaskNotFound
from support.stores import GatedPayload, rows, settle

N = 2000


def _within_binomial(count: int, n: int, rate: float) -> bool:
    """count is within 5 standard deviations of n*rate (false failure odds ~1e-6)."""
    return abs(count - n * rate) <= 5 * math.sqrt(n * rate * (1 - rate))


@pytest.mark.parametrize(
    ("field", "value"),
    [("submit_fail", -0.1), ("submit_fail", 1.5), ("check_fail", float("nan")), ("wait_fail", "0.2"),
     ("wait_fail", True), ("delay_s", -1.0), ("delay_s", float("inf")), ("seed", 1.5)],
)
def test_fault_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"FaultConfig.{field}"):
        FaultConfig(**{field: value})


def test_fault_config_from_mapping_names_unknown_keys() -> None:
    assert FaultConfig.from_mapping({"submit_fail": 0.5, "seed": 3}) == FaultConfig(submit_fail=0.5, seed=3)
    with pytest.raises(ValueError, match="submit_fial"):
        FaultConfig.from_mapping({"submit_fial": 0.5})
    assert not FaultConfig().active and FaultConfig(delay_s=0.1).active


@pytest.mark.seed(7)
def test_submit_failure_rate_is_honoured_and_starts_nothing(seed: int) -> None:
    inner = ManualStore(auto_complete_on_wait=True)
    store = FaultyStore(inner, FaultConfig(submit_fail=0.3, seed=seed))
    accepted = refused = 0
    for i in range(N):
        try:
            store.dump([i.to_bytes(4, "big")], ReadyPayload(rows(1, nbytes=4)))
            accepted += 1
        except SubmitError:
            refused += 1
    assert _within_binomial(refused, N, 0.3), refused
    assert store.injected["submit"] == refused
    assert len(inner.outstanding_tasks()) == accepted == inner.stats().dumps_submitted


@pytest.mark.seed(11)
def test_check_failure_rate_is_honoured_and_keeps_the_task(seed: int) -> None:
    inner = ManualStore()
    store = FaultyStore(inner, FaultConfig(check_fail=0.2, seed=seed))
    task = store.dump([b"a"], ReadyPayload(rows(1)))
    failures = 0
    for _ in range(N):
        try:
            assert store.check(task) is False
        except StoreError:
            failures += 1
    assert _within_binomial(failures, N, 0.2), failures
    assert inner.outstanding_tasks() == [task]
    inner.complete(task)
    store.wait(task)
    with pytest.raises(TaskNotFound):
        store.check(task)  # an unknown task is never disguised as an injected fault


@pytest.mark.seed(5)
def test_wait_failure_rate_is_honoured_and_drains_every_task(seed: int) -> None:
    inner = ManualStore(auto_complete_on_wait=True)
    store = FaultyStore(inner, FaultConfig(wait_fail=0.25, seed=seed))
    failures = 0
    for i in range(N):
        task = store.dump([i.to_bytes(4, "big")], ReadyPayload(rows(1, nbytes=4)))
        try:
            store.wait(task)
        except StoreError:
            failures += 1
        with pytest.raises(TaskNotFound):
            store.wait(task)
    assert _within_binomial(failures, N, 0.25), failures
    assert inner.outstanding_tasks() == [] and store.stats().pending == 0
    assert len(inner.waited) == N


@pytest.mark.seed(1)
def test_same_seed_same_faults_other_seed_other_faults(seed: int) -> None:
    def outcomes(seed: int) -> list[bool]:
        store = FaultyStore(ManualStore(), FaultConfig(submit_fail=0.5, seed=seed))
        result = []
        for i in range(64):
            try:
                store.dump([bytes([i + 1])], ReadyPayload(rows(1)))
                result.append(True)
            except SubmitError:
                result.append(False)
        return result

    assert outcomes(seed) == outcomes(seed)
    assert outcomes(seed) != outcomes(seed + 1)  # 64 fair coin flips agree with odds 2**-64


def test_injected_wait_failure_reports_only_after_the_inner_transfer_stopped() -> None:
    with MemoryStore(capacity_blocks=8) as inner:
        store = FaultyStore(inner, FaultConfig(wait_fail=1.0))
        payload = GatedPayload(rows(1))
        task = store.dump([b"a"], payload)
        outcome: dict = {}

        def waiter() -> None:
            try:
                store.wait(task)
            except StoreError as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        thread.join(0.15)
        assert thread.is_alive(), "the injected wait failure must drain the running transfer first"
        payload.open()
        thread.join(10)
        assert "injected wait failure" in str(outcome["error"])
        assert inner.stats().pending == 0 and inner.stats().dumps_completed == 1


def test_slow_tasks_look_unfinished_until_their_delay_passed() -> None:
    with MemoryStore(capacity_blocks=64) as inner:
        store = FaultyStore(inner, FaultConfig(delay_s=1.0, seed=3))
        tasks = [store.dump([bytes([i + 1])], ReadyPayload(rows(1))) for i in range(20)]
        for task in tasks:
            settle(inner, task)  # the inner transfers are done…
        assert not all(store.check(task) for task in tasks), "…but slow tasks must still look unfinished"
        started = time.monotonic()
        for task in tasks:
            store.wait(task)
        assert time.monotonic() - started <= 3.0, "a slow task's wait sleeps at most its delay"
        assert store.injected["delay"] == 20 and inner.stats().pending == 0


def test_refused_submit_leaks_nothing_in_the_inner_store() -> None:
    with MemoryStore(capacity_blocks=8) as inner:
        store = FaultyStore(inner, FaultConfig(submit_fail=1.0))
        with pytest.raises(SubmitError):
            store.dump([b"a"], ReadyPayload(rows(1)))
        with pytest.raises(SubmitError):
            store.load([b"a"])
        stats = inner.stats()
        assert (stats.pending, stats.dumps_submitted, stats.blocks, inner.resident_bytes()) == (0, 0, 0, 0)


def test_injected_wait_failure_never_hides_an_undrained_inner_task() -> None:
    inner = ManualStore()  # refuses to block: its wait on a running task erases nothing
    store = FaultyStore(inner, FaultConfig(wait_fail=1.0))
    task = store.dump([b"a"], ReadyPayload(rows(1)))
    with pytest.raises(StoreError, match="would block"):
        store.wait(task)
    assert inner.outstanding_tasks() == [task] and store.injected["wait"] == 0
    inner.complete(task)
    with pytest.raises(StoreError, match="injected wait failure"):
        store.wait(task)
    assert inner.outstanding_tasks() == []
