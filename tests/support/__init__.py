"""Helpers shared by the test packages (never test modules themselves): fixtures' paths and builders."""
from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
