"""Exceptions of the reference connector (the store's own live in `store_base`).

One small hierarchy so callers can catch "anything the connector refused" without catching bugs.
`ConfigError` is also a `ValueError`, because vLLM and users expect a bad config value to be one.
"""
from __future__ import annotations


class DeferDumpError(Exception):
    """Base of every error the reference connector raises on purpose."""


class ConfigError(DeferDumpError, ValueError):
    """A connector config key or value is unknown or invalid; `key` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class EventHandleError(DeferDumpError):
    """An event handle was released twice, or was never acquired."""


class LayoutError(DeferDumpError):
    """A KV-cache tensor's block dimension cannot be determined unambiguously."""


class DeviceError(DeferDumpError):
    """A device copy was asked for something the registered KV caches cannot give."""


class RoleError(DeferDumpError):
    """A scheduler-side method was called on a worker-side connector, or the reverse."""
