"""The package layers stay as the README's "Layout" section draws them, with no import cycle between packages.

reference (the connector, devices, stores, test doubles) <- tools.tlc (the TLC bridge) and tools.engine (the
simulated vLLM engine) <- conformance <- the applications (tools.explain, tools.mro, tools.bench, tools.cli).
Read from the source with `ast`, so a lazy import inside a function counts as much as one at the top.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

import deferdump.reference

ROOT = Path(deferdump.reference.__file__).resolve().parents[1]
PACKAGE_DIRS = {"reference": "deferdump.reference", "tools": "deferdump.tools", "conformance": "deferdump.conformance"}

# package -> the packages it may import (besides itself); the order is the layer order.
ALLOWED: dict[str, set[str]] = {
    "reference": set(),
    "tools.tlc": {"reference"},
    "tools.engine": {"reference"},
    "tools.vllmrun": {"reference"},
    "conformance": {"reference", "tools.tlc"},
    "tools.explain": {"reference", "tools.tlc"},
    "tools.mro": {"reference", "tools.tlc"},
    "tools.bench": {"reference", "tools.tlc", "tools.engine", "tools.vllmrun", "conformance"},
    "tools.watch": {"reference", "tools.tlc", "tools.engine", "tools.vllmrun", "conformance"},
    "tools.cli": {"reference", "tools.tlc", "tools.engine", "tools.vllmrun", "conformance", "tools.explain", "tools.mro",
                  "tools.bench", "tools.watch"},
}
# inside reference: the stores sit below the connector and know nothing of it.
STORES_MAY_IMPORT = ("deferdump.reference.errors", "deferdump.reference.stores")


def _unit(module: str) -> str:
    """The layer unit of a deferdump module: reference (with subpackages), conformance, or tools.<sub>."""
    parts = module.split(".")[1:]
    if parts[0] == "tools":  # a subpackage itself (`from deferdump.tools.vllmrun import engine`) is in its unit
        return "tools." + parts[1] if len(parts) > 1 else "tools"
    return parts[0]


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for directory, package in PACKAGE_DIRS.items():
        for path in (ROOT / directory).rglob("*.py"):
            rel = path.relative_to(ROOT / directory).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("deferdump.")}


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    modules = _modules()
    assert len(modules) > 50, "the source tree was not found"
    g = nx.DiGraph()
    for module, path in modules.items():
        for target in _imports(path):
            g.add_edge(module, target)
    return g


def test_every_module_belongs_to_a_known_layer(graph: nx.DiGraph) -> None:
    units = {_unit(module) for module in _modules()}
    assert units <= set(ALLOWED) | {"tools"}, units - set(ALLOWED)


def _layer_violations(graph: nx.DiGraph) -> list[str]:
    return sorted(
        f"{source} imports {target}"
        for source, target in graph.edges
        if _unit(target) != _unit(source) and _unit(source) != "tools" and _unit(target) not in ALLOWED[_unit(source)]
    )


def _package_cycles(graph: nx.DiGraph) -> list[list[str]]:
    packages = nx.DiGraph()
    packages.add_nodes_from(ALLOWED)
    packages.add_edges_from((_unit(s), _unit(t)) for s, t in graph.edges if _unit(s) != _unit(t))
    return list(nx.simple_cycles(packages))


def test_no_package_imports_outside_its_layers(graph: nx.DiGraph) -> None:
    wrong = _layer_violations(graph)
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_packages(graph: nx.DiGraph) -> None:
    cycles = _package_cycles(graph)
    assert not cycles, cycles


def test_stores_do_not_know_the_connector(graph: nx.DiGraph) -> None:
    wrong = sorted(
        f"{source} imports {target}"
        for source, target in graph.edges
        if source.startswith("deferdump.reference.stores") and not target.startswith(STORES_MAY_IMPORT)
    )
    assert not wrong, "\n".join(wrong)


def test_a_back_edge_is_caught(graph: nx.DiGraph) -> None:
    """The checks are not vacuous: the TLC bridge importing the replay is both a layer breach and a cycle."""
    broken = graph.copy()
    broken.add_edge("deferdump.tools.tlc.bridge", "deferdump.conformance.replay")
    assert _layer_violations(broken) == ["deferdump.tools.tlc.bridge imports deferdump.conformance.replay"]
    assert any(set(cycle) == {"conformance", "tools.tlc"} for cycle in _package_cycles(broken))
