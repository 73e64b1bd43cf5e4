"""Exceptions of the conformance package: one-line messages the CLI prints as they are."""
from __future__ import annotations

from deferdump.reference.errors import UserError


class ConformanceError(UserError):
    """Base of every expected conformance failure (bad input, a model TLC cannot explore...)."""


class TraceGenerationError(ConformanceError):
    """TLC could not produce the state graph or the simulation traces of a model."""


class StateGraphError(ConformanceError):
    """A DOT state graph that is not what ``tlc -dump dot,actionlabels`` writes."""


class TraceInputError(ConformanceError):
    """A trace file that fails validation (the message names file, state index and JSON path)."""


class UnknownDriver(ConformanceError):
    """A trace whose model has no replay driver."""
