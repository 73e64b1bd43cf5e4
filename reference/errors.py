"""The one exception hierarchy of deferdump, at the bottom layer so every package can use it.

`DeferDumpError` is the root of every error deferdump raises on purpose. Two branches matter to callers:
- `UserError`: the user's input or environment is wrong (a missing file, no Java, a malformed manifest or
  trace, an unusable store directory, an unreachable server). The CLI prints `str(error)` as one line on
  stderr and exits 2, so every message must make sense on its own.
- Everything else under the root is the protocol refusing something at run time (an event handle released
  twice, a store task failing); the connector handles those. An exception outside the root is a bug in
  deferdump and keeps its traceback.
`ConfigError` is also a `ValueError`, because vLLM and users expect a bad config value to be one.
"""
from __future__ import annotations


class DeferDumpError(Exception):
    """Base of every error deferdump raises on purpose."""


class UserError(DeferDumpError):
    """An expected failure caused by the user's input or environment, with a one-line message."""


class ConfigError(UserError, ValueError):
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
