"""The contract between the replay engine and an implementation driver.

A driver owns one fresh implementation per trace. For every step the engine hands it the model's state
before and after (the ``action`` variable of the state after names the step and its parameters); the
driver makes the corresponding calls and may check call results on the spot (raising
:class:`StepMismatch`). After every step the engine compares ``abstract_state()`` — the refinement
mapping, restricted to the variables the driver observes — with the model's state.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from deferdump.reference.errors import DeferDumpError
from deferdump.tools.tlc.values import ItfTrace, Value

__all__ = ["Driver", "DriverFactory", "StepMismatch"]


class StepMismatch(DeferDumpError):
    """A call's result disagrees with what the action record says it returned (a divergence).

    Not a `UserError`: the replay engine catches it and reports the divergence (the trace's verdict)."""

    def __init__(self, lines: list[str] | str) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("; ".join(self.lines))


class Driver(Protocol):
    """Runs one trace's steps on an implementation and maps its state to the model's variables."""

    observed: tuple[str, ...]  # model variables abstract_state() returns
    actions: frozenset[str]  # values of action.name the driver understands

    def reset(self, initial: Mapping[str, Value]) -> None:
        """Build a fresh implementation in the state matching the model's initial state."""

    def step(self, before: Mapping[str, Value], after: Mapping[str, Value]) -> None:
        """Perform ``after["action"]`` on the implementation (a stuttering step is never passed)."""

    def abstract_state(self) -> dict[str, Value]:
        """The implementation's state in model terms, on the observed variables (the refinement mapping)."""

    def model_view(self, state: Mapping[str, Value]) -> dict[str, Value]:
        """The model state restricted (and projected) to what ``abstract_state`` can be compared with."""

    def close(self) -> None:
        """Release the implementation."""


DriverFactory = Callable[[ItfTrace], Driver]
"""Chooses and builds the driver for a (validated) trace."""
