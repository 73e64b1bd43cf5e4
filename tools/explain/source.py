"""Where ``deferdump explain`` gets its trace: an ITF file, or a manifest model checked by TLC.

For a model, TLC's counterexample is the trace. When the model passes, a short TLC simulation supplies a
representative run instead: a few random behaviours (fixed seed, so the page is reproducible) and the
one that shows the most different actions.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from deferdump.tools.explain.binding import binding_for
from deferdump.tools.explain.timeline import Timeline, build_timeline
from deferdump.tools.explain.trace import ExplainError, ExplainTrace, from_itf, from_tlc_result, make_steps, parse_simulation_file
from deferdump.tools.tlc.manifest import ModelEntry, UnknownModel, load_manifest
from deferdump.tools.tlc.cfg import without_sections
from deferdump.tools.tlc.values import load_itf
from deferdump.tools.tlc.bridge import Status, run_tlc

log = logging.getLogger(__name__)

SIMULATION_DEPTH = 30
SIMULATION_RUNS = 8
SIMULATION_SEED = 1


def is_trace_file(target: str) -> bool:
    """A path to a file, or a name that can only be one (``.json``), as opposed to a model name."""
    return Path(target).is_file() or target.endswith(".json") or "/" in target


def trace_from_file(path: Path) -> ExplainTrace:
    """An ITF file, validated by the bridge's ``load_itf`` (:class:`ItfError` names file, state and path)."""
    itf = load_itf(path)
    if not itf.states:
        raise ExplainError(f"{path}: the ITF trace has no states")
    return from_itf(itf)


_DROPPED = {"PROPERTY", "PROPERTIES", "SYMMETRY"}
SIMULATION_CFG = "deferdump_explain_simulation.cfg"


def simulation_cfg(cfg_text: str) -> str:
    """The cfg without PROPERTY and SYMMETRY sections: TLC checks temporal properties on each finite
    simulated behaviour and reports spurious violations, and a run needs no symmetry reduction."""
    return without_sections(cfg_text, _DROPPED)


def _score(states: list[dict[str, object]]) -> tuple[int, int]:
    steps = make_steps(states)
    return len({step.name for step in steps}), -len(steps)


def simulate(entry: ModelEntry, *, depth: int = SIMULATION_DEPTH, seed: int = SIMULATION_SEED,
             runs: int = SIMULATION_RUNS, timeout: float | None = None) -> ExplainTrace:
    """A representative behaviour of a passing model from ``runs`` TLC simulations of ``depth`` steps."""
    with tempfile.TemporaryDirectory(prefix="deferdump-explain-") as scratch:
        run_dir = Path(scratch) / "run"
        cfg = simulation_cfg(entry.config_path.read_text(encoding="utf-8"))
        result = run_tlc(entry.module_path, Path(SIMULATION_CFG), workers=1, timeout=timeout, keep_dir=run_dir,
                         extra_modules={SIMULATION_CFG: cfg}, extra_args=["-simulate", f"file=sim,num={runs}", "-depth", str(depth), "-seed", str(seed)],
                         expected_states=runs * depth)  # a simulation visits at most runs x depth states
        if result.status is Status.VIOLATION:
            raise ExplainError(f"{entry.name}: TLC simulation found a violation of {result.property or 'a property'}"
                               " that model checking did not; run deferdump check " + entry.name)
        files = sorted(run_dir.glob("sim_*"))
        if result.status is Status.ERROR or not files:
            raise ExplainError(f"{entry.name}: TLC simulation gave no trace"
                               + (f" ({result.message})" if result.message else ""))
        traces = [parse_simulation_file(file.read_text(encoding="utf-8")) for file in files]
    best = max((states for states in traces if states), key=_score)
    return ExplainTrace(model=entry.name, variant=entry.variant, steps=make_steps(best), passes=True,
                        source=f"TLC simulation, seed {seed}, the most varied of {len(traces)} runs of "
                               f"up to {depth} steps")


def trace_from_model(entry: ModelEntry, *, timeout: float | None = None, depth: int = SIMULATION_DEPTH,
                     seed: int = SIMULATION_SEED) -> ExplainTrace:
    """TLC's counterexample for the model, or a representative run when it passes."""
    result = run_tlc(entry.module_path, entry.config_path, workers=1,
                     timeout=timeout if timeout is not None else entry.timeout, expected_states=entry.distinct_states)
    if result.status is Status.VIOLATION:
        return from_tlc_result(result, model=entry.name, variant=entry.variant)
    if result.status is Status.ERROR:
        kind = result.kind.value if result.kind else "error"
        raise ExplainError(f"{entry.name}: TLC {kind}: {result.message or 'no message'}")
    log.info("%s passes (%s distinct states); simulating a representative trace", entry.name,
             result.distinct_states)
    return simulate(entry, depth=depth, seed=seed, timeout=timeout if timeout is not None else entry.timeout)


def load_target(target: str, *, manifest: Path | None = None, timeout: float | None = None,
                depth: int = SIMULATION_DEPTH, seed: int = SIMULATION_SEED) -> ExplainTrace:
    """TARGET as the CLI takes it: an ITF trace file, or the name of a model in the manifest."""
    if is_trace_file(target):
        return trace_from_file(Path(target))
    loaded = load_manifest(manifest)
    try:
        entry = loaded.get(target)
    except UnknownModel as error:
        raise ExplainError(f"{target!r} is not a trace file, and {error}") from None
    return trace_from_model(entry, timeout=timeout, depth=depth, seed=seed)


def timeline_for(trace: ExplainTrace) -> Timeline:
    """The swimlane timeline of a trace, drawn with the model's lane binding (or one lane per variable)."""
    return build_timeline(trace, binding_for(trace.variables))
