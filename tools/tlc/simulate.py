"""TLC's random simulation of models beyond exhaustive reach, in repeatable batches of behaviours.

TLC 2.15's ``-simulate`` counts neither the behaviours it generated nor distinct states (its statistics
print ``-1``), and a correct spec without ``num=`` runs forever. So a simulation here is a sequence of
batches, each one TLC run of ``-simulate num=B -depth D -seed S_i`` with one worker (one worker makes a
seed's traces identical run to run): the behaviours are counted exactly (``B`` per finished batch), the
batch seeds are derived from the one seed given, so the same seed replays the same batches and finds the
same counterexample, batch ``i``'s depth follows a ruler sequence up to the depth given (8, 16, 8, 32, 8,
16, 8, 64, ...: half the batches at the shortest depth; see :func:`batch_depth`), and the batches of one
simulation can be spread over machines (``shard``: batch ``i`` belongs to shard ``i mod N``). A time budget
stops the simulation; the batch it interrupts is discarded and not counted. A simulation that finds nothing
reports ``pass``: no violation in so many behaviours, not a proof. The model's SYMMETRY is left out
(:func:`simulation_config`): a simulation merges no states, so symmetry only costs.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deferdump.reference.errors import UserError
from deferdump.tools.tlc.bridge import Kind, Progress, Status, TlcResult, run_tlc
from deferdump.tools.tlc.cfg import SECTION_LINE, strip_comments, without_sections
from deferdump.tools.tlc.shard import Shard

logger = logging.getLogger(__name__)

__all__ = ["BATCH_BEHAVIOURS", "DEFAULT_DEPTH", "LADDER_FLOOR", "Shard", "SimulationPlan", "SimulationStats",
           "batch_depth", "batch_seed", "simulate", "simulation_config"]

BATCH_BEHAVIOURS = 500
"""Behaviours per TLC run: large enough that the JVM start (about 1 s) is a small share of a batch."""

DEFAULT_DEPTH = 100
"""TLC's own default trace depth."""

LADDER_FLOOR = 8
"""The shortest batch depth of the ladder: the manifest mutants' counterexamples are 2 to 13 states long."""

_SEED_MASK = (1 << 62) - 1


class SimulationUsageError(UserError):
    """Simulation settings that cannot work (no bound, a zero depth, a seed out of range)."""


@dataclass(frozen=True)
class SimulationPlan:
    """What to simulate: trace depth, the seed, how many behaviours or how long, and which shard."""

    depth: int = DEFAULT_DEPTH
    seed: int = 0
    num: int | None = None  # behaviours in all (over every shard); None: until the time budget
    time_budget: float | None = None  # seconds, per shard
    batch: int = BATCH_BEHAVIOURS
    shard: Shard = Shard()
    ladder: bool = True  # batch depths climb a ruler sequence up to ``depth``; False: every batch at ``depth``

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise SimulationUsageError(f"depth must be at least 1, not {self.depth}")
        if self.num is None and self.time_budget is None:
            raise SimulationUsageError("a simulation needs --num or --time-budget (TLC would run forever)")
        if self.num is not None and self.num < 1:
            raise SimulationUsageError(f"num must be at least 1, not {self.num}")
        if self.time_budget is not None and self.time_budget <= 0:
            raise SimulationUsageError(f"time budget must be positive, not {self.time_budget}")
        if self.batch < 1:
            raise SimulationUsageError(f"batch must be at least 1, not {self.batch}")
        if not 0 <= self.seed <= _SEED_MASK:
            raise SimulationUsageError(f"seed must be in 0..{_SEED_MASK}, not {self.seed}")

    def batches(self) -> Iterator[tuple[int, int]]:
        """(global batch index, behaviours) of this shard's batches, in order; endless without ``num``."""
        index = self.shard.index - 1
        total = None if self.num is None else math.ceil(self.num / self.batch)
        while total is None or index < total:
            size = self.batch if self.num is None else min(self.batch, self.num - index * self.batch)
            yield index, size
            index += self.shard.count


