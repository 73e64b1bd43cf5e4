"""deferdump.reference: the reference KV connector (protocol core, devices, stores, vLLM adapter).

The protocol core imports neither vLLM nor CUDA. Stores are imported lazily (attribute access), so the
package imports even in a checkout where a store module is missing; the vLLM adapter lives in
`deferdump.reference.vllm` and is never imported from here.
"""
from __future__ import annotations

import importlib
from typing import Any

from deferdump.reference.config import ConnectorConfig, make_store
from deferdump.reference.connectors import CPConnector, DirectConnector, LayerWiseConnector, OuterConnector, RequestPlan, Role
from deferdump.reference.devices import CpuDevice, CudaDevice, Device
from deferdump.reference.errors import ConfigError, DeferDumpError, DeviceError, EventHandleError, LayoutError, RoleError, UserError
from deferdump.reference.events import EventRegistry
from deferdump.reference.kv_layout import KVCacheLayout, LayerLayout, describe_kv_caches, find_block_dim
from deferdump.reference.metadata import DeferDumpMetadata, RequestDispatchMeta
from deferdump.reference.metrics import ConnectorMetrics
from deferdump.reference.pending import PendingDumpTask
from deferdump.reference.stores.base import (
    BlockPayload,
    KVStore,
    LoadError,
    ReadyPayload,
    StoreError,
    StoreFull,
    StoreStats,
    StoreTask,
    SubmitError,
    TaskNotFound,
)
from deferdump.reference.views import CachedRequestView, NewRequestView, RequestView, StepView

_LAZY = {  # attribute -> module under deferdump.reference
    "MemoryStore": "stores.memory",
    "FileStore": "stores.file",
    "StoreDirectoryError": "stores.file",
    "FaultyStore": "stores.faults",
    "FaultConfig": "stores.faults",
    "ManualStore": "testing.manual_store",
    "RedisStore": "stores.redis",
    "RedisUnavailable": "stores.redis",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
    globals()[name] = value
    return value


__all__ = [
    "BlockPayload", "CPConnector", "CachedRequestView", "ConfigError", "ConnectorConfig", "ConnectorMetrics",
    "CpuDevice", "CudaDevice", "DeferDumpError", "DeferDumpMetadata", "Device", "DeviceError", "DirectConnector",
    "EventHandleError", "EventRegistry", "FaultConfig", "FaultyStore", "FileStore", "KVCacheLayout", "KVStore",
    "LayerLayout", "LayerWiseConnector", "LayoutError", "LoadError", "ManualStore", "MemoryStore",
    "NewRequestView", "OuterConnector", "PendingDumpTask", "ReadyPayload", "RedisStore", "RedisUnavailable",
    "RequestDispatchMeta", "RequestPlan",
    "RequestView", "Role", "RoleError", "StepView", "StoreDirectoryError", "StoreError", "StoreFull", "StoreStats",
    "StoreTask",
    "SubmitError", "TaskNotFound", "UserError", "describe_kv_caches", "find_block_dim", "make_store",
]
