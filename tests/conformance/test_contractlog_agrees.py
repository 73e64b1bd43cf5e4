"""The Python log checker agrees with the TLA+ contract (spec/ConnectorContract.tla) through real TLC.

Behaviours TLC finds in the contract are written as boundary logs (`support.contract_traces`): a correct
design's behaviours (witnesses of deep states: a preemption, every request finished and reported) must
pass the checker; each broken connector's counterexample must fail it with the clause TLC names.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from deferdump.conformance.contractlog import check_contract_log
from deferdump.tools.tlc.output import Status
from support.contract_traces import result_to_log, run_contract


def log_text(directory: Path) -> str:
    return "".join(path.read_text() for path in sorted(directory.glob("*.ndjson")))

pytestmark = pytest.mark.slow

SAFETY = ["ContractTypeInv", "SendingOnlyDelayedInv", "RecvingOnlyWaitingInv", "NoReuseBeforeReportInv",
          "NoWriteWhileTransferInv"]
# Deep states a correct design reaches: after a preemption every request has finished and been freed
# (for delay: its save waited and reported); every request loaded asynchronously, then finished (under
# the constraint that no forward computes: only async loads fill blocks).
PREEMPTED = 'PreemptedAllDoneInv == ~(preempts = 1 /\\ \\A r \\in Req : rstate[r] = "done")'
LOADED = 'LoadedAllDoneInv == ~(\\A r \\in Req : rstate[r] = "done")\nOnlyLoads == toWrite = {}'
WITNESSES = {"PreemptedAllDoneInv": (PREEMPTED, None), "LoadedAllDoneInv": (LOADED, "OnlyLoads")}


@pytest.mark.parametrize("design", ["delay", "flush", "pin"])
@pytest.mark.parametrize("witness", sorted(WITNESSES))
def test_a_correct_designs_behaviour_passes_the_checker(design: str, witness: str, tmp_path: Path) -> None:
    extra, constraint = WITNESSES[witness]
    result = run_contract(design, [*SAFETY, witness], extra=extra, constraint=constraint)
    assert result.status is Status.VIOLATION and result.property == witness, result.message
    log = result_to_log(result, tmp_path)
    events = log_text(log)
    if constraint:  # the behaviour loads every request asynchronously and reports each load
        assert events.count('"update_state_after_alloc"') == 2 and '"finished_recving": ["r' in events
    else:
        assert '"preempted": ["r' in events
    verdict = check_contract_log([log], drained=True)
    assert verdict.ok, verdict.detail
    assert verdict.events > 0


@pytest.mark.parametrize(("design", "clause"), [
    ("report_before_copy", "NoWriteWhileTransferInv"),
    ("free_before_copy", "NoWriteWhileTransferInv"),
    ("report_undelayed", "SendingOnlyDelayedInv"),
])
def test_a_broken_connectors_counterexample_fails_the_checker_with_the_same_clause(
        design: str, clause: str, tmp_path: Path) -> None:
    result = run_contract(design, SAFETY)
    assert result.status is Status.VIOLATION and result.property == clause, result.message
    verdict = check_contract_log([result_to_log(result, tmp_path)])
    assert (verdict.ok, verdict.property) == (False, clause), verdict.detail


def test_never_reports_lasso_fails_the_drained_checker(tmp_path: Path) -> None:
    result = run_contract("never_report", ["ContractTypeInv"], live=True)
    assert result.status is Status.VIOLATION and result.property == "DelayedEventuallyReportedProp", result.message
    log = result_to_log(result, tmp_path)
    assert check_contract_log([log]).ok  # a log cut short decides nothing about reports
    verdict = check_contract_log([log], drained=True)
    assert (verdict.ok, verdict.property) == (False, "DelayedEventuallyReportedProp"), verdict.detail
