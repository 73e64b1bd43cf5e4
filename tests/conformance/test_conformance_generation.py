"""Trace generation on the Toy fixture model: DOT state graph, edge cover, ITF files, TLC simulation."""
from __future__ import annotations

import json

import pytest

from support.conformance import FIXTURES, toy_manifest
from deferdump.conformance.cover import edge_cover_paths
from deferdump.conformance.errors import StateGraphError, TraceGenerationError
from deferdump.conformance.stategraph import parse_dot, state_key
from deferdump.conformance.tracegen import cfg_constants, generate_traces, generation_cfg, model_graph
from deferdump.tools.tlc.values import ModelValue, Record, TlaSet, Tup, load_itf


@pytest.fixture(scope="module")
def toy():
    return toy_manifest().get("Toy")


@pytest.fixture(scope="module")
def graph(toy):
    return model_graph(toy)


def test_state_graph_matches_tlc_counts(graph):
    assert graph.num_states == 14  # TLC's distinct-state count for Toy.cfg (manifest)
    assert graph.num_edges == 32
    assert graph.action_labels() == {"inc", "reset", "Done"}
    (initial,) = graph.initial
    assert graph.states[initial] == {"slots": Tup((0, 0)), "action": Record(name="init")}
    assert all(graph.label(*edge) == "Done" for edge in graph.edges() if edge[0] == edge[1])


def test_edge_cover_takes_every_edge_from_an_initial_state(graph):
    paths = edge_cover_paths(graph)
    taken = {edge for path in paths for edge in zip(path, path[1:])}
    assert taken == set(graph.edges())
    for path in paths:
        assert path[0] in graph.initial
        assert all(graph.graph.has_edge(a, b) for a, b in zip(path, path[1:]))
    assert len(paths) <= 3  # two Done sinks: each ends one path


def test_edge_cover_respects_max_len_where_possible(graph):
    paths = edge_cover_paths(graph, max_len=6)
    assert {edge for path in paths for edge in zip(path, path[1:])} == set(graph.edges())
    assert max(len(path) for path in paths) <= 6


def test_cover_traces_are_itf_files_carrying_model_and_constants(toy, tmp_path):
    result = generate_traces(toy, "cover", tmp_path / "out")
    assert result.covered_edges == result.edges == 32 and result.states == 14
    assert result.traces == len(result.files) >= 1
    trace = load_itf(result.files[0])
    assert trace.meta["model"] == "Toy" and trace.meta["mode"] == "cover"
    assert trace.meta["constants"] == {"Max": {"#bigint": "2"}}
    assert set(trace.vars) == {"slots", "action"}
    assert trace.states[0]["action"] == Record(name="init")
    raw = json.loads(result.files[0].read_text())
    assert raw["states"][0]["slots"] == {"#tup": [{"#bigint": "0"}, {"#bigint": "0"}]}
    assert result.to_json()["files"] == [str(p) for p in result.files]


def test_generation_never_overwrites_a_file(toy, tmp_path):
    generate_traces(toy, "cover", tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(TraceGenerationError, match="not overwriting"):
        generate_traces(toy, "cover", tmp_path)
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_simulation_is_deterministic_for_a_seed(toy, tmp_path):
    first = generate_traces(toy, "simulate", tmp_path / "a", num=4, seed=11, max_len=7)
    second = generate_traces(toy, "simulate", tmp_path / "b", num=4, seed=11, max_len=7)
    assert first.traces == 4
    assert [p.read_bytes() for p in first.files] == [p.read_bytes() for p in second.files]
    assert all(1 < n <= 7 for n in first.lengths)
    for path in first.files:
        states = load_itf(path).states
        # every step of a simulated trace is an edge of the model's state graph
        graph = model_graph(toy)
        keys = [state_key(s) for s in states]
        assert all(graph.graph.has_edge(a, b) for a, b in zip(keys, keys[1:]))


def test_generation_cfg_drops_symmetry_and_properties():
    cfg = "CONSTANTS\n  Req = {r1, r2}\n  N = 2 \\* two\nSYMMETRY Sym\nINVARIANT TypeInv\nPROPERTIES\n  LiveProp\n  OtherProp\nSPECIFICATION Spec\n"
    text = generation_cfg(cfg)
    assert "SYMMETRY" not in text and "LiveProp" not in text and "PROPERTIES" not in text
    assert "INVARIANT TypeInv" in text and "SPECIFICATION Spec" in text and "Req = {r1, r2}" in text
    assert cfg_constants(cfg) == {"Req": TlaSet([ModelValue("r1"), ModelValue("r2")]), "N": 2}


def test_malformed_dot_is_rejected_with_its_line():
    bad = '1 [label="/\\\\ x = <<",style = filled]\n'
    with pytest.raises(StateGraphError, match="g.dot:1"):
        parse_dot(bad, source="g.dot")
    with pytest.raises(StateGraphError, match="no initial state"):
        parse_dot('1 [label="/\\\\ x = 1"]\n', source="g.dot")


def test_fixture_files_exist():
    assert (FIXTURES / "Toy.tla").is_file() and (FIXTURES / "Toy.cfg").is_file()
