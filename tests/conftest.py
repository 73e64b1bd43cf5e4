"""Root conftest: pytest puts this directory on sys.path, so every test imports `support.*` helpers."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.threads import one_thread_per_process


TRACE_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "deferdump-traces"
"""The checkout's trace cache, shared with `make verify` (the Makefile points it there too)."""


def pytest_configure(config: pytest.Config) -> None:
    one_thread_per_process(config)  # why: support/threads.py
    os.environ.setdefault("DEFERDUMP_TRACE_CACHE", str(TRACE_CACHE))
