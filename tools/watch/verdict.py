"""One scenario's verdict, as `deferdump watch` prints it and `--json` lists it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OK, CONTRACT, MISMATCH, CRASH, HANG, SKIPPED, UNKNOWN = (
    "ok", "contract_violation", "output_mismatch", "crash", "hang", "skipped", "unknown")
# `unknown`: the check itself could not run (e.g. the reference run without a connector failed): no
# verdict on the connector, rather than a wrong one.
VERDICTS = (OK, CONTRACT, MISMATCH, CRASH, HANG, SKIPPED, UNKNOWN)


@dataclass(frozen=True)
class ScenarioResult:
    """`verdict` is one of `VERDICTS`; `detail` says why in one line (empty for `ok`)."""

    scenario: str
    verdict: str
    detail: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}")

    def as_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "verdict": self.verdict, "detail": self.detail}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ScenarioResult":
        return cls(str(data["scenario"]), str(data["verdict"]), str(data.get("detail", "")))
