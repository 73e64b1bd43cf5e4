"""Where the TLA+ spec lives: package data, so a non-editable install finds it too."""
from __future__ import annotations

import importlib.resources
from pathlib import Path


def spec_dir() -> Path:
    """Directory holding the shipped spec (``spec/`` in a checkout, package data when installed)."""
    root = importlib.resources.files("deferdump.spec")
    path = Path(str(root))
    if not (path / "manifest.json").exists() and not any(path.glob("*.tla")):
        raise FileNotFoundError(f"deferdump spec directory {path} holds no TLA+ modules")
    return path
