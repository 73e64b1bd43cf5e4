"""The JSON report `make verify` writes (`deferdump verify --report`), read by the `verify`-marked tests it runs next.

`make verify` checks the CI tier, generates and replays the conformance traces under coverage.py, then runs
the tests marked `verify` with ``DEFERDUMP_VERIFY_REPORT`` naming that report: they judge what the run
measured instead of running TLC and the replay a second time. Run on their own (``pytest -m verify``,
no report named), each test produces the same figures itself.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPORT_ENV = "DEFERDUMP_VERIFY_REPORT"


def verify_report() -> dict[str, Any] | None:
    """The report named by ``$DEFERDUMP_VERIFY_REPORT``, or None when none is named."""
    named = os.environ.get(REPORT_ENV)
    if not named:
        return None
    path = Path(named)
    report = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(report, dict) or not {"ok", "checks", "conformance", "core_coverage"} <= set(report):
        raise ValueError(f"{path} is not a `deferdump verify --report` file")
    return report
