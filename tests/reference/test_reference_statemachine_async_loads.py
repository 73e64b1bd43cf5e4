"""Property test with asynchronous loads (`load_async`): the real connector in the simulated vLLM engine with
hits parked in WAITING_FOR_REMOTE_KVS, loads completing or failing whenever the machine says, aborts and
preemptions meanwhile, one or two KV-cache groups, one or two ranks. Every invariant of the synchronous
machine holds after every rule, and the engine's oracle checks each reported load: its request still holds
the blocks, and they hold the stored bytes. At the end every parked or held request is freed.

Examples: 500 of the `deferdump-ci` profile (DEFERDUMP_HYPOTHESIS_EXAMPLES raises the profile's)."""
from __future__ import annotations

import pytest
from hypothesis import settings

from support.statemachine import AsyncLoadMachine

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

TestAsyncLoadProtocol = AsyncLoadMachine.TestCase
TestAsyncLoadProtocol.settings = settings(TestAsyncLoadProtocol.settings, max_examples=500)
