"""deferdump.reference: the reference KV connector (protocol core, devices, stores, vLLM adapter).

The protocol core imports neither vLLM nor CUDA. Every name here is imported on first access (PEP 562), so
importing one submodule (the CLI's `deferdump.reference.errors`) does not load the connector, its stores
and torch (about 1.1 s of CPU per process), and the package imports even in a checkout where a store module
is missing. The vLLM adapter lives in `deferdump.reference.vllm` and is never imported from here.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {  # module under deferdump.reference -> the names it provides here
    "config": ("ConnectorConfig", "make_store"),
    "connectors": ("CPConnector", "DirectConnector", "LayerWiseConnector", "OuterConnector", "RequestPlan", "Role"),
    "devices": ("CpuDevice", "CudaDevice", "Device"),
    "errors": ("ConfigError", "DeferDumpError", "DeviceError", "EventHandleError", "LayoutError", "RoleError",
               "UserError"),
    "events": ("EventRegistry",),
    "kv_layout": ("KVCacheLayout", "LayerLayout", "describe_kv_caches", "find_block_dim"),
    "metadata": ("DeferDumpMetadata", "RequestDispatchMeta"),
    "metrics": ("ConnectorMetrics",),
    "pending": ("PendingDumpTask",),
    "stores.base": ("BlockPayload", "KVStore", "LoadError", "ReadyPayload", "StoreError", "StoreFull", "StoreStats",
                    "StoreTask", "SubmitError", "TaskNotFound"),
    "views": ("CachedRequestView", "NewRequestView", "RequestView", "StepView"),
    "stores.memory": ("MemoryStore",),
    "stores.file": ("FileStore", "StoreDirectoryError"),
    "stores.faults": ("FaultyStore", "FaultConfig"),
    "testing.manual_store": ("ManualStore",),
    "stores.redis": ("RedisStore", "RedisUnavailable"),
}
_LAZY = {name: module for module, names in _EXPORTS.items() for name in names}  # attribute -> module

if TYPE_CHECKING:  # what type checkers and editors see: the same names, imported eagerly
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
        BlockPayload, KVStore, LoadError, ReadyPayload, StoreError, StoreFull, StoreStats, StoreTask, SubmitError,
        TaskNotFound,
    )
    from deferdump.reference.views import CachedRequestView, NewRequestView, RequestView, StepView
    from deferdump.reference.stores.memory import MemoryStore
    from deferdump.reference.stores.file import FileStore, StoreDirectoryError
    from deferdump.reference.stores.faults import FaultyStore, FaultConfig
    from deferdump.reference.testing.manual_store import ManualStore
    from deferdump.reference.stores.redis import RedisStore, RedisUnavailable


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(_LAZY)
