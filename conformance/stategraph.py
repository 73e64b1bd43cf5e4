"""TLC's full state graph (``-dump dot,actionlabels``) as a networkx digraph of decoded states.

TLC writes a ``strict digraph``: one node per distinct state (its fingerprint as id, the state as a
``/\\ var = value`` label, ``style = filled`` for initial states) and one edge per (state, successor)
pair labelled with the TLA+ action that took it. graphviz/pydot are not needed: the format is regular
enough for two regular expressions, and a node label is decoded with the TLC value parser.

Nodes are keyed by :func:`state_key`, a canonical form of the decoded state, so a state read back from an
ITF trace finds its node without TLC's (run-dependent) fingerprints.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from deferdump.tools.tlc.values import TlaParseError, Value, parse_value, value_key

from deferdump.conformance.errors import StateGraphError

__all__ = ["StateGraph", "StateKey", "parse_dot", "state_key"]

StateKey = tuple[tuple[str, Any], ...]
"""Canonical, hashable form of a whole state (variable name -> :func:`value_key`)."""

_NODE = re.compile(r'^(-?\d+) \[label="((?:[^"\\]|\\.)*)"(,style = filled)?\]\s*;?\s*$')
_EDGE = re.compile(r'^(-?\d+) -> (-?\d+) \[label="((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_VARIABLE = re.compile(r"^(?:/\\ )?([A-Za-z_][A-Za-z0-9_]*) = ", re.MULTILINE)


class _StateParser:
    """``/\\ var = value`` bodies, each distinct value text parsed once (states repeat most values)."""

    def __init__(self) -> None:
        self._values: dict[str, Value] = {}

    def parse(self, body: str) -> dict[str, Value]:
        matches = list(_VARIABLE.finditer(body))
        state: dict[str, Value] = {}
        for i, match in enumerate(matches):
            text = body[match.end(): matches[i + 1].start() if i + 1 < len(matches) else len(body)].strip()
            value = self._values.get(text, _MISSING)
            if value is _MISSING:
                try:
                    value = self._values[text] = parse_value(text)
                except TlaParseError as error:
                    raise StateGraphError(f"cannot decode variable {match.group(1)}: {error}") from None
            state[match.group(1)] = value
        return state


_MISSING = object()


def state_key(state: Mapping[str, Value]) -> StateKey:
    """Canonical key of a state; equal states (in TLA+ terms) have equal keys."""
    return tuple(sorted((name, value_key(value)) for name, value in state.items()))


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


@dataclass
class StateGraph:
    """Reachable states and transitions of a model: node -> state, edge -> TLA+ action label."""

    graph: nx.DiGraph
    initial: tuple[StateKey, ...]
    states: dict[StateKey, dict[str, Value]] = field(default_factory=dict)

    @property
    def num_states(self) -> int:
        return self.graph.number_of_nodes()

    @property
    def num_edges(self) -> int:
        return self.graph.number_of_edges()

    def edges(self) -> Iterable[tuple[StateKey, StateKey]]:
        return self.graph.edges()

    def action_labels(self) -> frozenset[str]:
        """The TLA+ actions (edge labels) that occur in the graph."""
        return frozenset(label for _, _, label in self.graph.edges(data="action"))

    def label(self, source: StateKey, target: StateKey) -> str:
        return str(self.graph.edges[source, target]["action"])


def parse_dot(text: str, source: str | Path = "<dot>") -> StateGraph:
    """Decode a TLC DOT dump; raises :class:`StateGraphError` naming the line that does not fit."""
    ids: dict[str, StateKey] = {}
    graph = nx.DiGraph()
    states: dict[StateKey, dict[str, Value]] = {}
    initial: list[StateKey] = []
    edges: list[tuple[str, str, str, int]] = []
    parser = _StateParser()
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        edge = _EDGE.match(line)
        if edge:
            edges.append((edge.group(1), edge.group(2), _unescape(edge.group(3)), number))
            continue
        node = _NODE.match(line)
        if node is None:
            continue
        try:
            state = parser.parse(_unescape(node.group(2)))
        except StateGraphError as error:
            raise StateGraphError(f"{source}:{number}: {error}") from None
        if not state:
            continue  # the legend's action nodes carry a bare label, no state
        key = state_key(state)
        ids[node.group(1)] = key
        states[key] = state
        graph.add_node(key)
        if node.group(3):
            initial.append(key)
    for source_id, target_id, label, number in edges:
        if source_id not in ids or target_id not in ids:
            raise StateGraphError(f"{source}:{number}: edge between unknown states {source_id} -> {target_id}")
        graph.add_edge(ids[source_id], ids[target_id], action=label)
    if not initial:
        raise StateGraphError(f"{source}: no initial state (no node with style = filled)")
    return StateGraph(graph=graph, initial=tuple(initial), states=states)
