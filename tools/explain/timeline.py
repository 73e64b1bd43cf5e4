"""The swimlane timeline of a trace: columns (steps) x lanes, built from a declarative lane binding.

A :class:`LaneBinding` says which lanes a model has (groups of lanes keyed by e.g. request or rank), what
each lane's cell shows at a step, how to label a step's action, and how to find the values that break
each property. The engine here knows nothing about any model: it evaluates the binding over the trace,
marks cells that changed, places the violation marker and the lasso loop, and hands a
:class:`Timeline` to the renderers (HTML/SVG, terminal). A model change is a fix in the binding only.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from deferdump.tools.explain.trace import ExplainTrace, Step
from deferdump.tools.tlc.values import ModelValue, Unserializable, Value

# --------------------------------------------------------------------------------------------
# What a binding declares
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """What one lane shows at one step: a few short lines, a tone (a CSS class) and a tooltip."""

    lines: tuple[str, ...]
    tone: str = ""
    hint: str = ""


@dataclass(frozen=True)
class LaneGroup:
    """A family of lanes: one per key (request, block, rank…) found in any state of the trace."""

    title: str
    keys: Callable[[Step], Iterable[Value]]
    label: Callable[[Value], str]
    cell: Callable[[Value, Sequence[Step], int], Cell]  # (key, all steps, step index): cells may read history


@dataclass(frozen=True)
class Offence:
    """One offending value of a broken property, and the lanes (by :func:`lane_id`) it concerns."""

    text: str
    lanes: frozenset[str] = frozenset()


Invariant = Callable[[Sequence[Step], int], list[Offence]]
"""Offences of a state property at step ``i`` (empty: it holds there)."""
Liveness = Callable[[Sequence[Step], int], list[Offence]]
"""Offences of a leads-to property on a lasso whose loop starts at the given step."""


@dataclass(frozen=True)
class ActionLabel:
    """A step's column header: the method/event name and its parameters, one short line each."""

    name: str
    params: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaneBinding:
    """How to draw one model: its lane groups, action labels and property evaluators."""

    name: str
    required: frozenset[str]  # variables the binding reads; a trace without them gets the generic binding
    groups: tuple[LaneGroup, ...]
    describe_action: Callable[[Mapping[str, Value]], ActionLabel]
    invariants: Mapping[str, Invariant] = field(default_factory=dict)
    liveness: Mapping[str, Liveness] = field(default_factory=dict)
    tones: Mapping[str, str] = field(default_factory=dict)  # tone -> legend text


def lane_id(group: str, label: str) -> str:
    """The identity of a lane, used by offences to point at the lanes they concern."""
    return f"{group}/{label}"


# --------------------------------------------------------------------------------------------
# Compact value text
# --------------------------------------------------------------------------------------------


def show(value: Value) -> str:
    """Short, TLA+-free text for a value: ``{r1, r2}``, ``∅``, ``⟨b1, b2⟩``, ``[id: 1, …]``."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, str)):
        return str(value)
    if isinstance(value, ModelValue):
        return value.name
    if isinstance(value, Unserializable):
        return value.text
    if isinstance(value, tuple):
        return "⟨" + ", ".join(show(item) for item in value) + "⟩" if value else "⟨⟩"
    if isinstance(value, Mapping):
        if not value:
            return "⟨⟩"
        return "[" + ", ".join(f"{show(k)}: {show(v)}" for k, v in sorted(value.items(), key=_by_text)) + "]"
    if isinstance(value, Iterable):
        items = sorted((show(item) for item in value), key=natural_key)
        return "{" + ", ".join(items) + "}" if items else "∅"
    return repr(value)


def _by_text(pair: tuple[Value, Value]) -> tuple[object, ...]:
    return natural_key(show(pair[0]))


def natural_key(text: str) -> tuple[object, ...]:
    """Sort key that puts r2 before r10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def show_set(values: Iterable[Value]) -> str:
    """Elements separated by spaces (``r1 r2``), or ``—`` for none."""
    items = sorted((show(v) for v in values), key=natural_key)
    return " ".join(items) if items else "—"


# --------------------------------------------------------------------------------------------
# The timeline
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineCell:
    lines: tuple[str, ...]
    tone: str
    hint: str
    changed: bool  # differs from the same lane's previous cell
    alert: bool  # an offending value of the violated property


@dataclass(frozen=True)
class Lane:
    id: str
    group: str
    label: str
    cells: tuple[TimelineCell, ...]


@dataclass(frozen=True)
class Column:
    index: int
    label: ActionLabel
    marked: bool  # the step that breaks the property
    in_loop: bool  # part of a lasso's loop


@dataclass(frozen=True)
class Finding:
    """Why the marked step breaks the property, in words, with the offending values."""

    property: str
    step: int
    summary: str
    offences: tuple[Offence, ...]


@dataclass(frozen=True)
class Timeline:
    model: str
    variant: str | None
    verdict: str  # one line for the header
    violated: str | None  # the violated property, None when the trace passes
    source: str
    columns: tuple[Column, ...]
    lanes: tuple[Lane, ...]
    finding: Finding | None
    loop_index: int | None
    binding: str
    tones: Mapping[str, str]

    @property
    def marked_step(self) -> int | None:
        return None if self.finding is None else self.finding.step