@dataclass(frozen=True)
class SimulationStats:
    """What a simulation explored: the figures ``deferdump check --simulate --json`` adds to a result."""

    seed: int
    depth: int
    behaviours: int  # behaviours of the finished batches (an interrupted batch is not counted)
    batches: int
    shard: Shard
    budget_spent: bool  # the time budget stopped it (rather than ``num`` or a violation)
    batch_seed: int | None = None  # the seed of the batch whose result is reported (a violation's replays it)
    batch_index: int | None = None  # that batch's place in the simulation's sequence of batches
    ladder: bool = True  # batch depths climbed the ruler sequence (False: every batch at ``depth``)
    requests: int | None = None  # the model was grown to this many requests (``--requests``); None: its own cfg
    batch: int = BATCH_BEHAVIOURS  # behaviours per batch (shards of one simulation must agree on it)

    @property
    def batch_depth(self) -> int | None:
        """The reported batch's TLC ``-depth``: with ``batch_seed``, what replays its counterexample."""
        return None if self.batch_index is None else batch_depth(self.depth, self.batch_index, self.ladder)

    def to_json(self) -> dict[str, Any]:
        return {"mode": "simulate", "seed": self.seed, "depth_bound": self.depth, "behaviours": self.behaviours,
                "batches": self.batches, "shard": str(self.shard), "budget_spent": self.budget_spent,
                "batch_seed": self.batch_seed, "batch_index": self.batch_index, "batch_depth": self.batch_depth,
                "ladder": self.ladder, "requests": self.requests, "batch": self.batch}


def batch_seed(seed: int, index: int) -> int:
    """The TLC seed of batch ``index``: the seed itself for batch 0, then a pseudo-random derivation
    (distinct batches must not replay each other's traces, and the mapping must never change)."""
    if index == 0:
        return seed
    return random.Random(f"deferdump-sim:{seed}:{index}").getrandbits(62) & _SEED_MASK


def batch_depth(depth: int, index: int, ladder: bool = True) -> int:
    """TLC's ``-depth`` for batch ``index``: with the ladder, ``LADDER_FLOOR * 2**k`` capped at ``depth``,
    where ``2**k`` is the largest power of two dividing ``index + 1`` (the ruler sequence 8, 16, 8, 32, 8, 16,
    8, 64, ...). A random walk's successors are all computed at every state, so a behaviour costs about its
    depth: each depth of the ladder gets about the same time, and a shallow violation, which a long walk
    usually wanders past, gets half the batches (Luby, Sinclair and Zuckerman's universal restart schedule).
    Every batch is a run of the spec, so the ladder never reports what a fixed depth could not."""
    if not ladder:
        return depth
    index += 1
    return min(depth, LADDER_FLOOR * (index & -index))


def simulation_config(spec: Path, config: Path | str | None,
                      extra_modules: Mapping[str, str]) -> tuple[Path | str | None, dict[str, str]]:
    """The cfg a simulation runs, and the generated files with it: the model's cfg without its SYMMETRY.

    TLC fingerprints every state it generates, in simulation too, and under SYMMETRY a fingerprint is the
    least over every permutation of the symmetry sets: 30,240 at 3 requests and 7 blocks, seconds a state.
    A simulation keeps no set of states for symmetry to shrink, and its invariants hold or fail alike in
    symmetric states, so leaving SYMMETRY out loses nothing. A cfg without it is returned as it came.
    """
    modules = dict(extra_modules)
    name = None if config is None else Path(config).name
    if name is not None and name in modules:
        text = modules[name]
    else:
        text = Path(config if config is not None else Path(spec).with_suffix(".cfg")).read_text(encoding="utf-8")
    if not any((section := SECTION_LINE.match(line)) and section.group(1) == "SYMMETRY"
               for line in strip_comments(text).splitlines()):
        return config, modules
    stem = Path(name).stem if name is not None else Path(spec).stem
    generated = f"{stem}_nosymmetry.cfg"
    modules[generated] = without_sections(text, {"SYMMETRY"})
    return generated, modules


