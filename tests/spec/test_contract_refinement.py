"""The refinement check is not vacuous: DeferDump against the connector contract under a wrong mapping fails
ContractSpecProp, through real TLC (the right mapping is the manifest's DeferDumpRefinesContract)."""
from __future__ import annotations

import re

import pytest

from deferdump.tools.tlc.bridge import run_tlc
from deferdump.tools.tlc.output import Kind, Status
from deferdump.tools.tlc.specfiles import spec_dir

pytestmark = pytest.mark.slow

MODULE = "MCWrongContractMap"


def _wrong_mapping(field: str, expression: str) -> str:
    """ContractRefinement.tla with one substitution replaced, as a module extending DeferDump."""
    text = (spec_dir() / "ContractRefinement.tla").read_text()
    body = text[text.index("EXTENDS DeferDump"):text.rindex("\n====")]
    body, count = re.subn(rf"\b{field} <- [^,\n]+", lambda _: f"{field} <- {expression}", body)
    assert count == 1, field
    return "\n".join([f"---- MODULE {MODULE} ----", body.replace("EXTENDS DeferDump", "EXTENDS DeferDump, RealTable"),
                      "MCClasses == RealClasses", "MCBases == RealBases", "MCBehaviour == RealBehaviour",
                      "MCDefines == DefinesFrom(RealBehaviour)", "====", ""])


@pytest.mark.parametrize(("field", "expression", "caught_at"), [
    # forgets the forward's writes: a schedule hands out blocks no forward writes
    ("toWrite", "{}", "schedule"),
    # takes a delayed free for a done one: the request is freed while vLLM still holds its blocks
    ("rstate", '[r \\in Req |-> IF reqState[r] = "delayed" THEN "done" ELSE reqState[r]]', "update_from_output"),
])
def test_a_wrong_mapping_fails_the_contract_spec(field: str, expression: str, caught_at: str) -> None:
    cfg = (spec_dir() / "DeferDumpRefinesContract.cfg").read_text()
    result = run_tlc(spec_dir() / f"{MODULE}.tla", f"{MODULE}.cfg", timeout=600,
                     extra_modules={MODULE: _wrong_mapping(field, expression), f"{MODULE}.cfg": cfg})
    # TLC 2.15 names a violated [][Next]_vars by its place: the contract's Spec
    spec_line = next(n for n, line in enumerate((spec_dir() / "ConnectorContract.tla").read_text().splitlines(), 1)
                     if line.startswith("Spec == "))
    assert (result.status, result.kind) == (Status.VIOLATION, Kind.ACTION), result.message
    assert f"Action property line {spec_line}, " in (result.message or "") and "of module ConnectorContract" in (
        result.message or ""), result.message
    assert result.trace[-1].action == caught_at
