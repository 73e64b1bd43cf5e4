"""Checks of a decoded trace against what a replay driver reads (before any driver is built)."""
from __future__ import annotations

from collections.abc import Sequence

from deferdump.tools.tlc.values import ItfError, ItfTrace, Record

__all__ = ["ACTION", "validate_actions"]

ACTION = "action"
"""The history variable that names each step's action (and records its calls)."""


def validate_actions(trace: ItfTrace, driver_actions: frozenset[str], observed: Sequence[str]) -> None:
    """Every state carries a known ``action`` record and every observed variable (else ItfError)."""
    file = trace.path
    if ACTION not in trace.vars:
        raise ItfError("the model's 'action' variable is missing from 'vars'", json_path="$.vars", file=file)
    missing = [name for name in observed if name not in trace.vars]
    if missing:
        raise ItfError(f"variables the replay compares are missing from 'vars': {missing}", json_path="$.vars",
                       file=file)
    if not trace.states:
        raise ItfError("a trace needs at least one state", json_path="$.states", file=file)
    for index, state in enumerate(trace.states):
        action = state[ACTION]
        where = f"$.states[{index}].action"
        if not isinstance(action, Record) or not isinstance(action.get("name"), str):
            raise ItfError("'action' must be a record with a string 'name'", json_path=where, file=file, state=index)
        if action["name"] not in driver_actions:
            raise ItfError(f"unknown action name {action['name']!r} (known: {', '.join(sorted(driver_actions))})",
                           json_path=f"{where}.name", file=file, state=index)
