"""`LateCopyDevice` in hold mode: a dump copy reads its blocks only when the connector next blocks on dump
tasks (`Device.before_dump_wait`), or when its safety timeout expires (counted); selected by the TEST-ONLY
config key `test_late_copy`, and driven here through the real connector and a real threaded store."""
from __future__ import annotations

import time

import pytest
import torch

from deferdump.reference import ConfigError, ConnectorConfig, CpuDevice, DeviceError, DirectConnector
from deferdump.reference.connectors import LayerWiseConnector
from deferdump.reference.devices import Device
from deferdump.reference.stores.memory import MemoryStore
from deferdump.reference.testing.late_copy import LateCopyDevice, LatePayload
from support.reference import BLOCK_SIZE, cpu_kv_caches, dump_meta, run_save_step, worker


def _until(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.002)
    return predicate()


def _held_device(timeout_s: float = 60.0) -> tuple[LateCopyDevice, dict[str, torch.Tensor]]:
    kv = {"a": torch.zeros(4, 1, 2, 2)}
    device = LateCopyDevice(hold=True, hold_timeout_s=timeout_s)
    device.register(kv)
    return device, kv


def test_a_held_copy_reads_at_the_first_dump_wait_after_its_submit() -> None:
    device, kv = _held_device()
    first = device.read_blocks([1])
    kv["a"][1].fill_(3.0)  # after submit, before the connector waits: the copy sees it
    time.sleep(0.05)
    assert isinstance(first, LatePayload) and not first.done() and not first.read
    device.before_dump_wait()
    assert first.done() and first.read
    kv["a"][1].fill_(4.0)  # after the read: not in the copy
    assert torch.equal(first.result().view(torch.float32), torch.full((1, 4), 3.0))
    second = device.read_blocks([1])  # submitted after that wait: held until the next one
    assert not second.done()
    device.before_dump_wait()
    assert torch.equal(second.result().view(torch.float32), torch.full((1, 4), 4.0))
    assert (device.mode, device.held, device.timeouts) == ("hold", 2, 0)
    device.close()


def test_a_copy_held_past_its_timeout_is_read_by_the_watchdog_and_counted() -> None:
    device, kv = _held_device(timeout_s=0.05)
    late = device.read_blocks([2])
    kv["a"][2].fill_(5.0)
    assert _until(late.done), "the timeout did not release the copy"
    assert late.read and device.timeouts == 1 and device.held == 1
    assert torch.equal(late.result().view(torch.float32), torch.full((1, 4), 5.0))
    device.before_dump_wait()  # nothing left to release
    assert device.timeouts == 1
    device.close()


def test_a_settled_held_copy_never_reads_and_is_no_timeout() -> None:
    device, kv = _held_device(timeout_s=0.05)
    cancelled = device.read_blocks([1])
    kept = device.read_blocks([2])
    device.settle(cancelled)
    assert cancelled.done() and not cancelled.read
    device.before_dump_wait()
    assert not cancelled.read and kept.read
    with pytest.raises(DeviceError, match="cancelled"):
        cancelled.result()
    time.sleep(0.15)  # past the deadline the settled copy would have had
    assert (device.held, device.timeouts) == (2, 0)
    device.close()


def test_close_cancels_copies_still_held_and_refuses_new_ones() -> None:
    device, _ = _held_device()
    held = device.read_blocks([3])
    device.close()
    assert held.done() and not held.read
    with pytest.raises(DeviceError, match="closed"):
        device.read_blocks([3])


def test_hold_is_a_mode_of_its_own_and_the_real_devices_ignore_the_hook() -> None:
    with pytest.raises(ValueError, match="two different modes"):
        LateCopyDevice(0.1, hold=True)
    with pytest.raises(ValueError, match="hold_timeout_s"):
        LateCopyDevice(hold=True, hold_timeout_s=0)
    assert (LateCopyDevice().mode, LateCopyDevice(0.0).mode) == ("on_result", "lag")
    cpu = CpuDevice(copy_threads=1)
    cpu.register({"a": torch.ones(4, 1, 2, 2)})
    held, _ = _held_device()
    assert isinstance(cpu, Device) and isinstance(held, Device)
    payload = cpu.read_blocks([1])
    cpu.before_dump_wait()  # a no-op: real copies run on their own
    assert torch.equal(payload.result().view(torch.float32), torch.ones(1, 4))
    cpu.close()
    held.close()


def _hold_connector(store: MemoryStore, caches: dict[str, torch.Tensor], cls: type = DirectConnector, **config: object):
    conn = worker(
        store, cls=cls, config=ConnectorConfig(
            block_size=BLOCK_SIZE, verify_dumps=True, test_late_copy="hold",
            variant="layerwise" if cls is LayerWiseConnector else "direct", **config,
        ),
        deferred=False, kv_caches=caches,
    )
    device = conn.device
    assert isinstance(device, LateCopyDevice) and device.mode == "hold"
    return conn, device