def _find(trace: ExplainTrace, binding: LaneBinding) -> Finding | None:
    steps = trace.steps
    last = len(steps) - 1
    if trace.passes:
        return None
    if trace.kind == "liveness":
        loop = trace.loop_index if trace.loop_index is not None else last
        return _lasso_finding(trace.property_name, steps, loop, binding) or Finding(
            trace.property_name or "a temporal property", loop, _lasso_summary(trace.property_name, loop, last), ())
    if trace.kind == "deadlock":
        return Finding(trace.property_name or "Deadlock", last, f"No action is enabled after step {last}: deadlock.", ())
    if trace.property_name is not None:
        check = binding.invariants.get(trace.property_name)
        offences = tuple(check(steps, last)) if check else ()
        summary = f"{trace.property_name} is false in step {last}" + (
            ":" if offences else " (TLC's verdict; no description of its offending values is known).")
        return Finding(trace.property_name, last, summary, offences)
    for index in range(len(steps)):  # no verdict given (an ITF file): check the states ourselves
        for name, check in binding.invariants.items():
            offences = tuple(check(steps, index))
            if offences:
                return Finding(name, index, f"{name} is false in step {index} (found by checking the trace's "
                                            "states):", offences)
    if trace.loop_index is not None:
        return _lasso_finding(None, steps, trace.loop_index, binding)
    return None


def _lasso_summary(prop: str | None, loop: int, last: int) -> str:
    return (f"{prop or 'A temporal property'} fails: from step {loop} the behaviour repeats forever"
            + (" (the last step loops back)" if loop < last else " (nothing changes any more)")
            + " and what the property promises never happens.")


def _lasso_finding(prop: str | None, steps: Sequence[Step], loop: int, binding: LaneBinding) -> Finding | None:
    """The named leads-to property's offences on the lasso; unnamed (TLC 2.15 names none when the cfg lists
    several), the first of the binding's properties that the lasso breaks."""
    candidates = [prop] if prop in binding.liveness else list(binding.liveness) if prop is None else []
    for name in candidates:
        assert name is not None
        offences = tuple(binding.liveness[name](steps, loop))
        if offences:
            label = name if prop is not None else f"{name} (inferred from the states)"
            return Finding(label, loop, _lasso_summary(label, loop, len(steps) - 1), offences)
    return None


def _verdict(trace: ExplainTrace, finding: Finding | None) -> str:
    if trace.passes:
        return "passes: TLC found no violation; this is one representative trace"
    if finding is None:
        return "no property is violated in this trace"
    kind = f" ({trace.kind})" if trace.kind else ""
    return f"violates {finding.property}{kind}"


def build_timeline(trace: ExplainTrace, binding: LaneBinding) -> Timeline:
    """Evaluate the binding over every step of the trace."""
    finding = _find(trace, binding)
    alert_lanes = frozenset().union(*(o.lanes for o in finding.offences)) if finding else frozenset()
    loop = trace.loop_index

    def alert_at(index: int) -> bool:
        if finding is None:
            return False
        if trace.kind == "liveness" and loop is not None:
            return index >= loop
        return index == finding.step

    lanes: list[Lane] = []
    for group in binding.groups:
        keys: dict[str, Value] = {}
        for step in trace.steps:
            for key in group.keys(step):
                keys.setdefault(group.label(key), key)
        for label in sorted(keys, key=natural_key):
            key = keys[label]
            ident = lane_id(group.title, label)
            cells: list[TimelineCell] = []
            for step in trace.steps:
                cell = group.cell(key, trace.steps, step.index)
                changed = bool(cells) and cells[-1].lines != cell.lines
                cells.append(TimelineCell(cell.lines, cell.tone, cell.hint, changed,
                                          ident in alert_lanes and alert_at(step.index)))
            lanes.append(Lane(ident, group.title, label, tuple(cells)))

    columns = tuple(
        Column(index=step.index, label=binding.describe_action(step.action),
               marked=finding is not None and step.index == finding.step,
               in_loop=loop is not None and step.index >= loop)
        for step in trace.steps)
    return Timeline(model=trace.model, variant=trace.variant, verdict=_verdict(trace, finding),
                    violated=None if finding is None else finding.property, source=trace.source,
                    columns=columns, lanes=tuple(lanes), finding=finding, loop_index=loop,
                    binding=binding.name, tones=dict(binding.tones))


# --------------------------------------------------------------------------------------------
# The generic binding: one lane per variable (any spec)
# --------------------------------------------------------------------------------------------


def _generic_action(action: Mapping[str, Value]) -> ActionLabel:
    params = tuple(f"{name}: {show(value)}" for name, value in action.items() if name != "name")
    return ActionLabel(str(action.get("name", "step")), params)


def generic_binding(variables: Sequence[str]) -> LaneBinding:
    """One lane per variable, showing its value; used for specs the model binding does not know."""

    def cell(name: Value, steps: Sequence[Step], index: int) -> Cell:
        value = steps[index].values.get(str(name))
        return Cell((show(value),) if value is not None else ("—",))

    group = LaneGroup(title="Variables", keys=lambda step: list(step.values), label=str, cell=cell)
    return LaneBinding(name="generic", required=frozenset(), groups=(group,), describe_action=_generic_action)
