"""Trace generation from a manifest model: TLC's state graph cut into an edge cover, or TLC simulation.

Both modes write one ITF file per trace (Apalache ADR-015, via :mod:`deferdump.tools.tlc.values`). The
trace's ``#meta`` names the model, the mode and the model's constants, so that a replay can pick its
driver and measure coverage against the same state graph without being told anything else.

TLC runs on a copy of the model's cfg without ``SYMMETRY`` (a symmetry-reduced graph joins a state to a
*permutation* of its real successor, so its paths are not behaviours) and without ``PROPERTY`` (liveness
adds nothing to the graph and costs time).
"""
from __future__ import annotations

import json
import logging
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deferdump.tools.tlc.manifest import ModelEntry
from deferdump.tools.tlc.cfg import SECTION_LINE, strip_comments, without_sections
from deferdump.tools.tlc.values import TlaParseError, Value, parse_value, to_itf
from deferdump.tools.tlc.bridge import Status, TlcResult, run_tlc
from deferdump.tools.tlc.output import TlcOutputError, parse_simulation_trace

from deferdump.conformance.cover import edge_cover_paths, path_edges
from deferdump.conformance.errors import TraceGenerationError
from deferdump.conformance.stategraph import StateGraph, StateKey, parse_dot, state_key

__all__ = [
    "GeneratedTraces",
    "MODES",
    "cfg_constants",
    "generate_traces",
    "generation_cfg",
    "model_graph",
    "write_itf",
]

log = logging.getLogger(__name__)

MODES = ("cover", "simulate")
GENERATION_CFG = "deferdump_traces.cfg"
_DROPPED = {"SYMMETRY", "PROPERTY", "PROPERTIES", "VIEW"}
_ASSIGNMENT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.+?)\s*$")


def generation_cfg(cfg_text: str) -> str:
    """The cfg without its SYMMETRY, VIEW and PROPERTY sections (see the module docstring)."""
    return without_sections(cfg_text, _DROPPED)


def cfg_constants(cfg_text: str) -> dict[str, Value]:
    """``Name = value`` assignments of the cfg's CONSTANT(S) sections (``<-`` substitutions skipped)."""
    constants: dict[str, Value] = {}
    section = None
    pending = ""
    for line in strip_comments(cfg_text).splitlines():
        keyword = SECTION_LINE.match(line)
        if keyword:
            section = keyword.group(1)
            line = keyword.group(2)
        if section not in ("CONSTANT", "CONSTANTS") or not line.strip():
            continue
        match = _ASSIGNMENT.match(pending + line if pending else line)
        if match is None or "<-" in line:
            continue
        try:
            constants[match.group(1)] = parse_value(match.group(2))
            pending = ""
        except TlaParseError:
            pending = line  # a value continued on the next line
    return constants


@dataclass
class GeneratedTraces:
    """What ``deferdump traces`` produced (the ``--json`` object)."""

    model: str
    mode: str
    states: int  # cover: distinct states of the graph; simulate: distinct states visited
    edges: int  # cover: edges of the graph; simulate: distinct transitions taken
    covered_edges: int
    files: list[Path] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)  # states per trace
    seconds: float = 0.0

    @property
    def traces(self) -> int:
        return len(self.files)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "mode": self.mode, "traces": self.traces, "states": self.states,
                "edges": self.edges, "covered_edges": self.covered_edges,
                "files": [str(path) for path in self.files],
                "max_trace_states": max(self.lengths, default=0), "total_states": sum(self.lengths),
                "seconds": round(self.seconds, 3)}


def _run(entry: ModelEntry, extra_args: Sequence[str], run_dir: Path, timeout: float | None) -> TlcResult:
    cfg_text = generation_cfg(entry.config_path.read_text(encoding="utf-8"))
    result = run_tlc(entry.module_path, GENERATION_CFG, workers=1, timeout=timeout or entry.timeout,
                     extra_args=extra_args, extra_modules={GENERATION_CFG: cfg_text}, keep_dir=run_dir,
                     expected_states=entry.distinct_states)
    if result.status is not Status.PASS:
        raise TraceGenerationError(
            f"model {entry.name}: TLC did not pass while generating traces ({result.status.value}: "
            f"{result.message or result.kind})")
    return result


_GRAPHS: dict[tuple[str, str, float, float], StateGraph] = {}


def model_graph(entry: ModelEntry, timeout: float | None = None) -> StateGraph:
    """The model's full state graph (cached per module/cfg modification time within the process)."""
    key = (str(entry.module_path), str(entry.config_path), entry.module_path.stat().st_mtime,
           entry.config_path.stat().st_mtime)
    cached = _GRAPHS.get(key)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="deferdump-graph-") as scratch:
        run_dir = Path(scratch) / "run"
        _run(entry, ["-dump", "dot,actionlabels", "graph"], run_dir, timeout)
        dot = run_dir / "graph.dot"
        if not dot.is_file():
            raise TraceGenerationError(f"model {entry.name}: TLC wrote no state graph")
        graph = parse_dot(dot.read_text(encoding="utf-8"), source=dot.name)
    log.info("model %s: state graph of %d states, %d edges", entry.name, graph.num_states, graph.num_edges)
    _GRAPHS[key] = graph
    return graph


