"""Choosing the replay driver for a trace: by the variables it carries."""
from __future__ import annotations

from deferdump.tools.tlc.values import ItfError, ItfTrace

from deferdump.conformance.deferdump_driver import DEFERDUMP_VARS, DeferDumpDriver, ModelConstants
from deferdump.conformance.driver import Driver
from deferdump.conformance.errors import UnknownDriver
from deferdump.conformance.profiles import profile_for

__all__ = ["default_driver_factory"]


def default_driver_factory(trace: ItfTrace) -> Driver:
    """The DeferDump driver for traces of the DeferDump model (any of its MC configs), under the
    implementation profile the trace's index picks (:func:`.profiles.profile_for`)."""
    if DEFERDUMP_VARS <= set(trace.vars):
        return DeferDumpDriver(ModelConstants.from_trace(trace), profile_for(trace))
    where = trace.path or "<trace>"
    missing = sorted(DEFERDUMP_VARS - set(trace.vars))
    if "action" not in trace.vars:
        raise ItfError("the model's 'action' variable is missing from 'vars'", json_path="$.vars", file=trace.path)
    raise UnknownDriver(f"{where}: $.vars: no replay driver for these variables (the DeferDump driver needs "
                        f"{', '.join(missing)})")
