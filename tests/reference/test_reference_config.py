"""ConnectorConfig: every key validated, bad ones named; make_store builds the named store."""
from __future__ import annotations

import pytest

from deferdump.reference import ConfigError, ConnectorConfig, make_store
from deferdump.reference.stores.faults import FaultyStore
from deferdump.reference.stores.file import FileStore
from deferdump.reference.stores.memory import MemoryStore


def test_defaults_are_direct_memory_with_event_sync() -> None:
    config = ConnectorConfig.from_extra_config({})
    assert (config.variant, config.store) == ("direct", "memory")
    assert (config.enable_event_sync, config.verify_dumps) == (True, False)
    assert ConnectorConfig.from_extra_config(None) == config


def test_every_key_round_trips(tmp_path) -> None:
    extra = {
        "variant": "cp", "store": "file", "store_path": str(tmp_path), "capacity_blocks": 8, "block_size": 16,
        "enable_event_sync": False, "copy_threads": 3, "verify_dumps": True,
        "faults": {"submit_fail": 0.5, "seed": 3}, "cp_world_size": 2, "is_mla": True, "use_layerwise": True,
        "wait_timeout_s": 2.5, "test_late_copy": "hold", "test_late_copy_timeout_s": 1.5,
    }
    config = ConnectorConfig.from_extra_config(extra)
    assert {key: getattr(config, key) for key in extra} == extra
    assert config.layerwise


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"variant": "mooncake"}, "variant"),
        ({"store": "s3"}, "store"),
        ({"capacity_blocks": -1}, "capacity_blocks"),
        ({"capacity_blocks": 0}, "capacity_blocks"),
        ({"capacity_blocks": "10"}, "capacity_blocks"),
        ({"block_size": True}, "block_size"),
        ({"enable_event_sync": "yes"}, "enable_event_sync"),
        ({"copy_threads": 0}, "copy_threads"),
        ({"capacity": 10}, "capacity"),
        ({"store": "file"}, "store_path"),
        ({"cp_world_size": 2}, "cp_world_size"),
        ({"use_layerwise": True}, "use_layerwise"),
        ({"wait_timeout_s": 0}, "wait_timeout_s"),
        ({"faults": {"submit_fail": 1.5}}, "faults.submit_fail"),
        ({"faults": {"explode": 0.1}}, "faults.explode"),
        ({"faults": {"seed": -1}}, "faults.seed"),
        ({"faults": [0.1]}, "faults"),
        ({"test_late_copy": "lag"}, "test_late_copy"),
        ({"test_late_copy": "hold", "test_late_copy_timeout_s": -1}, "test_late_copy_timeout_s"),
    ],
)
def test_bad_key_or_value_is_a_value_error_naming_the_key(extra: dict, key: str) -> None:
    with pytest.raises(ValueError) as caught:
        ConnectorConfig.from_extra_config(extra)
    assert isinstance(caught.value, ConfigError)
    assert caught.value.key == key
    assert str(caught.value).startswith(f"{key}:")


def test_non_mapping_extra_config_is_refused() -> None:
    with pytest.raises(ConfigError, match="kv_connector_extra_config"):
        ConnectorConfig.from_extra_config(["variant"])  # type: ignore[arg-type]


def test_make_store_builds_memory_file_and_faulty_stores(tmp_path) -> None:
    memory = make_store(ConnectorConfig(capacity_blocks=4))
    assert isinstance(memory, MemoryStore)
    file_store = make_store(ConnectorConfig(store="file", store_path=str(tmp_path / "kv")))
    assert isinstance(file_store, FileStore)
    faulty = make_store(ConnectorConfig(faults={"submit_fail": 1.0, "seed": 1}))
    assert isinstance(faulty, FaultyStore)
    for store in (memory, file_store, faulty):
        store.close()