ITF_META = {"format": "ITF", "format-description": "https://apalache-mc.org/docs/adr/015adr-trace.html"}


def write_itf(path: Path, states: Sequence[Mapping[str, Value]], meta: Mapping[str, Any],
              encoded: Sequence[Mapping[str, Any]] | None = None) -> None:
    """Write one ITF trace; every state must hold the same variables (the first state's).

    ``encoded`` may give the states already in ITF form (cover traces share states, each encoded once).
    Compact JSON: Python's C encoder only runs without indentation, and the files are for tools.
    """
    names = sorted(states[0])
    if encoded is None:
        encoded = [{name: to_itf(state[name]) for name in names} for state in states]
    for index, state in enumerate(states):
        if sorted(state) != names:
            raise ValueError(f"state {index}: variables {sorted(state)} differ from {names}")
    trace = {"#meta": {**ITF_META, **meta}, "vars": names,
             "states": [{"#meta": {"index": i}, **body} for i, body in enumerate(encoded)]}
    path.write_text(json.dumps(trace, separators=(",", ":")) + "\n", encoding="utf-8")


def _targets(out_dir: Path, entry: ModelEntry, mode: str, count: int) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{entry.name}_{mode}_{i:04d}.itf.json" for i in range(count)]
    clashing = [path.name for path in paths if path.exists()]
    if clashing:
        raise TraceGenerationError(
            f"{out_dir} already holds {clashing[0]} (and {len(clashing) - 1} more): not overwriting; "
            "choose an empty --out directory")
    return paths


def _meta(entry: ModelEntry, mode: str, index: int, count: int, **extra: Any) -> dict[str, Any]:
    constants = _constants(entry.config_path)
    return {"source": "deferdump traces", "model": entry.name, "module": entry.module, "config": entry.config,
            "variant": entry.variant, "mode": mode, "trace": index, "of": count,
            "constants": {name: to_itf(value) for name, value in constants.items()}, **extra}


_CONSTANTS: dict[tuple[str, float], dict[str, Value]] = {}


def _constants(config: Path) -> dict[str, Value]:
    key = (str(config), config.stat().st_mtime)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = cfg_constants(config.read_text(encoding="utf-8"))
    return _CONSTANTS[key]


def generate_traces(entry: ModelEntry, mode: str, out_dir: Path, *, num: int = 20, seed: int = 0,
                    max_len: int | None = None, timeout: float | None = None) -> GeneratedTraces:
    """Generate ``mode`` traces of a manifest model into ``out_dir`` (never overwriting a file)."""
    if mode not in MODES:
        raise TraceGenerationError(f"unknown mode {mode!r} (expected cover or simulate)")
    if num < 1 or (max_len is not None and max_len < 2):
        raise TraceGenerationError("--num must be >= 1 and --max-len >= 2")
    started = time.monotonic()
    if mode == "cover":
        graph = model_graph(entry, timeout)
        paths = edge_cover_paths(graph, max_len)
        targets = _targets(out_dir, entry, mode, len(paths))
        itf: dict[StateKey, dict[str, Any]] = {}
        for key in {key for path in paths for key in path}:
            state = graph.states[key]
            itf[key] = {name: to_itf(state[name]) for name in sorted(state)}
        for index, (path, target) in enumerate(zip(paths, targets)):
            write_itf(target, [graph.states[key] for key in path], _meta(entry, mode, index, len(paths)),
                      [itf[key] for key in path])
        covered = len({edge for path in paths for edge in path_edges(path)})
        return GeneratedTraces(entry.name, mode, graph.num_states, graph.num_edges, covered, targets,
                               [len(path) for path in paths], time.monotonic() - started)
    depth = max_len or 30
    with tempfile.TemporaryDirectory(prefix="deferdump-sim-") as scratch:
        run_dir = Path(scratch) / "run"
        _run(entry, ["-simulate", f"file=trace,num={num}", "-depth", str(depth), "-seed", str(seed)],
             run_dir, timeout)
        produced = sorted(run_dir.glob("trace_*"), key=lambda p: [int(n) for n in p.name.split("_")[1:]])
        try:
            runs = [parse_simulation_trace(path.read_text(encoding="utf-8")) for path in produced]
        except TlcOutputError as error:
            raise TraceGenerationError(f"model {entry.name}: unreadable simulation trace: {error}") from None
    runs = [states for states in runs if states]
    if not runs:
        raise TraceGenerationError(f"model {entry.name}: TLC simulation wrote no traces")
    targets = _targets(out_dir, entry, mode, len(runs))
    for index, (states, target) in enumerate(zip(runs, targets)):
        write_itf(target, states, _meta(entry, mode, index, len(runs), seed=seed, depth=depth))
    keys = [[state_key(state) for state in states] for states in runs]
    visited: set[StateKey] = {key for trace in keys for key in trace}
    taken = {edge for trace in keys for edge in path_edges(trace)}
    return GeneratedTraces(entry.name, mode, len(visited), len(taken), len(taken), targets,
                           [len(states) for states in runs], time.monotonic() - started)


