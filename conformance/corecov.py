"""Branch coverage of the reference connector's protocol core, reached by conformance replay alone.

"Protocol core" is the deferred-dump mechanism (UCM PR #989) in ``reference/connectors.py``: tracking
in ``build_connector_meta``, ``request_finished(_all_groups)``, ``handle_preemptions``, the save path
(``save_kv_layer``, ``wait_for_save``, submit, poll, flush, wait, event release), ``get_finished``, and
the wrapper's forwarding of all of them. Loads, registration, shutdown, metrics and dump verification
are outside the model and not counted. Measured with coverage.py (branch mode) over exactly the lines
of those functions. The asynchronous-load branches inside them (``build_connector_meta`` sending a parked
request's load, ``request_finished`` of a request whose load runs) are counted: the conformance model
``AsyncLoadConformance`` (move ``async_loads``) replays them.
"""
from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import coverage

from deferdump.reference import connectors
from deferdump.reference.class_names import BY_VARIANT, OUTER

__all__ = ["CORE_BRANCH_TARGET", "CORE_FUNCTIONS", "CoreCoverage", "core_for_variants", "measure_core_coverage"]

T = TypeVar("T")

CORE_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "DirectConnector": (
        "build_connector_meta", "_track_async_dump_requests", "request_finished", "request_finished_all_groups",
        "bind_connector_metadata", "clear_connector_metadata", "_dumping_requests", "_track_bound_dump_requests",
        "_dumps_on_this_rank", "handle_preemptions", "wait_for_save", "_submit_dump",
        "_release_dump_event_handle", "_wait_pending_dump_task", "_poll_pending_dump_tasks",
        "_flush_pending_dump_tasks", "get_finished",
    ),
    "LayerWiseConnector": ("save_kv_layer", "wait_for_save", "clear_connector_metadata"),
    "CPConnector": ("bind_connector_metadata", "save_kv_layer", "wait_for_save"),
    "OuterConnector": (
        "build_connector_meta", "request_finished", "request_finished_all_groups", "bind_connector_metadata",
        "clear_connector_metadata", "handle_preemptions", "save_kv_layer", "wait_for_save", "get_finished",
    ),
}
"""Class -> methods counted as the protocol core (see the module docstring)."""

CORE_BRANCH_TARGET = 0.95
"""Share of the core's branches the shipped conformance models' edge covers must reach (`deferdump verify`
fails below it; the arcs left are named in docs/conformance.md)."""


def core_for_variants(variants: set[str] | frozenset[str]) -> dict[str, tuple[str, ...]]:
    """The core of the connector classes that the given variants (``direct``/``layerwise``/``cp``) run,
    plus the wrapper: a class no replayed model instantiates cannot be reached by conformance."""
    classes = {OUTER.reference}.union(*(BY_VARIANT[v].mro for v in variants if v in BY_VARIANT))
    return {name: methods for name, methods in CORE_FUNCTIONS.items() if name in classes}


@dataclass
class CoreCoverage:
    """Line and branch coverage of the protocol core."""

    statements: int
    covered_statements: int
    branches: int
    covered_branches: int
    missed: list[str] = field(default_factory=list)  # "Class.method: line N -> M" for missed branches/lines
    classes: list[str] = field(default_factory=list)  # the connector classes counted

    @property
    def branch_coverage(self) -> float | None:
        return None if self.branches == 0 else self.covered_branches / self.branches

    @property
    def line_coverage(self) -> float | None:
        return None if self.statements == 0 else self.covered_statements / self.statements

    def to_json(self) -> dict[str, Any]:
        return {"statements": self.statements, "covered_statements": self.covered_statements,
                "line_coverage": None if self.line_coverage is None else round(self.line_coverage, 4),
                "branches": self.branches, "covered_branches": self.covered_branches,
                "branch_coverage": None if self.branch_coverage is None else round(self.branch_coverage, 4),
                "classes": self.classes, "missed": self.missed}


def _core_ranges(source_path: Path, core: dict[str, tuple[str, ...]]) -> dict[str, tuple[int, int]]:
    """``Class.method`` -> (first body line, last line) in the module source."""
    tree = ast.parse(source_path.read_text(encoding="utf-8"))
    ranges: dict[str, tuple[int, int]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in core:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in core[node.name]:
                    assert item.end_lineno is not None
                    # from the first body statement: the def line itself ran at import time
                    ranges[f"{node.name}.{item.name}"] = (item.body[0].lineno, item.end_lineno)
    return ranges


def measure_core_coverage(run: Callable[[], T],
                          core: dict[str, tuple[str, ...]] = CORE_FUNCTIONS) -> tuple[T, CoreCoverage]:
    """Run ``run()`` under coverage.py and return its result and the protocol core's coverage."""
    source = Path(inspect.getsourcefile(connectors) or connectors.__file__).resolve()
    cov = coverage.Coverage(branch=True, data_file=None, include=[str(source)], config_file=False)
    cov.start()
    try:
        result = run()
    finally:
        cov.stop()
    analysis = cov._analyze(str(source))  # coverage.py's Analysis: statements, arcs, missing branches
    ranges = _core_ranges(source, core)

    def owner(line: int) -> str | None:
        for name, (first, last) in ranges.items():
            if first <= line <= last:
                return name
        return None

    statements = {line for line in analysis.statements if owner(line)}
    missing = {line for line in analysis.missing if owner(line)}
    missing_arcs = analysis.missing_branch_arcs()
    branch_lines = {line for line in analysis._branch_lines() if owner(line)}
    possible = {arc for arc in analysis.arc_possibilities if arc[0] in branch_lines}
    branches = len(possible)
    missed_branches = [(line, target) for line, targets in missing_arcs.items() if line in branch_lines
                       for target in targets]
    missed = [f"{owner(line)}: line {line} not run" for line in sorted(missing)]
    missed += [f"{owner(line)}: branch {line} -> {'exit' if target < 0 else target} not taken"
               for line, target in sorted(missed_branches) if line not in missing]
    covered_branches = branches - len(missed_branches)
    return result, CoreCoverage(len(statements), len(statements) - len(missing), branches, covered_branches, missed,
                                sorted(core))
