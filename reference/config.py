"""Connector configuration, read from vLLM's `kv_connector_extra_config`.

Every key is validated here, once, so a typo fails at startup with a `ValueError` naming the key
instead of silently running with a default.
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

from deferdump.reference.errors import ConfigError
from deferdump.reference.stores.base import KVStore

VARIANTS = ("direct", "layerwise", "cp")
STORES = ("memory", "file", "redis")
# Hybrid models: what handle_preemptions waits besides the preempted requests' dumps. "freed": the dumps
# reading a block freed since the previous schedule (the fix); "all_on_free": every dump whenever any
# block was freed (UCM's later, coarser fence); "none": #989 as merged, UNSAFE for sliding-window models.
HYBRID_FENCES = ("freed", "all_on_free", "none")
FAULT_KEYS = ("submit_fail", "check_fail", "wait_fail", "delay_s", "seed")
# TEST-ONLY: "hold" swaps the worker's device for the adversarial `LateCopyDevice` in hold mode (every dump
# copy reads its blocks only when the connector next blocks on dump tasks); "off" is the real device.
TEST_LATE_COPY_MODES = ("off", "hold")
DEFAULT_MEMORY_CAPACITY_BLOCKS = 4096


@dataclasses.dataclass(frozen=True)
class ConnectorConfig:
    """What the connector needs to know beyond vLLM's own config (see `from_extra_config`)."""

    variant: str = "direct"  # "direct" | "layerwise" | "cp"
    store: str = "memory"  # "memory" | "file" | "redis"
    store_path: str | None = None  # directory of the file store
    redis_url: str | None = None  # store "redis": redis://host:port/db, or redis+cluster://host:port
    redis_namespace: str = "deferdump"  # key prefix: instances sharing blocks use the same one
    redis_ttl_s: float | None = None  # expire blocks after this many seconds (None: only maxmemory evicts)
    capacity_blocks: int | None = None  # None: memory default, file unbounded
    block_size: int | None = None  # tokens per block; None: the adapter takes vLLM's
    enable_event_sync: bool = True  # False: synchronize the compute stream instead of passing an event
    copy_threads: int = 2  # CpuDevice copy pool size
    verify_dumps: bool = False  # checksum source blocks at submit, compare with the stored bytes
    faults: Mapping[str, Any] | None = None  # FaultConfig fields: wrap the store in a FaultyStore
    cp_world_size: int = 1  # context-parallel ranks (variant "cp")
    is_mla: bool = False  # MLA: every rank holds the same KV, only rank 0 dumps
    use_layerwise: bool = False  # variant "cp": dispatch to the layer-wise paths
    wait_timeout_s: float | None = None  # timeout passed to every store wait
    hybrid_fence: str = "freed"  # "freed" | "all_on_free" | "none" (unsafe for hybrid models), see HYBRID_FENCES
    test_late_copy: str = "off"  # TEST-ONLY adversarial device when the connector picks its own (as in vLLM)
    test_late_copy_timeout_s: float | None = None  # "hold": release a copy held this long (default 60 s)
    # Asynchronous loads (docs/async-loads.md): the lookup answers load_async=True, vLLM parks the request in
    # WAITING_FOR_REMOTE_KVS, the worker runs the load on the store threads and reports it in finished_recving.
    load_async: bool = False
    # TEST-ONLY broken mode reproducing real bug P8 (vllm-ascend#16662): a request finished (aborted) while its
    # asynchronous load runs is dropped from the receive set, so its finished_recving never comes.
    test_drop_aborted_recving: bool = False

    def __post_init__(self) -> None:
        _check_choice("variant", self.variant, VARIANTS)
        _check_choice("store", self.store, STORES)
        _check_choice("hybrid_fence", self.hybrid_fence, HYBRID_FENCES)
        if self.store_path is not None and not isinstance(self.store_path, str):
            raise ConfigError("store_path", f"must be a string path, got {self.store_path!r}")
        if self.store == "file" and not self.store_path:
            raise ConfigError("store_path", "is required when store is 'file'")
        _check_int("capacity_blocks", self.capacity_blocks, minimum=1, optional=True)
        self._check_redis()
        _check_int("block_size", self.block_size, minimum=1, optional=True)
        _check_bool("enable_event_sync", self.enable_event_sync)
        _check_int("copy_threads", self.copy_threads, minimum=1)
        _check_bool("verify_dumps", self.verify_dumps)
        _check_int("cp_world_size", self.cp_world_size, minimum=1)
        _check_bool("is_mla", self.is_mla)
        _check_bool("use_layerwise", self.use_layerwise)
        if self.cp_world_size > 1 and self.variant != "cp":
            raise ConfigError("cp_world_size", f"is {self.cp_world_size} but variant is {self.variant!r}, not 'cp'")
        if self.use_layerwise and self.variant != "cp":
            raise ConfigError("use_layerwise", "applies to variant 'cp' only (use variant 'layerwise')")
        if self.wait_timeout_s is not None and (
            isinstance(self.wait_timeout_s, bool)
            or not isinstance(self.wait_timeout_s, (int, float))
            or self.wait_timeout_s <= 0
        ):
            raise ConfigError("wait_timeout_s", f"must be a positive number, got {self.wait_timeout_s!r}")
        if self.faults is not None:
            _check_faults(self.faults)
        self._check_test_late_copy()
        self._check_load_async()

    def _check_load_async(self) -> None:
        _check_bool("load_async", self.load_async)
        _check_bool("test_drop_aborted_recving", self.test_drop_aborted_recving)
        if self.load_async and self.variant != "direct":
            raise ConfigError("load_async", f"needs variant 'direct' (per-layer loads are waited in the forward), "
                              f"got {self.variant!r}")
        if self.test_drop_aborted_recving and not self.load_async:
            raise ConfigError("test_drop_aborted_recving", "applies only with load_async: true")

    def _check_test_late_copy(self) -> None:
        _check_choice("test_late_copy", self.test_late_copy, TEST_LATE_COPY_MODES)
        timeout = self.test_late_copy_timeout_s
        if timeout is None:
            return
        if self.test_late_copy != "hold":
            raise ConfigError("test_late_copy_timeout_s", f"is set but test_late_copy is {self.test_late_copy!r}, not 'hold'")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ConfigError("test_late_copy_timeout_s", f"must be a positive number of seconds, got {timeout!r}")

    def _check_redis(self) -> None:
        redis_store = importlib.import_module(f"{__package__}.stores.redis")
        if self.store != "redis":
            for key in ("redis_url", "redis_ttl_s"):
                if getattr(self, key) is not None:
                    raise ConfigError(key, f"is set but store is {self.store!r} (set \"store\": \"redis\")")
            if self.redis_namespace != "deferdump":
                raise ConfigError("redis_namespace", f"is set but store is {self.store!r} (set \"store\": \"redis\")")
            return
        if self.redis_url is None:
            raise ConfigError("redis_url", "is required when store is 'redis' (e.g. redis://127.0.0.1:6379/0)")
        try:
            redis_store.check_redis_url(self.redis_url)
        except ValueError as exc:
            raise ConfigError("redis_url", str(exc)) from None
        if not isinstance(self.redis_namespace, str) or not self.redis_namespace or any(c.isspace() for c in self.redis_namespace):
            raise ConfigError("redis_namespace", f"must be a non-empty string without spaces, got {self.redis_namespace!r}")
        if self.redis_ttl_s is not None and (
            isinstance(self.redis_ttl_s, bool) or not isinstance(self.redis_ttl_s, (int, float))
            or not self.redis_ttl_s >= 0.001 or self.redis_ttl_s == float("inf")
        ):
            raise ConfigError("redis_ttl_s", f"must be a positive number of seconds (>= 0.001), got {self.redis_ttl_s!r}")
        if self.capacity_blocks is not None:
            raise ConfigError("capacity_blocks", "does not apply to store 'redis' (set the server's maxmemory instead)")
        if self.store_path is not None:
            raise ConfigError("store_path", "does not apply to store 'redis' (use redis_url)")

    @property
    def layerwise(self) -> bool:
        """Whether dumps and loads go per layer (variant "layerwise", or "cp" with `use_layerwise`)."""
        return self.variant == "layerwise" or (self.variant == "cp" and self.use_layerwise)

    @classmethod
    def from_extra_config(cls, mapping: Mapping[str, Any] | None) -> "ConnectorConfig":
        """Build from `kv_connector_extra_config`; an unknown key or bad value raises `ConfigError`."""
        if mapping is None:
            return cls()
        if not isinstance(mapping, Mapping):
            raise ConfigError("kv_connector_extra_config", f"must be a mapping, got {type(mapping).__name__}")
        known = {field.name for field in dataclasses.fields(cls)}
        for key in mapping:
            if key not in known:
                raise ConfigError(str(key), f"unknown config key (known: {', '.join(sorted(known))})")
        values = dict(mapping)
        if values.get("faults") is not None and isinstance(values["faults"], Mapping):
            values["faults"] = dict(values["faults"])
        return cls(**values)


