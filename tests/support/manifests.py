"""Manifests of fixture models (tests/fixtures/tla) in a temp directory, for tests of manifest-driven commands."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from support import FIXTURES

__all__ = ["fixture_manifest", "fixture_model"]


def fixture_model(name: str, module: str, expect: object, distinct: int | None,
                  tier: str = "ci") -> dict[str, object]:
    """One manifest entry of a fixture module checked with its own cfg."""
    return {"name": name, "module": module, "config": f"{module}.cfg", "tier": tier, "variant": "Direct",
            "expect": expect, "distinct_states": distinct, "mutant": expect != "pass", "conformance": False}


def fixture_manifest(directory: Path, models: list[dict[str, object]]) -> Path:
    """Copy the fixture specs into ``directory`` and write a manifest of ``models`` beside them."""
    for source in (FIXTURES / "tla").iterdir():
        shutil.copyfile(source, directory / source.name)
    path = directory / "manifest.json"
    path.write_text(json.dumps({"models": models}))
    return path
