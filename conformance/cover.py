"""Edge cover: few, short paths from initial states that together take every edge of a state graph.

Greedy, in the spirit of a Chinese-postman tour cut into traces: start each path at an initial state,
walk the shortest way to the nearest state that still has an untaken edge, take untaken edges while
there are any (preferring a successor that itself has untaken edges), and when stuck, walk on to the
nearest state with untaken edges (searching at most WALK_LIMIT states) — unless that would make the
path longer than ``max_len`` states, which starts a new path. A new path starts with the shortest path
from an initial state to the first state, in BFS order, that still has untaken edges. Every edge of the graph is reachable from an initial state (TLC only dumps
reachable states), so the loop ends with every edge covered.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import networkx as nx

from deferdump.conformance.errors import TraceGenerationError
from deferdump.conformance.stategraph import StateGraph, StateKey

__all__ = ["edge_cover_paths", "path_edges"]

WALK_LIMIT = 500
"""States a stuck path may search for its next untaken edge before a fresh path is cheaper to find."""


def path_edges(path: list[StateKey]) -> list[tuple[StateKey, StateKey]]:
    return list(zip(path, path[1:]))


def _nearest_with_work(graph: nx.DiGraph, start: StateKey, untaken: dict[StateKey, set[StateKey]],
                       limit: int) -> list[StateKey] | None:
    """Shortest path (BFS, deterministic order) from ``start`` to a state with untaken edges, looking at
    no more than ``limit`` states (a far one is better reached by a fresh path from an initial state)."""
    parents: dict[StateKey, StateKey | None] = {start: None}
    queue: deque[StateKey] = deque([start])
    while queue and len(parents) <= limit:
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


def _bfs_tree(graph: nx.DiGraph, initial: Iterable[StateKey]) -> tuple[list[StateKey], dict[StateKey, StateKey | None]]:
    """States in BFS order from the initial states, and each one's BFS parent (None for initial states)."""
    parents: dict[StateKey, StateKey | None] = {}
    order: list[StateKey] = []
    for start in initial:
        if start not in parents:
            parents[start] = None
            order.append(start)
    for node in order:
        for successor in graph.successors(node):
            if successor not in parents:
                parents[successor] = node
                order.append(successor)
    return order, parents


def edge_cover_paths(state_graph: StateGraph, max_len: int | None = None) -> list[list[StateKey]]:
    """Paths (lists of states, each starting at an initial state) covering every edge of the graph.

    ``max_len`` bounds the number of states of a path where possible (a path is never shorter than the
    distance to the edge it must cover plus one).
    """
    graph = state_graph.graph
    untaken: dict[StateKey, set[StateKey]] = {node: set(graph.successors(node)) for node in graph.nodes}
    remaining = graph.number_of_edges()
    paths: list[list[StateKey]] = []
    order, parents = _bfs_tree(graph, state_graph.initial)
    rank = {node: index for index, node in enumerate(order)}  # deterministic tie-breaks
    cursor = 0  # states before it in BFS order have no untaken edge left (untaken only shrinks)
    while remaining:
        while cursor < len(order) and not untaken[order[cursor]]:
            cursor += 1
        if cursor == len(order):
            raise TraceGenerationError(f"{remaining} edge(s) unreachable from the initial states")
        lead = [order[cursor]]  # the nearest state with work: the shortest path to it from an initial state
        while parents[lead[-1]] is not None:
            lead.append(parents[lead[-1]])  # type: ignore[arg-type]
        lead.reverse()
        path = list(lead)
        while True:
            node = path[-1]
            choices = untaken[node]
            if max_len is not None and len(path) >= max_len and len(path) > len(lead):  # >= 1 new edge per path
                break
            if choices:
                target = max(sorted(choices, key=rank.__getitem__), key=lambda s: len(untaken[s]) - (s == node))
                choices.discard(target)
                remaining -= 1
                path.append(target)
                continue
            walk = _nearest_with_work(graph, node, untaken, WALK_LIMIT)
            if walk is None or (max_len is not None and len(path) + len(walk) > max_len):
                break
            path.extend(walk[1:])
        paths.append(path)
    return paths
