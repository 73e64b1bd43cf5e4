"""Merging the ``--json`` results of sharded ``deferdump check`` runs into the result of one run.

A model checked by model checking must appear once (twice: a duplicate, or a conflict if the two differ);
a simulated model appears once per shard of its simulation, and its shards are folded into one result
(behaviours, batches and generated states summed, the violation of the earliest batch kept). Every shard
``K/N`` named in the files must come with its siblings ``1..N``, and, given the models expected (a tier),
the merged models must be exactly those. Anything else is a :class:`MergeError`, never a partial verdict.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from deferdump.reference.errors import UserError

__all__ = ["MergeError", "load_results", "merge_results"]

_KEYS = ("model", "status", "kind", "property", "distinct_states", "generated_states", "depth", "seconds",
         "trace", "loop_index", "message", "expected_ok")
_VERDICT_KEYS = ("status", "kind", "property", "distinct_states", "generated_states", "depth", "trace",
                 "loop_index", "expected_ok")
"""What must agree for two results of one model to be the same result (timings may differ)."""


class MergeError(UserError):
    """Results that cannot be merged into one run's: unreadable, duplicated, conflicting or incomplete."""


def load_results(path: Path) -> list[dict[str, Any]]:
    """One file written by ``deferdump check --json``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MergeError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise MergeError(f"{path}: cannot read: {error}") from None
    except json.JSONDecodeError as error:
        raise MergeError(f"{path}: bad JSON at line {error.lineno}, column {error.colno}: {error.msg}") from None
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise MergeError(f"{path}: expected the JSON list that deferdump check --json prints")
    for item in data:
        missing = [key for key in _KEYS if key not in item]
        if missing:
            raise MergeError(f"{path}: a result lacks {', '.join(missing)}: not deferdump check --json output")
        if not isinstance(item["model"], str) or not isinstance(item["expected_ok"], bool):
            raise MergeError(f"{path}: a result has a malformed 'model' or 'expected_ok'")
    return data


def _shard(item: dict[str, Any], where: str) -> tuple[int, int] | None:
    text = item.get("shard")
    if text is None:
        return None
    index, _, count = str(text).partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise MergeError(f"{where}: model {item['model']}: bad shard {text!r}")
    return int(index), int(count)


def _fold_simulation(model: str, parts: list[tuple[str, dict[str, Any]]],
                     judge: Callable[[str, dict[str, Any]], bool]) -> dict[str, Any]:
    """One simulation's shards -> one result."""
    first = parts[0][1]
    for where, item in parts[1:]:
        for key in ("seed", "depth_bound", "ladder", "requests", "batch"):
            if item.get(key) != first.get(key):
                raise MergeError(f"conflicting results for {model}: shards simulated with different {key} "
                                 f"({first.get(key)} and {item.get(key)}, {where})")
    found = [item for _, item in parts if item["status"] != "pass"]
    chosen = min(found, key=lambda item: (item.get("batch_index") is None, item.get("batch_index") or 0)) \
        if found else first
    merged = dict(chosen)
    merged["behaviours"] = sum(item.get("behaviours") or 0 for _, item in parts)
    merged["batches"] = sum(item.get("batches") or 0 for _, item in parts)
    merged["generated_states"] = sum(item.get("generated_states") or 0 for _, item in parts)
    merged["seconds"] = max(item["seconds"] for _, item in parts)  # shards run side by side
    merged["budget_spent"] = any(item.get("budget_spent") for _, item in parts)
    merged["shard"] = None
    if not found:
        merged["message"] = (f"no violation in {merged['behaviours']:,} behaviours of depth <= "
                             f"{merged.get('depth_bound')} (seed {merged.get('seed')})")
    merged["expected_ok"] = judge(model, merged)
    return merged


def merge_results(files: Sequence[tuple[str, list[dict[str, Any]]]], *,
                  expected_models: Sequence[str] | None = None,
                  judge: Callable[[str, dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
    """Merge (file name, results) pairs into one run's results, in first-seen model order.

    ``judge(model, merged)`` decides a folded simulation's ``expected_ok`` (default: it passed);
    ``expected_models``: the models the merged run must hold, exactly (e.g. a tier's).
    """
    judge = judge or (lambda _model, item: item["status"] == "pass")
    by_model: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    shards_seen: dict[int, set[int]] = {}
    for where, items in files:
        for item in items:
            by_model.setdefault(item["model"], []).append((where, item))
            shard = _shard(item, where)
            if shard is not None:
                shards_seen.setdefault(shard[1], set()).add(shard[0])
    for count, indices in sorted(shards_seen.items()):
        missing = sorted(set(range(1, count + 1)) - indices)
        if missing:
            raise MergeError(f"missing shards: {', '.join(f'{k}/{count}' for k in missing)} "
                             "(merge the results of every shard)")

    merged: list[dict[str, Any]] = []
    for model, parts in by_model.items():
        modes = {item.get("mode", "check") for _, item in parts}
        if len(modes) > 1:
            raise MergeError(f"conflicting results for {model}: both model-checked and simulated")
        if modes == {"simulate"}:
            seen: dict[str, str] = {}
            for where, item in parts:
                key = str(item.get("shard"))
                if key in seen:
                    raise MergeError(f"duplicate result: {model} shard {key} in {seen[key]} and {where}")
                seen[key] = where
            merged.append(_fold_simulation(model, parts, judge))
            continue
        if len(parts) > 1:
            (first_where, first), (where, other) = parts[0], parts[1]
            if any(first.get(key) != other.get(key) for key in _VERDICT_KEYS):
                raise MergeError(f"conflicting results for {model}: {first['status']} with "
                                 f"{first['distinct_states']} distinct states in {first_where}, {other['status']} "
                                 f"with {other['distinct_states']} in {where}")
            raise MergeError(f"duplicate result: {model} in {first_where} and {where}")
        merged.append(dict(parts[0][1]))

    if expected_models is not None:
        missing_models = [name for name in expected_models if name not in by_model]
        extra = [name for name in by_model if name not in set(expected_models)]
        if missing_models:
            raise MergeError(f"missing models: {', '.join(missing_models)}")
        if extra:
            raise MergeError(f"models not in the selection: {', '.join(extra)}")
        order = {name: position for position, name in enumerate(expected_models)}
        merged.sort(key=lambda item: order[item["model"]])
    return merged
