"""Block layouts and the CPU devices on real tensors (CUDA: tests/reference/test_reference_cuda.py)."""
from __future__ import annotations

import random
import re
import threading
import time

import pytest
import torch

from deferdump.reference import CpuDevice, DeviceError, LayoutError, describe_kv_caches, find_block_dim
from deferdump.reference.devices import checksum_rows
from deferdump.reference.testing.late_copy import LateCopyDevice, LatePayload
from deferdump.reference.kv_layout import guess_num_blocks


@pytest.mark.parametrize(
    ("shape", "num_blocks", "dim"),
    [
        ((2, 64, 16, 8, 128), 64, 1),  # CUDA [2, num_blocks, block_size, heads, head_dim]
        ((64, 8, 16, 256), 64, 0),  # CPU [num_blocks, kv_heads, block_size, 2*head_dim]
        ((64, 16, 576), 64, 0),  # MLA [num_blocks, block_size, head_size]
        ((2, 2, 16, 8, 128), 2, 1),  # ambiguous, CUDA layout decides
        ((16, 4, 16, 32), 16, 0),  # ambiguous block_size == num_blocks, CPU layout decides
        ((8, 2, 64, 4), 64, 2),  # unknown layout, unique match
    ],
)
def test_find_block_dim(shape: tuple[int, ...], num_blocks: int, dim: int) -> None:
    assert find_block_dim(shape, num_blocks) == dim


