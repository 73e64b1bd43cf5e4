"""BlocksExclusiveInv, the block pool's invariant, catches a pool bug the other invariants see later or not
at all: a spec mutant whose allocator treats the blocks of a request held by a delayed free as free.

The mutant is applied to a copy of spec/ (the shipped model is untouched) and checked with `deferdump check`
on DirectSafety's cfg, the real TLC path.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import deferdump.spec
from deferdump.tools.explain.binding import BINDING
from deferdump.tools.explain.source import load_target

pytestmark = pytest.mark.slow

SPEC = Path(deferdump.spec.__file__).parent
FREE = "        Free(adv, p) == (Block \\ HeldIn(S)) \\cup SwFreed(adv, p) \\cup Victims(p)"
# vLLM-side bug: the allocator forgets the blocks a delayed free still holds
FREE_IGNORING_DELAYED = ("        Free(adv, p) == (Block \\ UNION {Range(S.bo[r]) : r \\in {x \\in Req : S.rs[x] # \"delayed\"}})"
                         " \\cup SwFreed(adv, p) \\cup Victims(p)")


def _check(spec_dir: Path, cfg: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "deferdump.tools.cli.app", "check", str(spec_dir / "MCReal.tla"),
                           "-c", str(spec_dir / cfg), "--json"], capture_output=True, text=True, timeout=600)
    assert proc.stdout, proc.stderr[-2000:]
    (row,) = json.loads(proc.stdout)
    return row


def test_the_shipped_model_holds_it() -> None:
    assert "BlocksExclusiveInv" in (SPEC / "DirectSafety.cfg").read_text()
    assert _check(SPEC, "DirectSafety.cfg")["status"] == "pass"


def test_an_allocator_that_ignores_delayed_frees_breaks_it_first(tmp_path: Path) -> None:
    spec_dir = tmp_path / "spec"
    shutil.copytree(SPEC, spec_dir, ignore=shutil.ignore_patterns("__pycache__", "states", "*.out"))
    text = (spec_dir / "DeferDump.tla").read_text()
    assert text.count(FREE) == 1, "the allocator's definition moved: update the mutant"
    (spec_dir / "DeferDump.tla").write_text(text.replace(FREE, FREE_IGNORING_DELAYED))
    row = _check(spec_dir, "DirectSafety.cfg")
    assert (row["status"], row["property"]) == ("violation", "BlocksExclusiveInv"), row.get("message")
    last = row["trace"][-1]["state"]
    held = {}
    for req, blocks in last["blocksOf"]["#map"]:
        for block in blocks["#tup"] if isinstance(blocks, dict) else blocks:
            held.setdefault(json.dumps(block), []).append(req)
    assert any(len(holders) > 1 for holders in held.values()), "no block is held twice at the violation"
    # explain's own evaluator of the invariant agrees with TLC: first bad at the last state, naming the block
    itf = tmp_path / "cx.itf.json"
    states = [step["state"] for step in row["trace"]]
    itf.write_text(json.dumps({"vars": list(states[0]), "states": states}), encoding="utf-8")
    steps = load_target(str(itf)).steps
    check = BINDING.invariants["BlocksExclusiveInv"]
    assert [k for k in range(len(steps)) if check(steps, k)] == [len(steps) - 1]
    (offence,) = check(steps, len(steps) - 1)
    assert "held by" in offence.text
