"""The distribution's layout: packages import, the spec ships as package data, the CLI runs."""
from __future__ import annotations

import subprocess
import sys

from deferdump.tools.tlc.specfiles import spec_dir


def test_spec_ships_as_package_data() -> None:
    assert (spec_dir() / "manifest.json").is_file()


def test_cli_version_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "deferdump.tools.cli.app", "version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0.1.0"