@pytest.mark.parametrize("cls", [DirectConnector, LayerWiseConnector])
def test_config_selects_the_held_device_and_get_finished_releases_it(cls: type) -> None:
    """Real threaded store: a task cannot finish while its copy is held; only the connector's blocking
    wait releases it, so a block rewritten in between is what the dump stores (verify_dumps counts it).
    Layer-wise: one task per layer, the same one blocking wait."""
    store = MemoryStore(64)
    caches = cpu_kv_caches()
    conn, device = _hold_connector(store, caches, cls)
    run_save_step(conn, dump_meta(("a", [1, 2])), layers=tuple(caches))
    pendings = list(conn._pending_dump_tasks)
    assert len(pendings) == (len(caches) if cls is LayerWiseConnector else 1)
    time.sleep(0.05)
    run_save_step(conn, dump_meta())  # wait_for_save only polls: it never releases a held copy
    assert conn._pending_dump_tasks == pendings
    assert not any(p.payload.read or store.check(p.task) for p in pendings)
    caches["layer.0"][2].fill_(7.0)  # the hazard: rewritten before the dump read it
    assert conn.get_finished({"a"}) == ({"a"}, None)
    assert conn.verify_mismatches == 1
    assert (device.held, device.timeouts) == (len(pendings), 0)
    conn.shutdown()
    store.close()


def test_handle_preemptions_and_shutdown_release_held_copies_only_when_they_block() -> None:
    store = MemoryStore(64)
    caches = cpu_kv_caches()
    conn, device = _hold_connector(store, caches)
    run_save_step(conn, dump_meta(("a", [1])))
    run_save_step(conn, dump_meta(("b", [2])))
    first, second = conn._pending_dump_tasks
    conn.handle_preemptions(dump_meta(preempted=["other"]))  # no task of a preempted request: no wait
    assert not first.payload.read and not second.payload.read
    conn.handle_preemptions(dump_meta(preempted=["a"]))  # blocks on a's task: every held copy reads
    assert conn._pending_dump_tasks == [second] and first.payload.read and second.payload.read
    run_save_step(conn, dump_meta(("c", [3])))
    third = conn._pending_dump_tasks[-1]  # b's task may have finished and been reaped since its copy read
    assert third.request_ids == {"c"} and not third.payload.read
    conn.shutdown()  # drains everything: the last copy reads before the wait
    assert third.payload.read and conn._pending_dump_tasks == []
    assert (device.held, device.timeouts, conn.verify_mismatches) == (3, 0, 0)
    assert store.lookup_prefix([b"a:1", b"b:2", b"c:3"]) == 3
    store.close()


def test_a_connector_that_never_waits_is_caught_by_the_counted_timeout() -> None:
    store = MemoryStore(64)
    conn, device = _hold_connector(store, cpu_kv_caches(), test_late_copy_timeout_s=0.05)
    run_save_step(conn, dump_meta(("a", [1])))
    [pending] = conn._pending_dump_tasks
    assert _until(lambda: store.check(pending.task)), "the timed-out copy did not let the task finish"
    assert (device.held, device.timeouts) == (1, 1)
    conn.shutdown()
    store.close()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"test_late_copy": "always"}, "test_late_copy: unknown value 'always' (expected one of off, hold)"),
        ({"test_late_copy": True}, "test_late_copy: unknown value True"),
        ({"test_late_copy_timeout_s": 5.0}, "test_late_copy_timeout_s: is set but test_late_copy is 'off'"),
        ({"test_late_copy": "hold", "test_late_copy_timeout_s": 0}, "test_late_copy_timeout_s: must be a positive"),
        ({"test_late_copy": "hold", "test_late_copy_timeout_s": "1"}, "test_late_copy_timeout_s: must be a positive"),
        ({"test_late_copy": "hold", "test_late_copy_timeout_s": float("inf")}, "test_late_copy_timeout_s: must be"),
    ],
)
def test_bad_test_late_copy_config_is_one_config_error_line(extra: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ConnectorConfig.from_extra_config(extra)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_default_config_keeps_the_real_device() -> None:
    store = MemoryStore(64)
    conn = worker(store, config=ConnectorConfig(block_size=BLOCK_SIZE), deferred=False)
    assert type(conn.device) is CpuDevice
    assert ConnectorConfig.from_extra_config({"test_late_copy": "hold"}).test_late_copy_timeout_s is None
    conn.shutdown()
    store.close()
