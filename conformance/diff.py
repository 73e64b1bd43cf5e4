"""Readable differences between the model's value of a variable and the implementation's.

Sets show what only one side holds; functions and records recurse per key, so a divergence in
``workerAsync`` reads ``workerAsync[1]: only in model {r1}`` rather than two whole maps.
"""
from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from deferdump.tools.tlc.values import TlaSet, Value, format_value, value_key

__all__ = ["diff_states", "diff_value"]


def _fmt(value: Value) -> str:
    try:
        return format_value(value)
    except TypeError:
        return repr(value)


def _as_set(value: Value) -> AbstractSet[Value] | None:
    return value if isinstance(value, (TlaSet, frozenset, set)) else None


def diff_value(path: str, model: Value, impl: Value) -> list[str]:
    """Lines describing how ``impl`` differs from ``model`` at ``path`` (empty when equal)."""
    if value_key(model) == value_key(impl):
        return []
    model_set, impl_set = _as_set(model), _as_set(impl)
    if model_set is not None and impl_set is not None:
        model_keys = {value_key(v): v for v in model_set}
        impl_keys = {value_key(v): v for v in impl_set}
        lines = []
        missing = [v for k, v in model_keys.items() if k not in impl_keys]
        extra = [v for k, v in impl_keys.items() if k not in model_keys]
        if missing:
            lines.append(f"{path}: only in model {_fmt(TlaSet(missing))}")
        if extra:
            lines.append(f"{path}: only in implementation {_fmt(TlaSet(extra))}")
        return lines
    if (isinstance(model, tuple) and isinstance(impl, tuple) and len(model) == len(impl)
            and not isinstance(model, Mapping)):
        lines = []
        for index, (left, right) in enumerate(zip(model, impl), start=1):  # TLA+ tuples count from 1
            lines.extend(diff_value(f"{path}[{index}]", left, right))
        if lines:
            return lines
    if isinstance(model, Mapping) and isinstance(impl, Mapping):
        model_keys = {value_key(k): k for k in model}
        impl_keys = {value_key(k): k for k in impl}
        if set(model_keys) == set(impl_keys):
            lines = []
            for key_id, key in model_keys.items():
                index = f".{key}" if isinstance(key, str) else f"[{_fmt(key)}]"
                lines.extend(diff_value(path + index, model[key], impl[impl_keys[key_id]]))
            if lines:
                return lines
    return [f"{path}: model {_fmt(model)}, implementation {_fmt(impl)}"]


def diff_states(model: Mapping[str, Value], impl: Mapping[str, Value]) -> list[str]:
    """Differences over the implementation's observable variables (those ``impl`` holds)."""
    lines: list[str] = []
    for name in sorted(impl):
        lines.extend(diff_value(name, model[name], impl[name]))
    return lines
