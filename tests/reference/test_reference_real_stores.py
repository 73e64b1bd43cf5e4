"""The connector on the real stores (MemoryStore, FileStore) and real CPU tensors, built from config."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from prometheus_client import generate_latest

from deferdump.reference import ConnectorConfig, OuterConnector, Role
from deferdump.reference.stores.file import FileStore
from deferdump.reference.stores.memory import MemoryStore
from support.reference import BLOCK_SIZE, cpu_kv_caches, deployment, run_request


@pytest.mark.parametrize("store", ["memory", "file"])
@pytest.mark.parametrize("variant", ["direct", "layerwise"])
def test_dump_then_load_round_trips_through_the_real_store(store: str, variant: str, tmp_path: Path) -> None:
    config = ConnectorConfig.from_extra_config(
        {"variant": variant, "store": store, "store_path": str(tmp_path / "kv"), "capacity_blocks": 64,
         "block_size": BLOCK_SIZE, "verify_dumps": True}
    )
    source = cpu_kv_caches(seed=7)
    scheduler, worker = deployment(config, source)
    assert isinstance(worker.store, MemoryStore if store == "memory" else FileStore)
    assert run_request(scheduler, worker, "a", 12, [2, 4, 6]) == 0
    assert worker.inner.verify_mismatches == 0 and worker.events.live() == 0

    target = {name: torch.zeros_like(t) for name, t in source.items()}
    loader = OuterConnector(config, Role.WORKER, store=worker.store)  # a second worker on the same store
    loader.register_kv_caches(target)
    assert run_request(scheduler, loader, "b", 13, [0, 1, 3, 5]) == 12
    assert loader.get_block_ids_with_load_errors() == set()
    for name in source:
        assert torch.equal(target[name][[0, 1, 3]], source[name][[2, 4, 6]])
        assert torch.count_nonzero(target[name][5]) == 0
    loader.shutdown()
    worker.shutdown()  # closes the store it made


def test_a_full_store_is_a_counted_refusal_with_nothing_leaked() -> None:
    store = MemoryStore(2)
    config = ConnectorConfig(block_size=BLOCK_SIZE)
    worker = OuterConnector(config, Role.WORKER, store=store)
    worker.register_kv_caches(cpu_kv_caches())
    scheduler = OuterConnector(config, Role.SCHEDULER, store=store)
    run_request(scheduler, worker, "big", 12, [1, 2, 3])  # 3 blocks > capacity 2
    assert store.stats().refused_full == 1 and store.stats().pending == 0
    assert worker.inner.submit_failures == 1 and worker.events.live() == 0 and worker._pending_dump_tasks == []
    assert worker.metrics.value("deferdump_dumps_failed_total", {"stage": "submit"}) == 1
    worker.shutdown()
    store.close()


def test_a_corrupt_block_file_is_a_load_error_never_loaded(tmp_path: Path) -> None:
    config = ConnectorConfig(store="file", store_path=str(tmp_path), block_size=BLOCK_SIZE)
    scheduler, worker = deployment(config, cpu_kv_caches())
    run_request(scheduler, worker, "a", 8, [1, 2])
    worker.shutdown()
    files = sorted(tmp_path.rglob("*.blk"))
    assert len(files) == 2
    for path in files:
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
    target = {name: torch.zeros_like(t) for name, t in cpu_kv_caches().items()}
    scheduler2, loader = deployment(config, target)
    assert run_request(scheduler2, loader, "b", 9, [5, 6, 7]) == 8
    assert loader.get_block_ids_with_load_errors() == {5, 6}
    assert all(torch.count_nonzero(t) == 0 for t in target.values())
    assert loader.metrics.value("deferdump_load_error_blocks_total") == 2
    loader.shutdown()


def test_metrics_are_exported_per_instance_in_prometheus_text() -> None:
    scheduler, worker = deployment(ConnectorConfig(block_size=BLOCK_SIZE), cpu_kv_caches())
    run_request(scheduler, worker, "a", 8, [1, 2])
    text = generate_latest(worker.metrics.registry).decode()
    for line in (
        "deferdump_dumps_submitted_total 1.0",
        "deferdump_dumps_completed_total 1.0",
        "deferdump_finished_sending_total 1.0",
        "deferdump_pending_dump_tasks 0.0",
        "deferdump_live_event_handles 0.0",
        "deferdump_get_finished_wait_seconds_count 1.0",
        "deferdump_handle_preemptions_wait_seconds_count 0.0",
    ):
        assert line in text
    assert f"deferdump_dump_bytes_total {2 * worker.inner.device.layout.block_nbytes}.0" in text
    assert "deferdump_dumps_submitted_total 0.0" in generate_latest(scheduler.metrics.registry).decode()
    worker.shutdown()
