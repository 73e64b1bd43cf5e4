"""`deferdump watch` refuses bad input in one line, exit 2, before any engine starts (main env: no vLLM)."""
from __future__ import annotations

import subprocess
import sys

import pytest


def _watch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deferdump.tools.cli.app", "watch", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--connector", "ExampleConnector", "--scenario", "prefixx"], "unknown scenario 'prefixx' (known: prefix, "),
    (["--connector", "ExampleConnector", "--extra", "{bad"], "--extra is not JSON"),
    (["--connector", "ExampleConnector", "--extra", "[1]"], "--extra must be a JSON object, got list"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    done = _watch(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_without_vllm_it_says_so() -> None:
    probe = subprocess.run([sys.executable, "-c", "import vllm.config"], capture_output=True, timeout=300)
    if probe.returncode == 0:  # (in-process, tests/vllm would pass for a `vllm` namespace package)
        pytest.skip("vLLM is installed here: tests/vllm/test_vllm_watch.py covers the connector errors")
    done = _watch("--connector", "ExampleConnector")
    assert done.returncode == 2
    assert done.stderr.startswith("deferdump: deferdump watch needs vLLM") and done.stderr.count("\n") == 1
