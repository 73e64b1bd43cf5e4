"""One OpenMP thread per test process, so that the suite's xdist workers do not steal each other's cores.

The suite runs one pytest-xdist worker per core, and the simulated engine's tensors are tiny. With torch's
default pool (one thread per core), the pool's idle threads spin-wait after each operation on the core the
other worker needs: a soak cell of `tests/bench/test_soak.py` took 7-10 s of CPU that way and 1 s with one
thread, for the same work. ``OMP_NUM_THREADS`` is set in the environment, so the CLI subprocesses the tests
start inherit it. A value the user set wins, and the vLLM tests (tests/vllm) keep vLLM's own settings.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

VARIABLE = "OMP_NUM_THREADS"
THREADS = 1
VLLM_TESTS = Path(__file__).resolve().parents[1] / "vllm"
MARK = "DEFERDUMP_SUITE_SET_OMP"  # set beside it: xdist workers (and CLI runs) inherit a value the suite set
PRESET = VARIABLE in os.environ and os.environ.get(MARK) != "1"
"""Whether the user set the variable before the suite started (then it is left alone)."""


def may_run_vllm_tests(config: pytest.Config) -> bool:
    """Whether the session's paths include tests/vllm (and do not ignore it)."""
    ignored = {Path(path).resolve() for path in config.getoption("ignore") or ()}
    if VLLM_TESTS in ignored:
        return False
    for arg in config.args:
        path = Path(str(arg).split("::")[0]).resolve()
        if path == VLLM_TESTS or VLLM_TESTS in path.parents or path in VLLM_TESTS.parents:
            return True
    return False


def one_thread_per_process(config: pytest.Config) -> None:
    """Set ``OMP_NUM_THREADS=1`` unless the user set it or the session may run the vLLM tests (call it
    from ``pytest_configure``: before xdist starts its workers and before any test imports torch)."""
    if PRESET or may_run_vllm_tests(config):
        return
    os.environ[VARIABLE] = str(THREADS)
    os.environ[MARK] = "1"
    if "torch" in sys.modules:  # already loaded (by a plugin): its pool read the variable at load
        sys.modules["torch"].set_num_threads(THREADS)
