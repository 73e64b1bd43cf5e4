"""Exceptions of `deferdump mro`: each names one way a connector source file cannot be judged."""
from __future__ import annotations

from deferdump.reference.errors import UserError


class MroError(UserError):
    """Base of every error the MRO judge raises for bad input (the CLI prints it as one line)."""


class SourceParseError(MroError):
    """A source file cannot be read or is not valid Python."""


class DuplicateClassError(MroError):
    """Two analysed files define a class with the same name, so class names would be ambiguous."""


class HierarchyError(MroError):
    """The class hierarchy is impossible in Python (no C3 linearization, a cycle, a duplicate base)."""


class NoConnectorError(MroError):
    """None of the analysed classes reaches ``KVConnectorBase_V1``: there is nothing to judge."""


class JudgeError(MroError):
    """TLC could not check a generated model (a spec error, a timeout): no verdict is possible."""


class ModelTimeout(JudgeError):
    """TLC did not finish one generated model within the allowed time: that case is `unknown`, not an
    error of the whole run (the judge catches it per case)."""
