"""Root conftest: pytest puts this directory on sys.path, so every test imports `support.*` helpers."""
from __future__ import annotations

import pytest

from support.threads import one_thread_per_process


def pytest_configure(config: pytest.Config) -> None:
    one_thread_per_process(config)  # why: support/threads.py
