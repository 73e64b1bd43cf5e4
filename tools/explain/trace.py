"""A behaviour to explain: steps (action record + variable values) and what TLC said about it.

``deferdump explain`` draws traces from three places (a TLC counterexample, a TLC simulation of a passing
model, an ITF file written by a conformance run); this module turns each into one :class:`ExplainTrace`
so the renderers never care where a trace came from.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deferdump.reference.errors import UserError
from deferdump.tools.tlc.values import ItfTrace, Record, Value
from deferdump.tools.tlc.output import TlcResult, parse_simulation_trace, without_stuttering

ACTION_VARIABLE = "action"
"""The history variable every spec state carries: ``[name |-> method or event, …params]``."""


class ExplainError(UserError):
    """A trace or target that cannot be explained (malformed, empty, unknown model…)."""


@dataclass(frozen=True)
class Step:
    """One state of the behaviour, with the action that produced it."""

    index: int
    action: Record  # always has a "name" field
    values: Mapping[str, Value]  # every variable except the action record

    @property
    def name(self) -> str:
        return str(self.action["name"])


@dataclass(frozen=True)
class ExplainTrace:
    """Everything the page shows: the model, the verdict and the steps."""

    model: str
    variant: str | None
    steps: tuple[Step, ...]
    property_name: str | None = None  # the violated property; None when the trace violates nothing known to TLC
    kind: str | None = None  # "invariant", "liveness", "deadlock"…; None for a passing model's trace
    passes: bool = False  # the model passed TLC; the trace is a representative run
    loop_index: int | None = None  # lasso: the step the last step loops back to
    source: str = ""  # where the trace came from, one line

    def __post_init__(self) -> None:
        if not self.steps:
            raise ExplainError(f"{self.model}: the trace has no states")
        if self.loop_index is not None and not 0 <= self.loop_index < len(self.steps):
            raise ExplainError(f"{self.model}: loop index {self.loop_index} outside the {len(self.steps)} states")

    @property
    def variables(self) -> tuple[str, ...]:
        names: dict[str, None] = {}
        for step in self.steps:
            names.update(dict.fromkeys(step.values))
        return tuple(names)


def _action_record(values: Mapping[str, Value], fallback: str | None, index: int) -> Record:
    """The state's ``action`` record, or one built from TLC's operator name when the spec has none."""
    action = values.get(ACTION_VARIABLE)
    if isinstance(action, Mapping) and isinstance(action.get("name"), str):
        return action if isinstance(action, Record) else Record(action)
    return Record(name=fallback or ("init" if index == 0 else "step"))


def make_steps(states: Sequence[Mapping[str, Value]], names: Sequence[str | None] = ()) -> tuple[Step, ...]:
    """Steps from state dicts; ``names`` are TLC's operator names (used only when a state has no action)."""
    steps = []
    for index, values in enumerate(states):
        fallback = names[index] if index < len(names) else None
        rest = {name: value for name, value in values.items() if name != ACTION_VARIABLE}
        steps.append(Step(index=index, action=_action_record(values, fallback, index), values=rest))
    return tuple(steps)


def from_tlc_result(result: TlcResult, *, model: str, variant: str | None) -> ExplainTrace:
    """A TLC counterexample (its last state breaks the property; a lasso loops back to ``loop_index``)."""
    if not result.trace:
        raise ExplainError(f"{model}: TLC reported {result.status.value} with no trace"
                           + (f" ({result.message})" if result.message else ""))
    steps = make_steps([state.values for state in result.trace], [state.action for state in result.trace])
    loop = result.loop_index
    if result.stuttering:
        loop = len(steps) - 1  # ends stuttering: the last state repeats forever
    return ExplainTrace(model=model, variant=variant, steps=steps, property_name=result.property,
                        kind=None if result.kind is None else result.kind.value, passes=False,
                        loop_index=loop, source=f"TLC counterexample ({result.distinct_states} distinct states)")


def from_itf(trace: ItfTrace, *, model: str | None = None, variant: str | None = None) -> ExplainTrace:
    """An ITF trace (a conformance run or a saved counterexample); ``#meta`` may name model and variant."""
    meta = trace.meta
    label = model or _meta_text(meta, "model") or _meta_text(meta, "name") or (
        trace.path.name if trace.path is not None else "ITF trace")
    prop = _meta_text(meta, "property")
    return ExplainTrace(model=label, variant=variant or _meta_text(meta, "variant"),
                        steps=make_steps(list(trace.states)), property_name=prop,
                        kind=_meta_text(meta, "kind") or ("invariant" if prop else None),
                        passes=False, loop_index=trace.loop,
                        source=f"ITF file {trace.path}" if trace.path is not None else "ITF trace")


def _meta_text(meta: Mapping[str, object], key: str) -> str | None:
    value = meta.get(key)
    return value if isinstance(value, str) and value else None


def parse_simulation_file(text: str) -> list[dict[str, Value]]:
    """States of a TLC ``-simulate file=…`` module, repeated states dropped: a timeline column for a stutter
    (the spec's ``Idle``) would show nothing happening."""
    return without_stuttering(parse_simulation_trace(text))
