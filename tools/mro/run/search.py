"""Schedules to run a class through: random behaviours of its case's model, without the invariants.

A counterexample is one schedule, chosen for the labels the reader gave; the class may answer otherwise and
still break elsewhere. So the case's model (the same generated module and cfg, the worst labels) is
sampled: TLC's simulation, with the invariants dropped (a behaviour goes on past a violation of the labels),
seeded so a run repeats. Each behaviour is one vLLM schedule; where the class's answers differ from the
labels' its replay stops (``diverged``), so a behaviour that runs to a hazard is a run of the class itself.
Sampling, not the whole state graph: an edge cover of even the one-group model is 12,389 states and 14,044
paths (64 s of TLC, about 100 s of replays), and the hybrid model's did not finish in a minute. A search
that finds nothing proves nothing (the verdict stays as read).

A behaviour that reaches the spec's ``Idle`` (nothing left to do) stutters there up to the depth, and TLC
writes each stuttering step as a copy of the state before it, ``action`` included. Those copies are no call
vLLM makes: replayed, each would be one more engine step with the last step's records (the same finished
ids handed to ``build_connector_meta`` and reported by ``get_finished`` again), so they are dropped.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from deferdump.reference.errors import DeferDumpError
from deferdump.tools.tlc.bridge import Status, run_tlc
from deferdump.tools.tlc.cfg import without_sections
from deferdump.tools.tlc.output import TlcOutputError, parse_simulation_trace, without_stuttering
from deferdump.tools.tlc.values import to_itf

logger = logging.getLogger(__name__)

__all__ = ["SEARCH_BEHAVIOURS", "SEARCH_DEPTH", "SearchUnavailable", "schedule_traces"]

SEARCH_BEHAVIOURS = 300
SEARCH_DEPTH = 24
_DROPPED = {"INVARIANT", "INVARIANTS", "PROPERTY", "PROPERTIES", "SYMMETRY", "VIEW"}


class SearchUnavailable(DeferDumpError):
    """The case's model could not be sampled (TLC failed or ran out of time)."""


def schedule_traces(model: str, files: dict[str, str], *, num: int = SEARCH_BEHAVIOURS, depth: int = SEARCH_DEPTH,
                    seed: int = 1, timeout: float | None = 120.0) -> list[list[dict[str, Any]]]:
    """``num`` behaviours of the model ``model`` (its module and cfg in ``files``) of at most ``depth``
    states, each as a trace of ``{"state": {"action": ...}}`` (ITF JSON), in TLC's order for ``seed``."""
    from deferdump.tools.tlc.specfiles import spec_dir

    cfg_name = f"{model}.cfg"
    if model not in files or cfg_name not in files:
        raise SearchUnavailable(f"the generated model {model} is not at hand")
    generated = {model: files[model], cfg_name: without_sections(files[cfg_name], _DROPPED)}
    with tempfile.TemporaryDirectory(prefix="deferdump-mro-sim-") as scratch:
        run_dir = Path(scratch) / "run"
        result = run_tlc(spec_dir() / f"{model}.tla", cfg_name, workers=1, timeout=timeout, heap="512m",  # type: ignore[arg-type]
                         extra_args=["-simulate", f"file=trace,num={num}", "-depth", str(depth), "-seed", str(seed)],
                         extra_modules=generated, keep_dir=run_dir)
        if result.status is not Status.PASS:
            raise SearchUnavailable(f"TLC could not sample {model}: {result.status.value}: "
                                    f"{result.message or result.kind}")
        traces = []
        for path in sorted(run_dir.glob("trace_*"), key=lambda p: [int(x) for x in p.name.split("_")[1:]]):
            try:
                states = parse_simulation_trace(path.read_text(encoding="utf-8"))
            except TlcOutputError as error:
                raise SearchUnavailable(f"{path.name}: {error}") from None
            traces.append([{"state": {"action": to_itf(state["action"])}} for state in without_stuttering(states)])
    if not traces:
        raise SearchUnavailable(f"TLC wrote no behaviours of {model}")
    logger.info("%s: %d behaviours sampled", model, len(traces))
    return traces