def test_find_block_dim_refuses_missing_or_ambiguous() -> None:
    with pytest.raises(LayoutError, match="no dimension"):
        find_block_dim((2, 64, 16), 10)
    with pytest.raises(LayoutError, match="ambiguous"):
        find_block_dim((3, 5, 5), 5)
    assert guess_num_blocks((2, 40, 16, 8, 64)) == 40 and guess_num_blocks((40, 8, 16, 64)) == 40


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8])
@pytest.mark.parametrize("shape", [(2, 10, 4, 3, 8), (10, 3, 4, 16)])
def test_gather_scatter_round_trip_bytes_for_both_layouts(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    source = (torch.randn(shape) * 50).to(dtype)
    layout = describe_kv_caches({"l": source}, num_blocks=10).layers[0]
    assert layout.block_nbytes == source.numel() * source.element_size() // 10
    index = torch.tensor([7, 2, 5])
    rows = layout.gather(source, index)
    assert rows.dtype == torch.uint8 and rows.shape == (3, layout.block_nbytes)
    target = torch.zeros_like(source)
    layout.scatter(target, index, rows)
    picked = (slice(None), index) if layout.block_dim == 1 else (index,)
    assert torch.equal(target[picked].view(torch.uint8), source[picked].view(torch.uint8))
    untouched = [b for b in range(10) if b not in (7, 2, 5)]
    rest = (slice(None), untouched) if layout.block_dim == 1 else (untouched,)
    assert torch.count_nonzero(target[rest].float()) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("shape", [(2, 10, 4, 3, 8), (10, 3, 4, 16)])
def test_gather_into_writes_the_same_bytes_into_a_column_slice_and_nothing_else(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    source = (torch.randn(shape) * 50).to(dtype)
    layout = describe_kv_caches({"l": source}, num_blocks=10).layers[0]
    index = torch.tensor([7, 2, 5])
    payload = torch.full((3, layout.block_nbytes + 9), 0xAB, dtype=torch.uint8)
    layout.gather_into(source, index, payload[:, 4 : 4 + layout.block_nbytes])
    assert torch.equal(payload[:, 4 : 4 + layout.block_nbytes], layout.gather(source, index))
    assert bool((payload[:, :4] == 0xAB).all()) and bool((payload[:, 4 + layout.block_nbytes :] == 0xAB).all())
    strided = source.transpose(-1, -2)  # not contiguous: falls back to gather + copy, same bytes
    layout_t = describe_kv_caches({"l": strided}, num_blocks=10).layers[0]
    out = torch.empty((3, layout_t.block_nbytes), dtype=torch.uint8)
    layout_t.gather_into(strided, index, out)
    assert torch.equal(out, layout_t.gather(strided, index))
    with pytest.raises(LayoutError):
        layout.gather_into(source, index, torch.empty((2, layout.block_nbytes), dtype=torch.uint8))


def test_layout_rejects_wrong_rows_and_empty_caches() -> None:
    layout = describe_kv_caches({"l": torch.zeros(4, 2, 4, 8)}).layers[0]
    with pytest.raises(LayoutError):
        layout.scatter(torch.zeros(4, 2, 4, 8), torch.tensor([0]), torch.zeros(1, 3, dtype=torch.uint8))
    with pytest.raises(LayoutError):
        describe_kv_caches({})


def caches() -> dict[str, torch.Tensor]:
    return {"a": torch.randn(8, 2, 4, 8), "b": torch.randn(8, 2, 4, 8).to(torch.bfloat16)}


def test_cpu_device_copies_on_its_pool_so_the_caller_never_blocks() -> None:
    kv = caches()
    device = CpuDevice(copy_threads=1)
    layout = device.register(kv)
    gate = threading.Event()
    blocker = device._pool.submit(gate.wait)
    payload = device.read_blocks([3, 1])  # returns although the only copy thread is busy
    assert not payload.done()
    gate.set()
    blocker.result()
    rows = payload.result()
    assert rows.shape == (2, layout.block_nbytes)
    a_bytes = layout.layers[0].block_nbytes
    assert torch.equal(rows[0, :a_bytes], kv["a"][3].contiguous().view(torch.uint8).flatten())
    assert torch.equal(rows[1, a_bytes:], kv["b"][1].contiguous().view(torch.uint8).flatten())
    device.close()


def test_cpu_device_writes_host_bytes_back_and_reads_single_layers() -> None:
    source, device = caches(), CpuDevice()
    device.register(source)
    rows = device.read_blocks([0, 5, 6]).result()
    target = {name: torch.zeros_like(t) for name, t in source.items()}
    other = CpuDevice()
    other.register(target)
    other.write_blocks([1, 2, 3], rows)
    for name in source:
        assert torch.equal(target[name][[1, 2, 3]].view(torch.uint8), source[name][[0, 5, 6]].view(torch.uint8))
    layer_rows = device.read_blocks([4], layer_names=["b"]).result()
    assert torch.equal(layer_rows[0], source["b"][4].contiguous().view(torch.uint8).flatten())
    assert checksum_rows(rows) == device.checksum_blocks([0, 5, 6])
    with pytest.raises(DeviceError):
        other.write_blocks([1], rows)
    with pytest.raises(DeviceError, match="outside"):
        device.read_blocks([8])
    for d in (device, other):
        d.close()


def test_settle_cancels_a_copy_that_has_not_started() -> None:
    device = CpuDevice(copy_threads=1)
    device.register(caches())
    gate = threading.Event()
    device._pool.submit(gate.wait)
    payload = device.read_blocks([1])
    device.settle(payload)
    assert payload.done()
    gate.set()
    device.close()
    with pytest.raises(DeviceError, match="closed"):
        device.read_blocks([1])


def test_cpu_device_refuses_tensors_elsewhere_and_copies_before_registration() -> None:
    device = CpuDevice()
    with pytest.raises(DeviceError, match="register_kv_caches"):
        device.read_blocks([0])
    with pytest.raises(ValueError):
        CpuDevice(copy_threads=0)
    device.close()


def test_late_copy_device_reads_at_result_time_or_never_when_settled() -> None:
    kv = {"a": torch.zeros(4, 1, 2, 2)}
    device = LateCopyDevice()
    device.register(kv)
    late = device.read_blocks([1])
    kv["a"][1].fill_(3.0)
    assert isinstance(late, LatePayload) and not late.done()
    assert torch.equal(late.result().view(torch.float32), torch.full((1, 4), 3.0))
    never = device.read_blocks([2])
    device.settle(never)
    assert never.done() and not never.read
    with pytest.raises(DeviceError, match="cancelled"):
        never.result()
    device.close()


def test_late_copy_device_with_a_lag_reads_on_its_own_after_the_seeded_lag() -> None:
    """With `lag_s` a copy thread reads after a seeded lag, consumed or not (a threaded store waits for
    `done()` first): a write landing inside the lag window is what the copy holds."""
    kv = {"a": torch.zeros(4, 1, 2, 2)}
    device = LateCopyDevice(lag_s=0.2, seed=3)
    device.register(kv)
    lag = random.Random(3).uniform(0.0, 0.2)  # the device draws its lags from Random(seed): 0.0476 s
    started = time.monotonic()
    late = device.read_blocks([1])
    kv["a"][1].fill_(5.0)
    assert not late.done()
    deadline = started + 5.0
    while not late.done() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert late.done() and late.read and time.monotonic() - started >= lag - 0.001
    kv["a"][1].fill_(7.0)  # after the read: not in the copy
    assert torch.equal(late.result().view(torch.float32), torch.full((1, 4), 5.0))
    with pytest.raises(ValueError):
        LateCopyDevice(lag_s=-1.0)
    device.close()


def test_late_copy_device_read_fault_hook_fails_the_next_reads_only() -> None:
    device = LateCopyDevice()
    device.register({"a": torch.ones(4, 1, 2, 2)})
    device.read_fail_next = 2
    for _ in range(2):
        with pytest.raises(DeviceError, match="injected device read failure of 1 block"):
            device.read_blocks([1])
    assert device.read_fail_next == 0
    assert torch.equal(device.read_blocks([1]).result().view(torch.float32), torch.ones(1, 4))
    device.close()


def test_cpu_device_dumps_submitted_inside_inference_mode() -> None:
    """vLLM runs wait_for_save (hence read_blocks) inside torch.inference_mode(); the copy thread, outside
    it, must still be able to fill the payload — an inference-tensor payload made that fail in vLLM."""
    with torch.inference_mode():
        caches = {"l0": torch.randn(8, 2, 4, 16, dtype=torch.bfloat16)}
    device = CpuDevice(copy_threads=1)
    try:
        device.register(caches, num_blocks=8)
        with torch.inference_mode():
            payload = device.read_blocks([1, 6])
        rows = payload.result()
        assert torch.equal(rows, caches["l0"][[1, 6]].reshape(2, -1).view(torch.uint8))
    finally:
        device.close()


def test_block_ids_outside_the_caches_are_refused_naming_them() -> None:
    dev = CpuDevice(1)
    dev.register({"l0": torch.zeros(2, 4, 2, 3)}, 4)
    try:
        for ids, named in (([1, 4, 0, 7], "[4, 7]"), ([-1], "[-1]")):
            with pytest.raises(DeviceError, match=re.escape(f"block ids {named} outside [0, 4)")):
                dev.read_blocks(ids)
        both = dev.read_blocks([3, 0]).result()
        assert torch.equal(both, torch.cat([dev.read_blocks([3]).result(), dev.read_blocks([0]).result()]))
    finally:
        dev.close()
