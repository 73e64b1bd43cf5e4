"""The Python invariant checks speak the spec's language: a check of a spec invariant carries its TLA+ name,
and every other check is listed as Python-only (and says so in its message)."""
from __future__ import annotations

import re
from pathlib import Path

import deferdump.reference
import deferdump.spec
from deferdump.reference.invariants import PYTHON_ONLY_CHECKS, SPEC_INVARIANTS

ROOT = Path(deferdump.reference.__file__).resolve().parents[1]
MESSAGE = re.compile(r'f?"([A-Z][A-Za-z]+)( \(Python-only\))?: ')


def _violation_messages() -> list[tuple[str, bool, str]]:
    found = []
    for path in [*(ROOT / "reference").rglob("*.py"), *(ROOT / "tools" / "engine").rglob("*.py")]:
        text = path.read_text()
        if "violation" not in text.lower():
            continue
        for line in text.splitlines():
            if "violation" in line.lower() or line.strip().startswith(('f"', '"')):
                for match in MESSAGE.finditer(line):
                    found.append((match.group(1), bool(match.group(2)), f"{path.name}: {line.strip()}"))
    return found


def test_every_spec_name_is_an_invariant_of_the_spec() -> None:
    spec = (Path(deferdump.spec.__file__).parent / "DeferDump.tla").read_text()
    for name in SPEC_INVARIANTS:
        assert re.search(rf"^{name} ==", spec, re.M), name


def test_every_violation_message_names_a_known_check() -> None:
    messages = _violation_messages()
    assert len(messages) >= 15, messages
    names = {name for name, _, _ in messages}
    assert names & SPEC_INVARIANTS and names & set(PYTHON_ONLY_CHECKS)
    for name, marked, where in messages:
        if name in SPEC_INVARIANTS:
            assert not marked, where
        else:
            assert name in PYTHON_ONLY_CHECKS and marked, where
