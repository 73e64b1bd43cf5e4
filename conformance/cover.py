"""Edge cover: few, short paths from initial states that together take every edge of a state graph.

Greedy, in the spirit of a Chinese-postman tour cut into traces: start each path at an initial state,
walk the shortest way to the nearest state that still has an untaken edge, take untaken edges while
there are any (preferring a successor that itself has untaken edges), and when stuck, walk on to the
nearest state with untaken edges — unless that would make the path longer than ``max_len`` states,
which starts a new path. Every edge of the graph is reachable from an initial state (TLC only dumps
reachable states), so the loop ends with every edge covered.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import networkx as nx

from .errors import TraceGenerationError
from .stategraph import StateGraph, StateKey

__all__ = ["edge_cover_paths", "path_edges"]


def path_edges(path: list[StateKey]) -> list[tuple[StateKey, StateKey]]:
    return list(zip(path, path[1:]))


def _nearest_with_work(graph: nx.DiGraph, starts: Iterable[StateKey],
                       untaken: dict[StateKey, set[StateKey]]) -> list[StateKey] | None:
    """Shortest path (BFS, deterministic order) from any of ``starts`` to a state with untaken edges."""
    parents: dict[StateKey, StateKey | None] = {}
    queue: deque[StateKey] = deque()
    for start in starts:
        if start not in parents:
            parents[start] = None
            queue.append(start)
    while queue:
        node = queue.popleft()
        if untaken.get(node):
            path = [node]
            while parents[path[-1]] is not None:
                path.append(parents[path[-1]])  # type: ignore[arg-type]
            return path[::-1]
        for successor in graph.successors(node):
            if successor not in parents:
                parents[successor] = node
                queue.append(successor)
    return None


def edge_cover_paths(state_graph: StateGraph, max_len: int | None = None) -> list[list[StateKey]]:
    """Paths (lists of states, each starting at an initial state) covering every edge of the graph.

    ``max_len`` bounds the number of states of a path where possible (a path is never shorter than the
    distance to the edge it must cover plus one).
    """
    graph = state_graph.graph
    untaken: dict[StateKey, set[StateKey]] = {node: set(graph.successors(node)) for node in graph.nodes}
    remaining = graph.number_of_edges()
    order = {node: index for index, node in enumerate(graph.nodes)}  # deterministic tie-breaks
    paths: list[list[StateKey]] = []
    while remaining:
        lead = _nearest_with_work(graph, state_graph.initial, untaken)
        if lead is None:
            raise TraceGenerationError(f"{remaining} edge(s) unreachable from the initial states")
        path = list(lead)
        while True:
            node = path[-1]
            choices = untaken[node]
            if max_len is not None and len(path) >= max_len and len(path) > len(lead):  # at least one new edge per path
                break
            if choices:
                target = max(sorted(choices, key=order.__getitem__),
                             key=lambda s: len(untaken[s]) - (s == node))
                choices.discard(target)
                remaining -= 1
                path.append(target)
                continue
            walk = _nearest_with_work(graph, [node], untaken)
            if walk is None or (max_len is not None and len(path) + len(walk) > max_len):
                break
            path.extend(walk[1:])
        paths.append(path)
    return paths
