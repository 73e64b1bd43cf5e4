"""Shrinking a failing trace to a shortest failing one, written beside it as ``<name>.min.itf.json``.

Replay is deterministic and stops at the first divergence, so the prefix ending at the divergent state
already fails and no shorter prefix does. When the model's state graph is at hand, a shorter behaviour
may fail too (a cover trace wanders): the shortest paths from an initial state that end in an edge of
the failing step's TLA+ action are replayed, shortest first (at most MAX_ATTEMPTS), and the first that
fails wins. The shortest failing candidate is written with the original ``#meta`` plus
where it came from.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from deferdump.tools.tlc.values import ItfTrace, Value

from deferdump.conformance.driver import DriverFactory
from deferdump.conformance.replay import Divergence, replay_states
from deferdump.conformance.stategraph import StateGraph, StateKey, state_key

__all__ = ["minimized_path", "shrink_failure"]

log = logging.getLogger(__name__)

MIN_SUFFIX = ".min.itf.json"
MAX_ATTEMPTS = 200  # candidate behaviours replayed at most per failing trace


def minimized_path(path: Path) -> Path:
    name = path.name
    stem = name[: -len(".itf.json")] if name.endswith(".itf.json") else path.stem
    return path.with_name(stem + MIN_SUFFIX)


def _candidates(graph: StateGraph, before: Mapping[str, Value],
                after: Mapping[str, Value]) -> Iterator[list[Mapping[str, Value]]]:
    """Shortest behaviours ending in an edge of the failing edge's TLA+ action, shortest first."""
    source, target = state_key(before), state_key(after)
    if not graph.graph.has_edge(source, target):
        return
    label = graph.label(source, target)
    parents: dict[StateKey, StateKey | None] = {start: None for start in graph.initial}
    depth = {start: 0 for start in graph.initial}
    order = list(graph.initial)
    for node in order:  # BFS from every initial state at once
        for successor in graph.graph.successors(node):
            if successor not in parents:
                parents[successor] = node
                depth[successor] = depth[node] + 1
                order.append(successor)
    edges = sorted(((u, v) for u, v, a in graph.graph.edges(data="action") if a == label and u in depth),
                   key=lambda edge: depth[edge[0]])
    for u, v in edges[:MAX_ATTEMPTS]:
        path = [u]
        while parents[path[-1]] is not None:
            path.append(parents[path[-1]])  # type: ignore[arg-type]
        yield [graph.states[key] for key in reversed(path)] + [graph.states[v]]


def shrink_failure(trace: ItfTrace, divergence: Divergence, driver_factory: DriverFactory,
                   graph: StateGraph | None) -> None:
    """Find the shortest failing candidate, write it beside the trace and point ``divergence`` at it."""
    if trace.path is None or trace.path.name.endswith(MIN_SUFFIX):
        return
    states: Sequence[Mapping[str, Value]] = trace.states[: divergence.step + 1]
    if graph is not None and divergence.step >= 1:
        for candidate in _candidates(graph, trace.states[divergence.step - 1], trace.states[divergence.step]):
            if len(candidate) >= len(states):
                break
            driver = driver_factory(trace)
            try:
                outcome = replay_states(candidate, driver, str(trace.path))
            finally:
                driver.close()
            if outcome.divergence is not None:
                states = candidate[: outcome.divergence.step + 1]
                break
    from deferdump.conformance.tracegen import write_itf

    target = minimized_path(trace.path)
    meta = {key: value for key, value in trace.meta.items() if key not in ("format", "format-description")}
    meta.update({"shrunk_from": trace.path.name, "failing_step": len(states) - 1})
    write_itf(target, list(states), meta)
    divergence.minimized = str(target)
    divergence.minimized_steps = len(states) - 1
    log.info("shrunk %s from %d to %d steps: %s", trace.path.name, divergence.step, len(states) - 1, target)


