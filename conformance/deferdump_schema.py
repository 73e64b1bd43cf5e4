"""The DeferDump model's trace schema: its variables, actions and constants (what a replay reads from a trace).

Kept apart from the driver, which builds the reference connector (and so loads torch): a bad trace is refused
from this module alone, in a fraction of a second.
"""
from __future__ import annotations

from dataclasses import dataclass

from deferdump.reference.class_names import BY_UCM
from deferdump.tools.tlc.values import ItfError, ItfTrace, ModelValue, Value, from_itf

from deferdump.conformance.profiles import ImplProfile

__all__ = ["ACTIONS", "DEFERDUMP_VARS", "HYBRID_FENCE_OF_MODULE", "INNER_VARIANTS", "ModelConstants",
           "model_name", "observed_variables"]

# The connector's `hybrid_fence` for each spec module's handle_preemptions label (Connectors.tla):
# "wait_freed" (MCSlidingWindowFenced), "wait_all_on_free" (MCSlidingWindowDrain); the merged table's
# "wait_preempted" (MCReal and the other mutants) is #989 as merged, "none".
HYBRID_FENCE_OF_MODULE = {"MCSlidingWindowFenced": "freed", "MCSlidingWindowDrain": "all_on_free"}
DEFERDUMP_VARS = frozenset({"schedAsync", "workerAsync", "pending", "live", "reqState", "blocksOf", "finishedIds"})
ACTIONS = frozenset({"init", "schedule", "execute_model", "update_from_output", "engine_step", "task_complete",
                     "shutdown", "finish_requests", "load_complete"})
INNER_VARIANTS = {ucm: names.variant for ucm, names in BY_UCM.items()}  # the model's inner class -> config variant


def model_name(value: Value) -> str:
    """A model value's name (a plain string stays as it is)."""
    return value.name if isinstance(value, ModelValue) else str(value)


@dataclass(frozen=True)
class ModelConstants:
    """The model constants a replay needs (from the trace's ``#meta.constants``)."""

    requests: tuple[str, ...]
    blocks: tuple[str, ...]
    ranks: tuple[int, ...]  # the model's rank values, Rank0 first (it is the implementation's rank 0)
    prompt_blocks: int
    layers: int
    variant: str
    wrapper: bool
    hma: bool
    multi: bool
    mla: bool
    store_hits: bool = False  # StoreHits: a lookup may hit the whole prompt
    short_reqs: frozenset[str] = frozenset()  # ShortReqs: one-token prompts (no full block)
    hybrid: bool = False  # Hybrid: a full-attention and a sliding-window KV-cache group
    hybrid_fence: str = "none"  # the connector's fence for the trace's spec module (HYBRID_FENCE_OF_MODULE)
    async_loads: bool = False  # move "async_loads": every hit is loaded asynchronously (config `load_async`)

    def need_blocks(self, req: str) -> int:
        """Blocks the request's prompt occupies (the model's NeedBlocks)."""
        return 1 if req in self.short_reqs else self.prompt_blocks

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    @classmethod
    def from_trace(cls, trace: ItfTrace) -> "ModelConstants":
        raw = trace.meta.get("constants")
        if not isinstance(raw, dict):
            raise ItfError("'#meta.constants' (the model's constants) is missing", json_path='$["#meta"]',
                           file=trace.path)
        values: dict[str, Value] = {}
        if "Rank" in raw:  # Rank (a set of integers) and Rank0; older models: NumRanks (ranks 0..n-1)
            rank_names: tuple[str, ...] = ("Rank", "Rank0")
        else:
            rank_names = ("NumRanks",)
        for name in ("Req", "Block", *rank_names, "PromptBlocks", "Layers", "InnerClass", "Wrapper", "HMA",
                     "Multi", "MLA"):
            where = f'$["#meta"].constants.{name}'
            if name not in raw:
                raise ItfError(f"constant {name} is missing", json_path=where, file=trace.path)
            try:
                values[name] = from_itf(raw[name], where)
            except ItfError as error:
                raise ItfError(error.problem, json_path=error.json_path, file=trace.path) from None
        inner = values["InnerClass"]
        if inner not in INNER_VARIANTS:
            raise ItfError(f"InnerClass {inner!r} has no reference connector", json_path='$["#meta"].constants',
                           file=trace.path)
        for name in ("StoreHits", "ShortReqs", "Hybrid", "Moves"):  # optional: older traces predate them
            if name in raw:
                where = f'$["#meta"].constants.{name}'
                try:
                    values[name] = from_itf(raw[name], where)
                except ItfError as error:
                    raise ItfError(error.problem, json_path=error.json_path, file=trace.path) from None
        if "Rank" in values:
            rank0 = int(values["Rank0"])
            ranks = (rank0, *sorted(int(w) for w in values["Rank"] if int(w) != rank0))
        else:
            ranks = tuple(range(int(values["NumRanks"])))
        return cls(
            requests=tuple(sorted(model_name(v) for v in values["Req"])),
            blocks=tuple(sorted(model_name(v) for v in values["Block"])),
            ranks=ranks, prompt_blocks=int(values["PromptBlocks"]),
            layers=int(values["Layers"]), variant=INNER_VARIANTS[inner], wrapper=bool(values["Wrapper"]),
            hma=bool(values["HMA"]), multi=bool(values["Multi"]), mla=bool(values["MLA"]),
            store_hits=bool(values.get("StoreHits", False)),
            short_reqs=frozenset(model_name(v) for v in values.get("ShortReqs", ())),
            hybrid=bool(values.get("Hybrid", False)),
            hybrid_fence=HYBRID_FENCE_OF_MODULE.get(str(trace.meta.get("module", "")), "none"),
            async_loads="async_loads" in {model_name(v) for v in values.get("Moves", ())},
        )


def observed_variables(constants: ModelConstants, profile: ImplProfile) -> tuple[str, ...]:
    """The model variables a replay compares with the implementation's state."""
    observed = ["schedAsync", "workerAsync", "pending"]
    if profile.observes_events:
        observed.append("live")
    if not constants.multi:
        observed.append("reported")
    if constants.async_loads:  # each rank's load tasks and the requests it will report in finished_recving
        observed += ["loadTasks", "workerRecv"]
    return tuple(observed)
