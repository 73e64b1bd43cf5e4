"""CudaDevice and the connector on a real GPU; skipped (with that reason) where CUDA is absent."""
from __future__ import annotations

import pytest
import torch

from deferdump.reference import (
    ConnectorConfig,
    CudaDevice,
    DeferDumpMetadata,
    DirectConnector,
    ManualStore,
    RequestDispatchMeta,
    Role,
)
from deferdump.reference.devices import CudaPayload

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: torch.cuda.is_available() is False"),
]

NUM_BLOCKS = 32


def cuda_caches(dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """vLLM's CUDA layout [2, num_blocks, block_size, heads, head_dim]."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    return {
        f"layer.{i}": torch.randn(2, NUM_BLOCKS, 16, 4, 64, device="cuda", generator=generator).to(dtype)
        for i in range(3)
    }


def host_rows(caches: dict[str, torch.Tensor], block_ids: list[int]) -> torch.Tensor:
    """Expected bytes computed on the host, independently of the device's gather."""
    rows = []
    for block in block_ids:
        rows.append(torch.cat([t[:, block].cpu().contiguous().view(torch.uint8).flatten() for t in caches.values()]))
    return torch.stack(rows)


def test_read_blocks_gathers_into_pinned_host_memory_byte_for_byte() -> None:
    caches = cuda_caches()
    device = CudaDevice()
    layout = device.register(caches, NUM_BLOCKS)
    assert {layer.block_dim for layer in layout.layers} == {1}
    payload = device.read_blocks([5, 0, 31], after=device.record_event())
    assert isinstance(payload, CudaPayload)
    rows = payload.result()
    assert payload.done() and rows.is_pinned() and rows.device.type == "cpu"
    assert torch.equal(rows, host_rows(caches, [5, 0, 31]))
    device.close()


def test_copy_stream_waits_for_the_compute_event_before_reading() -> None:
    caches = cuda_caches(torch.float32)
    device = CudaDevice()
    device.register(caches, NUM_BLOCKS)
    torch.cuda._sleep(200_000_000)  # keep the compute stream busy ...
    caches["layer.0"][:, 7].fill_(42.0)  # ... so this write lands late
    payload = device.read_blocks([7], after=device.record_event())
    rows = payload.result()
    first_layer = rows[0, : caches["layer.0"][:, 7].numel() * 4].view(torch.float32)
    assert torch.all(first_layer == 42.0)
    device.close()


def test_write_blocks_copies_host_bytes_back_into_blocks() -> None:
    source, target = cuda_caches(), {k: torch.zeros_like(v) for k, v in cuda_caches().items()}
    reader, writer = CudaDevice(), CudaDevice()
    reader.register(source, NUM_BLOCKS)
    writer.register(target, NUM_BLOCKS)
    writer.write_blocks([1, 2], reader.read_blocks([9, 10]).result())
    for name in source:
        assert torch.equal(target[name][:, [1, 2]], source[name][:, [9, 10]])
    assert reader.checksum_blocks([9, 10]) == writer.checksum_blocks([1, 2])


def test_connector_dumps_and_loads_gpu_blocks_through_a_store() -> None:
    store = ManualStore(auto_complete_on_wait=True)
    config = ConnectorConfig(block_size=16, verify_dumps=True)
    source = cuda_caches()
    dumper = DirectConnector(config, Role.WORKER, store=store, device=CudaDevice())
    dumper.register_kv_caches(source, NUM_BLOCKS)
    hashes = (b"h0", b"h1")
    dumper.bind_connector_metadata(
        DeferDumpMetadata({"a": RequestDispatchMeta(dump_hashes=hashes, dump_block_ids=(3, 4))})
    )
    dumper.wait_for_save()
    dumper.clear_connector_metadata()
    assert dumper.events.live() == 1
    assert dumper.get_finished({"a"}) == ({"a"}, None)
    assert dumper.events.live() == 0 and dumper.verify_mismatches == 0

    target = {k: torch.zeros_like(v) for k, v in source.items()}
    loader = DirectConnector(config, Role.WORKER, store=store)  # picks CudaDevice from the tensors
    loader.register_kv_caches(target, NUM_BLOCKS)
    loader.bind_connector_metadata(
        DeferDumpMetadata({"b": RequestDispatchMeta(load_hashes=hashes, load_block_ids=(0, 1))})
    )
    loader.start_load_kv()
    loader.clear_connector_metadata()
    assert loader.get_block_ids_with_load_errors() == set()
    for name in source:
        assert torch.equal(target[name][:, [0, 1]], source[name][:, [3, 4]])
    dumper.shutdown()
    loader.shutdown()
