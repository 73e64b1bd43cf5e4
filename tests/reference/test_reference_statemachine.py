"""Property test: the real connectors inside the simulated vLLM engine (`deferdump.tools.engine`, the one
bench and soak run), driven by Hypothesis through schedule, chunked prefill, preempt/resume (by lack of
blocks or by a chosen victim), finish, abort, task completion and failure, injected store and device faults,
and both of vLLM's load-failure policies.

After every rule the library invariant checker (`deferdump.reference.invariants`) must pass on a snapshot
of scheduler, worker and block-pool state; the real KV bytes every dump stored and every load restored
are checked too. At the end everything is aborted, drained and shut down: no pending task, no live handle.

Examples: the `deferdump-ci` profile runs 2,000; set DEFERDUMP_HYPOTHESIS_EXAMPLES for more.
"""
from __future__ import annotations

import pytest

from support.statemachine import DeferredDumpMachine

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

TestDeferredDumpProtocol = DeferredDumpMachine.TestCase
