"""The root of deferdump's exception hierarchy.

Library code raises subclasses of :class:`DeferdumpError` for failures caused by the user's input or
environment (a missing file, no Java, a corrupted jar, a malformed trace). The CLI catches exactly this
class and prints ``str(error)`` as one line, so every message must make sense on its own.
"""
from __future__ import annotations


class DeferdumpError(Exception):
    """An expected failure with a one-line, user-facing message (never a bug in deferdump)."""
