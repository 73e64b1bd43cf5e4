"""Root conftest: pytest puts this directory on sys.path, so every test imports `support.*` helpers."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.randomness import add_replay_section, load_hypothesis_profile, seed  # noqa: F401 (the fixture)
from support.threads import one_thread_per_process

HYPOTHESIS_PROFILE = load_hypothesis_profile()  # before the test modules: their @settings inherit it (randomness.py)


TRACE_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "deferdump-traces"
"""The checkout's trace cache, shared with `make verify` (the Makefile points it there too)."""


def pytest_configure(config: pytest.Config) -> None:
    one_thread_per_process(config)  # why: support/threads.py
    os.environ.setdefault("DEFERDUMP_TRACE_CACHE", str(TRACE_CACHE))


def pytest_report_header(config: pytest.Config) -> str:
    return f"hypothesis profile: {HYPOTHESIS_PROFILE} (tests/support/randomness.py)"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report = yield
    add_replay_section(item, report)  # a failed seeded test says how to replay it
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding `slow` tests first, each file's tests in their own order (a stable sort).

    `make test` runs the files on xdist workers (`--dist loadfile --no-loadscope-reorder`), handing them out
    in this order: the long files start first and short ones fill the end, instead of one long file
    starting last while the other workers have run out of work."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)