def simulate(spec: Path, config: Path | str | None, plan: SimulationPlan, *,
             extra_modules: Mapping[str, str] = {},  # noqa: B006 - read only
             progress: Callable[[Progress], None] | None = None,
             cancel: threading.Event | None = None) -> tuple[TlcResult, SimulationStats]:
    """Run the plan's batches until ``num`` behaviours, the time budget, a violation or an error.

    The result is the violating (or failing) batch's, with ``generated_states`` summed over the batches,
    ``seconds`` the whole simulation's wall time and ``distinct_states`` None (TLC does not count them).
    TLC's "states generated" of a batch stopped by a violation depends on timing (its last progress
    report), so only the verdict, the trace and the behaviour counts repeat exactly for a seed.
    TLC 2.15 prints that count only from its progress-report thread, which misses a batch that ends before
    the thread first runs (``Simulator.simulate`` clears ``isRunning`` before the thread's loop test): then
    the sum would be short, and ``generated_states`` is None (unknown) instead.
    """
    config, extra_modules = simulation_config(spec, config, extra_modules)
    started = time.monotonic()
    deadline = None if plan.time_budget is None else started + plan.time_budget
    behaviours = generated = batches = 0
    uncounted = 0  # batches whose TLC printed no "states generated"
    last: TlcResult | None = None
    interrupted: tuple[TlcResult, int, int] | None = None  # the batch the budget stopped: result, seed, index
    last_seed: int | None = None
    last_index: int | None = None
    budget_spent = False
    for index, size in plan.batches():
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            budget_spent = True
            break
        seed = batch_seed(plan.seed, index)
        depth = batch_depth(plan.depth, index, plan.ladder)
        result = run_tlc(spec, config, workers=1, timeout=remaining, extra_modules=extra_modules,
                         extra_args=["-simulate", f"num={size}", "-depth", str(depth), "-seed", str(seed)],
                         progress=progress, cancel=cancel)
        if result.kind is Kind.TIMEOUT:  # the only timeout given is the budget's: the batch is discarded
            budget_spent, interrupted = True, (result, seed, index)
            break
        last, last_seed, last_index = result, seed, index
        if result.generated_states is None:
            uncounted += 1
        else:
            generated += result.generated_states
        if result.status is not Status.PASS:
            break
        behaviours += size
        batches += 1
    if last is None and not budget_spent:
        raise SimulationUsageError(f"shard {plan.shard} has no batch: {plan.num} behaviours make "
                                   f"{math.ceil((plan.num or 0) / plan.batch)} batch(es) of {plan.batch}, "
                                   "fewer than the shards")
    seconds = time.monotonic() - started
    if last is None:
        # Nothing was simulated: an error of this model (never a pass), and the other models of a run go on.
        message = (f"the time budget ({plan.time_budget:g} s) ended before a first batch of {plan.batch} "
                   "behaviours finished: no verdict (give a larger --time-budget or a smaller --batch)")
        if interrupted is None:
            raise SimulationUsageError(message)
        stopped, stopped_seed, stopped_index = interrupted
        result = dataclasses.replace(stopped, status=Status.ERROR, kind=Kind.TIMEOUT, distinct_states=None,
                                     generated_states=None, seconds=seconds, message=message)
        return result, SimulationStats(seed=plan.seed, depth=plan.depth, behaviours=0, batches=0, shard=plan.shard,
                                       budget_spent=True, batch_seed=stopped_seed, batch_index=stopped_index,
                                       ladder=plan.ladder, batch=plan.batch)
    message = last.message
    if last.status is Status.PASS:
        message = f"no violation in {behaviours:,} behaviours of depth <= {plan.depth} (seed {plan.seed})"
    if uncounted:
        logger.warning("TLC reported no generated-state count for %d of the simulation's batches: "
                       "the count is unknown", uncounted)
    result = dataclasses.replace(last, distinct_states=None, generated_states=None if uncounted else generated,
                                 seconds=seconds,
                                 message=message)
    stats = SimulationStats(seed=plan.seed, depth=plan.depth, behaviours=behaviours, batches=batches,
                            shard=plan.shard, budget_spent=budget_spent, batch_seed=last_seed,
                            batch_index=last_index, ladder=plan.ladder, batch=plan.batch)
    return result, stats
