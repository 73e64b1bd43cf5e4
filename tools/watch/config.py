"""The watching wrapper's own configuration (`kv_connector_extra_config` of the wrapper).

`{"inner": {"kv_connector": NAME, "kv_connector_module_path": ..., "kv_connector_extra_config": {...}},
"log_dir": DIR, "scribble": bool}`: the inner connector is configured as vLLM would configure it alone;
`log_dir` (optional) is where the boundary log goes; `scribble` (default False) turns the adversary on.
Pure data: importable and testable without vLLM.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from deferdump.reference.errors import ConfigError

INNER_KEY, LOG_DIR_KEY, SCRIBBLE_KEY = "inner", "log_dir", "scribble"
_KEYS = (INNER_KEY, LOG_DIR_KEY, SCRIBBLE_KEY)
# Keys of a kv_transfer_config the inner connector may carry (vLLM's KVTransferConfig fields we pass on).
_INNER_KEYS = ("kv_connector", "kv_connector_module_path", "kv_connector_extra_config", "kv_role",
               "engine_id", "kv_buffer_device", "kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip",
               "kv_port", "kv_load_failure_policy", "enable_permute_local_kv")

WRAPPER_MODULE = "deferdump.tools.watch.wrapper"
WRAPPER_CLASS, WRAPPER_CLASS_HMA = "WatchConnector", "WatchConnectorHMA"


@dataclass(frozen=True)
class WatchConfig:
    """What the wrapper was told: the inner connector's kv_transfer_config, the log directory, the scribble."""

    inner: dict[str, Any]
    log_dir: str | None = None
    scribble: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> "WatchConfig":
        """Parse and check; a bad key or value raises `ConfigError` naming it."""
        if not isinstance(extra, Mapping):
            raise ConfigError("kv_connector_extra_config", f"must be a mapping, got {type(extra).__name__}")
        unknown = sorted(set(extra) - set(_KEYS))
        if unknown:
            raise ConfigError(unknown[0], f"is not a watch wrapper key (known: {', '.join(_KEYS)})")
        inner = extra.get(INNER_KEY)
        if not isinstance(inner, Mapping) or not isinstance(inner.get("kv_connector"), str) or not inner["kv_connector"]:
            raise ConfigError(INNER_KEY, "must be a kv_transfer_config mapping with a non-empty `kv_connector`")
        bad = sorted(set(inner) - set(_INNER_KEYS))
        if bad:
            raise ConfigError(f"{INNER_KEY}.{bad[0]}", "is not a kv_transfer_config key the wrapper passes on")
        module = inner.get("kv_connector_module_path")
        if module is not None and (not isinstance(module, str) or not module):
            raise ConfigError(f"{INNER_KEY}.kv_connector_module_path", f"must be a module name, got {module!r}")
        inner_extra = inner.get("kv_connector_extra_config", {})
        if not isinstance(inner_extra, Mapping):
            raise ConfigError(f"{INNER_KEY}.kv_connector_extra_config", "must be a mapping")
        log_dir = extra.get(LOG_DIR_KEY)
        if log_dir is not None and (not isinstance(log_dir, str) or not log_dir):
            raise ConfigError(LOG_DIR_KEY, f"must be a directory path string, got {log_dir!r}")
        scribble = extra.get(SCRIBBLE_KEY, False)
        if not isinstance(scribble, bool):
            raise ConfigError(SCRIBBLE_KEY, f"must be true or false, got {scribble!r}")
        return cls(inner=dict(inner), log_dir=log_dir, scribble=scribble)


def watch_transfer_config(inner: Mapping[str, Any], *, hma: bool, log_dir: str | None = None,
                          scribble: bool = False) -> dict[str, Any]:
    """The `kv_transfer_config` that wraps `inner` (a kv_transfer_config) in the watching wrapper."""
    extra: dict[str, Any] = {INNER_KEY: dict(inner), SCRIBBLE_KEY: scribble}
    if log_dir is not None:
        extra[LOG_DIR_KEY] = log_dir
    return {
        "kv_connector": WRAPPER_CLASS_HMA if hma else WRAPPER_CLASS,
        "kv_connector_module_path": WRAPPER_MODULE,
        "kv_role": inner.get("kv_role", "kv_both"),
        "kv_connector_extra_config": extra,
    }
