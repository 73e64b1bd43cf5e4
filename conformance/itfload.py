"""Loading many ITF traces of one model fast: identical JSON values decode to one shared Python value.

Consecutive states of a trace, and the traces of one model, repeat most variable values; decoding each
occurrence anew (and computing its canonical key anew when it is compared) dominated replay. Here every
variable value is decoded once per distinct JSON text, through :func:`deferdump.tools.tlc.values.from_itf`,
and shared. Anything the fast path does not accept is handed to :func:`~deferdump.tools.tlc.values.parse_itf`,
whose error names the file, the state index and the JSON path.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deferdump.tools.tlc.values import ItfError, ItfTrace, Value, from_itf, parse_itf

__all__ = ["DecodedLoader", "TraceLoader"]


class TraceLoader:
    """Loads ITF files, sharing decoded values between all the files it loads."""

    def __init__(self) -> None:
        self._values: dict[str, Value] = {}

    def load(self, path: Path | str) -> ItfTrace:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise ItfError(f"cannot read: {error.strerror or error}", file=path) from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as error:
            raise ItfError(f"bad JSON at line {error.lineno}, column {error.colno}: {error.msg}", file=path) from None
        trace = self._fast(obj, path)
        return trace if trace is not None else parse_itf(obj, file=path)  # the latter raises the precise error

    def _fast(self, obj: Any, path: Path) -> ItfTrace | None:
        if not isinstance(obj, dict) or not isinstance(obj.get("#meta", {}), dict):
            return None
        names, raw_states = obj.get("vars"), obj.get("states")
        params = obj.get("params", [])
        if (not isinstance(names, list) or not all(isinstance(n, str) for n in names)
                or not isinstance(raw_states, list) or not isinstance(params, list)):
            return None
        allowed = set(names) | {"#meta"}
        loop = obj.get("loop")
        if loop is not None and (type(loop) is not int or not 0 <= loop < len(raw_states)):
            return None
        states: list[dict[str, Value]] = []
        state_meta: list[Any] = []
        try:
            for raw in raw_states:
                if not isinstance(raw, dict) or not all(name in raw for name in names) or not set(raw) <= allowed:
                    return None
                states.append({name: self._decode(raw[name]) for name in names})
                state_meta.append(raw.get("#meta", {}))
        except ItfError:
            return None
        return ItfTrace(vars=tuple(names), states=tuple(states), meta=obj.get("#meta", {}), loop=loop,
                        params=tuple(params), state_meta=tuple(state_meta), path=path)

    def _decode(self, raw: Any) -> Value:
        key = repr(raw)  # equal texts only for equal JSON; another key order merely decodes anew
        value = self._values.get(key, _MISSING)
        if value is _MISSING:
            value = self._values[key] = from_itf(raw)
        return value


class DecodedLoader(TraceLoader):
    """A :class:`TraceLoader` that answers the files of traces already decoded (each by its ``path``; e.g. the
    trace cache's pickled copy, a fifth of the CPU of decoding the JSON) and decodes any other file itself."""

    def __init__(self, traces: Iterable[ItfTrace]) -> None:
        super().__init__()
        self._decoded = {Path(trace.path): trace for trace in traces if trace.path is not None}

    def load(self, path: Path | str) -> ItfTrace:
        return self._decoded.get(Path(path)) or super().load(path)


_MISSING = object()