def make_store(config: ConnectorConfig) -> KVStore:
    """The store the config names, wrapped in a `FaultyStore` when `faults` is set."""
    store: KVStore
    if config.store == "memory":
        memory_store = importlib.import_module(f"{__package__}.stores.memory")
        capacity = config.capacity_blocks or DEFAULT_MEMORY_CAPACITY_BLOCKS
        store = memory_store.MemoryStore(capacity)
    elif config.store == "redis":
        redis_store = importlib.import_module(f"{__package__}.stores.redis")
        store = redis_store.RedisStore(config.redis_url, config.redis_namespace, config.redis_ttl_s)
    else:
        file_store = importlib.import_module(f"{__package__}.stores.file")
        store = file_store.FileStore(config.store_path, capacity_blocks=config.capacity_blocks)
    if config.faults is not None:
        faults = importlib.import_module(f"{__package__}.stores.faults")
        store = faults.FaultyStore(store, faults.FaultConfig(**dict(config.faults)))
    return store


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(key, f"unknown value {value!r} (expected one of {', '.join(choices)})")


def _check_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {value!r}")


def _check_int(key: str, value: Any, *, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(key, f"must be >= {minimum}, got {value}")


def _check_faults(faults: Any) -> None:
    if not isinstance(faults, Mapping):
        raise ConfigError("faults", f"must be a mapping of {', '.join(FAULT_KEYS)}, got {faults!r}")
    for key, value in faults.items():
        name = f"faults.{key}"
        if key not in FAULT_KEYS:
            raise ConfigError(name, f"unknown fault key (known: {', '.join(FAULT_KEYS)})")
        if key == "seed":
            _check_int(name, value, minimum=0)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(name, f"must be a number, got {value!r}")
        if key != "delay_s" and not 0.0 <= value <= 1.0:
            raise ConfigError(name, f"is a probability and must lie in [0, 1], got {value}")
        if key == "delay_s" and value < 0:
            raise ConfigError(name, f"must be >= 0, got {value}")
