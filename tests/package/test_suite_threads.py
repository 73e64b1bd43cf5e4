"""The suite's test processes (and the CLI runs they start) use one OpenMP thread (support/threads.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from support import threads

pytestmark = pytest.mark.skipif(threads.PRESET, reason=f"{threads.VARIABLE} was set before the suite started")


def test_this_process_uses_one_torch_thread() -> None:
    assert os.environ[threads.VARIABLE] == "1"
    assert torch.get_num_threads() == 1


def test_a_started_process_inherits_one_thread() -> None:
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "1"
