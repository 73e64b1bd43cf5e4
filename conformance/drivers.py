"""Choosing the replay driver for a trace: by the variables it carries."""
from __future__ import annotations

from deferdump.tools.tlc.values import ItfError, ItfTrace

from deferdump.conformance.deferdump_schema import ACTIONS, DEFERDUMP_VARS, ModelConstants, observed_variables
from deferdump.conformance.driver import Driver
from deferdump.conformance.errors import UnknownDriver
from deferdump.conformance.profiles import profile_for
from deferdump.conformance.trace_checks import validate_actions

__all__ = ["default_driver_factory"]


def default_driver_factory(trace: ItfTrace) -> Driver:
    """The DeferDump driver for traces of the DeferDump model (any of its MC configs), under the
    implementation profile the trace's index picks (:func:`.profiles.profile_for`).

    The trace is checked against the model's schema first: a bad trace is refused before the driver's
    module loads torch and the reference connector."""
    if DEFERDUMP_VARS <= set(trace.vars):
        constants = ModelConstants.from_trace(trace)
        profile = profile_for(trace)
        validate_actions(trace, ACTIONS, observed_variables(constants, profile))
        from deferdump.conformance.deferdump_driver import DeferDumpDriver

        return DeferDumpDriver(constants, profile)
    where = trace.path or "<trace>"
    missing = sorted(DEFERDUMP_VARS - set(trace.vars))
    if "action" not in trace.vars:
        raise ItfError("the model's 'action' variable is missing from 'vars'", json_path="$.vars", file=trace.path)
    raise UnknownDriver(f"{where}: $.vars: no replay driver for these variables (the DeferDump driver needs "
                        f"{', '.join(missing)})")
