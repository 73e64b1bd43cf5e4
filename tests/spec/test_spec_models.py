"""The CI tier of the TLA+ model (spec/manifest.json) meets every expectation, through the real CLI and TLC.

One run of the CI tier feeds every test here that reads results: each model's verdict and distinct-state
count match the manifest, and each mutant's counterexample is the bug it names — its `action` history
holds the connector calls that make that bug. Those tests are marked `verify`: `make verify` (run by CI)
runs them on the check results of its own `deferdump verify` run; `make test` leaves them out. Alone
(`pytest -m verify tests/spec`) they run `deferdump check --tier ci --json` themselves.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from support.verify_report import verify_report
from deferdump.tools.tlc.cfg import strip_comments
from deferdump.tools.tlc.manifest import load_manifest
from deferdump.tools.tlc.specfiles import spec_dir

pytestmark = pytest.mark.slow

CI_MODELS = [entry for entry in load_manifest().models if entry.tier == "ci"]
# The connector contract's models (spec/ConnectorContract.tla, DeferDump against it): no `action` history.
CONTRACT_MODELS = [entry for entry in CI_MODELS if entry.variant == "Contract"]
MUTANTS = [entry.name for entry in CI_MODELS if entry.mutant and entry.variant != "Contract"]

# Connector calls / engine events each mutant's counterexample must contain (names in `action`).
EXPECTED_CALLS: dict[str, set[str]] = {
    "CPOverrideNoTrack": {"build_connector_meta", "request_finished", "forward", "get_finished"},
    "OuterNoForward": {"request_finished", "get_finished", "_update_from_kv_xfer_finished"},
    "NoPreemptWait": {"handle_preemptions", "forward", "wait_for_save"},
    "ReportBeforeWait": {"get_finished", "request_finished", "_update_from_kv_xfer_finished", "forward"},
    "TrackAfterMLAReturn": {"wait_for_save", "request_finished", "get_finished"},
    "ReleaseOnlyOnSuccess": {"task_complete", "wait_for_save"},
    "BlockingWaitForSave": {"wait_for_save"},
    "PreemptWaitsAll": {"handle_preemptions", "build_connector_meta"},
    "SlidingWindowDrainOverWaits": {"handle_preemptions", "build_connector_meta", "forward"},
    "PreemptWaitsOneVictim": {"handle_preemptions", "build_connector_meta", "forward"},
    "AggForwardsFirst": {"get_finished", "request_finished", "_update_from_kv_xfer_finished"},
    "OuterNoForwardSomeDelayed": {"request_finished", "forward", "wait_for_save"},
    "OuterNoForwardTracking": {"build_connector_meta", "request_finished"},
    "TrackAfterMLAReturnSafety": {"wait_for_save", "build_connector_meta"},
    "RedoUntracked": {"_update_requests_with_invalid_blocks", "build_connector_meta", "forward"},
    "ShutdownKeepsHandles": {"shutdown", "wait_for_save"},
    "LookupSeesRunning": {"build_connector_meta", "forward", "wait_for_save"},
    "DumpsFailedLoads": {"_update_requests_with_invalid_blocks", "build_connector_meta", "forward", "wait_for_save"},
    "DumpsFailedLoadsContent": {"build_connector_meta", "forward", "wait_for_save"},
    # the field's bugs (docs/real-bugs.md); their mechanisms in order: tests/spec/test_real_bugs.py
    "PreemptLate": {"build_connector_meta", "forward", "handle_preemptions"},
    # P2: the save waited at the preemption leaves its completion queued; the re-admitted request saves again,
    # finishes, and get_finished counts the stale completion for the new save: reported and freed while it reads
    "ReqIdReuse": {"handle_preemptions", "wait_for_save", "request_finished", "get_finished",
                   "_update_from_kv_xfer_finished"},
    "ExtraNotShipped": {"request_finished", "build_connector_meta", "get_finished", "_update_from_kv_xfer_finished"},
    "CountNotForwarded": {"request_finished", "get_finished", "_update_from_kv_xfer_finished"},
    "RfagDelaysAll": {"request_finished", "get_finished"},
    "ReportLostOnError": {"task_complete", "wait_for_save", "get_finished"},
    "WaitOneSave": {"wait_for_save", "get_finished", "_update_from_kv_xfer_finished", "forward"},
    "IdleIgnoresDelayed": {"request_finished", "get_finished"},
    "FenceCountsEmpty": {"schedule", "build_connector_meta", "update_from_output"},
    "PreemptFenced": {"schedule", "build_connector_meta"},
    # asynchronous loads (spec/README.md "Asynchronous loads"; docs/real-bugs.md)
    "AsyncAbortFreesLoading": {"get_num_new_matched_tokens", "start_load_kv", "finish_requests"},
    "AsyncAbortAfterRecv": {"start_load_kv", "load_complete", "get_finished", "finish_requests"},
    "AsyncDropAbortedRecv": {"start_load_kv", "finish_requests", "get_finished", "load_complete"},
    "AsyncAbortLateRecv": {"start_load_kv", "finish_requests", "load_complete", "_update_from_kv_xfer_finished"},
    "AbortFreesDelayed": {"request_finished", "finish_requests", "get_finished", "_update_from_kv_xfer_finished"},
    "AsyncEmptyHitLive": {"get_num_new_matched_tokens", "start_load_kv"},
    "AsyncRetryFailedHit": {"get_num_new_matched_tokens", "load_complete", "_update_waiting_for_remote_kv"},
    "AsyncSendAndRecv": {"build_connector_meta", "get_num_new_matched_tokens", "finish_requests", "get_finished"},
    "AsyncNoLoadExpiry": {"start_load_kv", "finish_requests", "load_complete", "get_finished"},
    "AsyncNoLoadExpiryWaiting": {"get_num_new_matched_tokens", "start_load_kv", "load_complete", "get_finished"},
    # N2: both children load, the first report promotes the request, the second is unexpected (test_real_bugs.py)
    "MultiBothLoad": {"update_state_after_alloc", "start_load_kv", "load_complete", "get_finished",
                      "_update_waiting_for_remote_kv", "_update_from_kv_xfer_finished"},
    "MultiBothLoadWrite": {"update_state_after_alloc", "start_load_kv", "load_complete", "get_finished"},
    # N11: a sharer runs on a block whose recompute is still to come (test_real_bugs.py)
    "SharedPrefixReadsInvalid": {"schedule", "build_connector_meta", "_update_requests_with_invalid_blocks"},
    # N11's other candidate fix: every sharer recomputes in place, under the first recompute's dump
    "SharedPrefixAllRecompute": {"_update_requests_with_invalid_blocks", "build_connector_meta", "wait_for_save",
                                 "forward"},
    # N10: a failed hybrid load recomputed in place writes the null block (test_real_bugs.py)
    "HybridRecomputeInPlace": {"get_num_new_matched_tokens", "start_load_kv", "load_complete", "get_finished",
                               "_update_waiting_for_remote_kv", "forward"},
}


@pytest.fixture(scope="module")
def ci_results() -> dict[str, dict[str, Any]]:
    """The CI tier's check rows: those of the `deferdump verify` run that `make verify` just made, else one
    run of the tier through the CLI (the same rows: both print `outcomes_json`)."""
    report = verify_report()
    if report is not None:
        rows = {row["model"]: row for row in report["checks"]}
        assert set(rows) == {entry.name for entry in CI_MODELS}, "the verify report is not of this manifest's CI tier"
        return rows
    proc = subprocess.run(
        [sys.executable, "-m", "deferdump.tools.cli.app", "check", "--tier", "ci", "--json"],
        capture_output=True, text=True, timeout=1800,
    )
    results = json.loads(proc.stdout)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    return {row["model"]: row for row in results}


def _names(value: Any) -> Iterator[str]:
    """Every `name` field anywhere inside an ITF value (the action record and its nested calls)."""
    if isinstance(value, dict):
        name = value.get("name")
        if isinstance(name, str):
            yield name
        for item in value.values():
            yield from _names(item)
    elif isinstance(value, list):
        for item in value:
            yield from _names(item)


def _calls(row: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Every call record named `name` in a counterexample's action history."""
    found: list[dict[str, Any]] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("name") == name:
                found.append(value)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for step in row["trace"]:
        walk(step["state"].get("action"))
    return found


def _set(value: Any) -> list[Any]:
    return value["#set"]


@pytest.mark.parametrize("name", [entry.name for entry in CI_MODELS])
@pytest.mark.verify
def test_ci_model_meets_manifest(ci_results: dict[str, dict[str, Any]], name: str) -> None:
    entry = next(e for e in CI_MODELS if e.name == name)
    row = ci_results[name]
    assert row["expected_ok"], row
    if entry.expect.passes:
        assert row["status"] == "pass"
        assert row["distinct_states"] == entry.distinct_states
    else:
        assert row["status"] == "violation"
        assert row["property"] == entry.expect.violation


def test_ci_tier_covers_the_issue() -> None:
    """Every variant passes in CI, every named mutant is there, conformance models are passing ones."""
    passing = [e for e in CI_MODELS if e.expect.passes]
    assert {e.variant for e in passing} == {"Direct", "LayerWise", "CP", "Contract"}
    assert set(MUTANTS) == set(EXPECTED_CALLS)
    assert all(e.expect.passes and not e.mutant for e in CI_MODELS if e.conformance)
    assert all(e.distinct_states for e in CI_MODELS)
    for entry in CI_MODELS:
        assert entry.module_path.is_file() and entry.config_path.is_file(), entry.name
        assert entry.config_path.parent == spec_dir()


@pytest.mark.parametrize("name", MUTANTS)
@pytest.mark.verify
def test_mutant_counterexample_shows_the_bug(ci_results: dict[str, dict[str, Any]], name: str) -> None:
    row = ci_results[name]
    assert row["trace"], f"{name}: no counterexample"
    seen = set(_names([step["state"].get("action") for step in row["trace"]]))
    missing = EXPECTED_CALLS[name] - seen
    assert not missing, f"{name}: counterexample lacks {sorted(missing)}; has {sorted(seen)}"


@pytest.mark.verify
def test_cp_mutant_dumps_without_tracking(ci_results: dict[str, dict[str, Any]]) -> None:
    """The reviewer's hypothesis: metadata with dump slices but nothing tracked, so no delayed free."""
    metas = _calls(ci_results["CPOverrideNoTrack"], "build_connector_meta")
    assert any(_set(m["dump"]) and not _set(m["tracked"]) for m in metas)
    finishes = _calls(ci_results["CPOverrideNoTrack"], "request_finished")
    assert any(_set(f["reqs"]) and not _set(f["delayed"]) for f in finishes)


@pytest.mark.verify
def test_no_preempt_wait_counterexample_preempts(ci_results: dict[str, dict[str, Any]]) -> None:
    metas = _calls(ci_results["NoPreemptWait"], "build_connector_meta")
    assert any(_set(m["preempted_req_ids"]) for m in metas)
    waits = _calls(ci_results["NoPreemptWait"], "handle_preemptions")
    assert all(not _set(w["waited"]) for w in waits)


@pytest.mark.verify
def test_blocking_wait_for_save_blocks(ci_results: dict[str, dict[str, Any]]) -> None:
    saves = _calls(ci_results["BlockingWaitForSave"], "wait_for_save")
    assert any(_set(s["blocked"]) for s in saves)


def _writes(call: dict[str, Any]) -> set[str]:
    """Blocks a forward call record writes, both KV-cache groups."""
    return {json.dumps(tup["#tup"][0]) for tup in _set(call["writes"]) + _set(call["sw_writes"])}


@pytest.mark.verify
def test_sliding_window_counterexample_frees_a_running_requests_block(ci_results: dict[str, dict[str, Any]]) -> None:
    """The merged table on a hybrid model: a block leaves the window while its request runs (no
    preemption, no finish), lands in the metadata's freed set, and the same step's forward writes it
    while handle_preemptions waited nothing."""
    row = ci_results["SlidingWindow"]
    assert row["trace"]
    schedules = _calls(row, "schedule")
    assert not any(_set(s["preempted"]) for s in schedules)
    slid = [s for s in schedules if _set(s["sw_freed"])]
    assert slid, "no sliding-window free in the counterexample"
    freed = {json.dumps(b) for s in slid for b in _set(s["sw_freed"])}
    forwards = _calls(row, "forward")
    assert freed & set().union(*(_writes(f) for f in forwards))
    assert all(not _set(h["waited"]) for h in _calls(row, "handle_preemptions"))
    finishes = _calls(row, "request_finished")
    assert all(not _set(f["reqs"]) for f in finishes), "the bug needs no finish"


@pytest.mark.verify
def test_sliding_window_fences_pass_where_the_merged_table_fails(ci_results: dict[str, dict[str, Any]]) -> None:
    """Both fences are safe on the hybrid bounds; the fine one keeps PreemptWaitsOnlyPreemptedInv
    (it waits only tasks that read a freed block), the coarse one does not."""
    assert ci_results["SlidingWindowFenced"]["status"] == "pass"
    assert ci_results["SlidingWindowDrain"]["status"] == "pass"
    assert ci_results["SlidingWindowFencedLive"]["status"] == "pass"
    over = ci_results["SlidingWindowDrainOverWaits"]
    assert over["property"] == "PreemptWaitsOnlyPreemptedInv"
    waits = [w for w in _calls(over, "handle_preemptions") if _set(w["waited"])]
    assert waits and not any(_set(w["preempted_req_ids"]) for w in waits)


def _constants(name: str) -> dict[str, str]:
    """The `Name = value` lines of a CI model's cfg (comments dropped)."""
    entry = next(e for e in CI_MODELS if e.name == name)
    text = strip_comments(entry.config_path.read_text())
    return dict(m.groups() for m in re.finditer(r"^\s*(\w+)\s*=\s*(.+?)\s*$", text, flags=re.MULTILINE))


def _checks_liveness(name: str) -> bool:
    entry = next(e for e in CI_MODELS if e.name == name)
    return "PROPERTIES" in strip_comments(entry.config_path.read_text())


def test_ci_tier_has_breadth_per_variant() -> None:
    """Per variant: a passing safety model without MultiConnector and a passing liveness model; somewhere:
    several victims with MaxPreempt > 1, chunked LayerWise prompts, async scheduling with MultiConnector."""
    passing = [e for e in CI_MODELS if e.expect.passes]
    for variant in ("Direct", "LayerWise", "CP"):
        mine = [e.name for e in passing if e.variant == variant]
        assert any(_constants(n)["Multi"] == "FALSE" and not _checks_liveness(n) for n in mine), variant
        assert any(_checks_liveness(n) for n in mine), variant
    consts = {e.name: _constants(e.name) for e in passing}
    assert any("several_victims" in c["Moves"] and int(c["MaxPreempt"]) > 1 for c in consts.values())
    assert any(c["InnerClass"] == '"UCMLayerWiseConnector"' and int(c["PromptBlocks"]) > 1 for c in consts.values())
    assert any(c["MaxInflight"] == "2" and c["Multi"] == "TRUE" and "split_reports" in c["Moves"]
               for c in consts.values())


@pytest.mark.verify
def test_several_victims_mutant_preempts_two(ci_results: dict[str, dict[str, Any]]) -> None:
    """Waiting one victim's tasks is enough for one victim; the bug needs a schedule with two."""
    row = ci_results["PreemptWaitsOneVictim"]
    assert any(len(_set(m["preempted_req_ids"])) >= 2 for m in _calls(row, "build_connector_meta"))


@pytest.mark.verify
def test_aggregator_mutant_frees_on_a_partial_count(ci_results: dict[str, dict[str, Any]]) -> None:
    """One rank's report frees the request; a later report from another rank is unexpected."""
    row = ci_results["AggForwardsFirst"]
    xfers = _calls(row, "_update_from_kv_xfer_finished")
    assert any(_set(x["unexpected"]) for x in xfers)
    steps = _calls(row, "execute_model")
    assert any(len({json.dumps(sorted(map(json.dumps, _set(c["finished_sending"]))))
                    for calls in _fun_values(s["ranks"]) for c in _fun_values(calls)
                    if c["name"] == "get_finished"}) > 1
               for s in steps), "no step where the ranks reported different requests"


def _fun_values(value: Any) -> list[Any]:
    """The values of an ITF function (`#map` pairs) or of a tuple/record."""
    if isinstance(value, dict) and "#map" in value:
        return [pair[1] for pair in value["#map"]]
    if isinstance(value, dict) and "#tup" in value:
        return list(value["#tup"])
    return list(value.values()) if isinstance(value, dict) else list(value)


@pytest.mark.verify
def test_some_delayed_sibling_unmasks_ucm(ci_results: dict[str, dict[str, Any]]) -> None:
    """A request no child delays is freed at once, and its block is rewritten under its dump."""
    row = ci_results["OuterNoForwardSomeDelayed"]
    assert any(_set(f["reqs"]) and not _set(f["delayed"]) for f in _calls(row, "request_finished"))


@pytest.mark.verify
def test_redo_untracked_dumps_a_recompute_untracked(ci_results: dict[str, dict[str, Any]]) -> None:
    row = ci_results["RedoUntracked"]
    assert any(_set(c["reqs"]) for c in _calls(row, "_update_requests_with_invalid_blocks"))
    assert any(_set(m["dump"]) and not _set(m["tracked"]) for m in _calls(row, "build_connector_meta"))


@pytest.mark.verify
def test_shutdown_mutant_keeps_a_handle(ci_results: dict[str, dict[str, Any]]) -> None:
    row = ci_results["ShutdownKeepsHandles"]
    last = row["trace"][-1]["state"]
    assert last["down"] is True
    assert any(_set(v) for v in _fun_values(last["live"]))


@pytest.mark.verify
def test_lookup_mutant_loads_a_running_dump(ci_results: dict[str, dict[str, Any]]) -> None:
    row = ci_results["LookupSeesRunning"]
    loads = [slice_ for m in _calls(row, "build_connector_meta") for slice_ in _set(m["load"])]
    assert loads and all("src" in slice_ for slice_ in loads)


@pytest.mark.verify
def test_dumps_failed_loads_rewrites_the_dumped_block_in_place(ci_results: dict[str, dict[str, Any]]) -> None:
    """The merged PR dumps the block computed after a failed partial-hit load; the rollback's recompute
    writes that same (held) block again in the next step while the dump still runs."""
    row = ci_results["DumpsFailedLoads"]
    steps = [step["state"]["action"]["phases"]["#tup"] for step in row["trace"][1:]]
    failed_at = [i for i, (_, run, _) in enumerate(steps) if _set(run["load_errors"])]
    assert failed_at, "no step with a failed load"
    i = failed_at[0]
    failed = set(_set(steps[i][1]["load_errors"]))
    dumped = {(d["req"], d["block"]) for d in _set(steps[i][0]["calls"]["#tup"][0]["dump"]) if d["req"] in failed}
    assert dumped, "the failed step dumps no block of the failed request"
    rewritten = {(a["req"], a["block"]) for a in _set(steps[i + 1][0]["allocated"])}
    assert dumped <= rewritten


@pytest.mark.verify
def test_the_recompute_models_pass_where_the_merged_table_fails(ci_results: dict[str, dict[str, Any]]) -> None:
    """The fix (skip_failed_loads, the reference's table) keeps both invariants the merged table breaks."""
    assert ci_results["DirectRecompute"]["status"] == "pass"
    assert ci_results["LayerWiseRecompute"]["status"] == "pass"
    assert ci_results["DumpsFailedLoads"]["property"] == "NoOverwriteWhileDumpingInv"
    assert ci_results["DumpsFailedLoadsContent"]["property"] == "NoDumpOfFailedLoadInv"


# --- asynchronous loads: each mutant's counterexample shows its row's mechanism ----------------------

def _step_calls(row: dict[str, Any], name: str) -> list[list[dict[str, Any]]]:
    """Per step of the counterexample, the call records named `name` in that step's action."""
    steps = []
    for step in row["trace"]:
        found: list[dict[str, Any]] = []

        def walk(value: Any) -> None:
            if isinstance(value, dict):
                if value.get("name") == name:
                    found.append(value)
                for item in value.values():
                    walk(item)
            elif isinstance(value, list):
                for item in value:
                    walk(item)

        walk(step["state"].get("action"))
        steps.append(found)
    return steps


def _first(steps: list[list[dict[str, Any]]], test: Any) -> int | None:
    """The index of the first step with a call record that passes `test`."""
    return next((i for i, calls in enumerate(steps) if any(test(c) for c in calls)), None)


def _recv_reports(row: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Per step, the scheduler's receive-side records (_update_from_kv_xfer_finished with finished_recving)."""
    return [[c for c in calls if "finished_recving" in c] for calls in _step_calls(row, "_update_from_kv_xfer_finished")]


def _remote_aborts(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in _calls(row, "finish_requests") if a["status"] == "remote"]


def _running_loads(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for _, tasks in state["loadTasks"]["#map"] for t in _set(tasks) if t["status"] == "running"]


@pytest.mark.verify
def test_abort_without_receive_delay_frees_under_the_load(ci_results: dict[str, dict[str, Any]]) -> None:
    """P10's first hole: a request waiting for remote KV is aborted and freed at once while its load task
    still writes its block."""
    row = ci_results["AsyncAbortFreesLoading"]
    aborts = _remote_aborts(row)
    assert aborts and all(not _set(a["delayed"]) for a in aborts)
    submitted = {t["#tup"][0] for c in _calls(row, "start_load_kv") for t in _set(c["submitted"])}
    assert {a["req"] for a in aborts} <= submitted
    last = row["trace"][-1]["state"]
    states = dict(last["reqState"]["#map"])
    assert any(states[t["req"]] == "done" for t in _running_loads(last))


@pytest.mark.verify
def test_late_receive_of_an_aborted_request_is_unexpected(ci_results: dict[str, dict[str, Any]]) -> None:
    """P11: the aborted request was freed; its receive completion reaches a scheduler that no longer knows it."""
    row = ci_results["AsyncAbortLateRecv"]
    aborted = {a["req"] for a in _remote_aborts(row) if not _set(a["delayed"])}
    steps = _recv_reports(row)
    at = _first(steps, lambda c: set(_set(c["unexpected"])) & aborted & set(_set(c["finished_recving"])))
    abort_at = _first(_step_calls(row, "finish_requests"), lambda a: a["req"] in aborted)
    assert at is not None and abort_at is not None and abort_at < at


@pytest.mark.verify
def test_abort_after_the_receive_delays_forever(ci_results: dict[str, dict[str, Any]]) -> None:
    """P10's second hole: the receive was reported before the abort, the abort still delays the free, and
    the request stays delayed on the counterexample's loop."""
    row = ci_results["AsyncAbortAfterRecv"]
    delayed = [a for a in _remote_aborts(row) if _set(a["delayed"])]
    assert delayed
    req = delayed[0]["req"]
    received = _first(_recv_reports(row), lambda c: req in _set(c["finished_recving"]))
    aborted = _first(_step_calls(row, "finish_requests"), lambda a: a["req"] == req)
    assert received is not None and aborted is not None and received < aborted
    assert row["loop_index"] is not None
    assert all(dict(step["state"]["reqState"]["#map"])[req] == "delayed" for step in row["trace"][row["loop_index"]:])


@pytest.mark.verify
def test_dropped_receive_never_reports(ci_results: dict[str, dict[str, Any]]) -> None:
    """P8: the request is aborted while loading (delayed free), the worker sees it finished and drops it;
    its load completes but no finished_recving names it."""
    row = ci_results["AsyncDropAbortedRecv"]
    delayed = [a for a in _remote_aborts(row) if _set(a["delayed"])]
    assert delayed
    req = delayed[0]["req"]
    seen = _first(_step_calls(row, "get_finished"), lambda c: req in _set(c["finished_req_ids"]))
    assert seen is not None
    assert any(c["req"] == req for c in _calls(row, "load_complete"))
    assert _first(_recv_reports(row), lambda c: req in _set(c["finished_recving"])) is None


@pytest.mark.verify
def test_abort_of_a_delayed_request_frees_it(ci_results: dict[str, dict[str, Any]]) -> None:
    """P12: request_finished delays the request, the abort frees it, its finished_sending is unexpected."""
    row = ci_results["AbortFreesDelayed"]
    delayed_at = _first(_step_calls(row, "request_finished"), lambda c: _set(c["delayed"]))
    abort_at = _first(_step_calls(row, "finish_requests"), lambda a: a["status"] == "delayed")
    report_at = _first(_step_calls(row, "_update_from_kv_xfer_finished"),
                       lambda c: set(_set(c.get("finished_sending", {"#set": []}))) & set(_set(c["unexpected"])))
    assert None not in (delayed_at, abort_at, report_at) and delayed_at < abort_at < report_at


@pytest.mark.verify
def test_empty_async_hit_submits_no_load(ci_results: dict[str, dict[str, Any]]) -> None:
    """N3: load_async answered, nothing submitted, the request waits for remote KV on the loop."""
    row = ci_results["AsyncEmptyHitLive"]
    waiting = {r for c in _calls(row, "get_num_new_matched_tokens") for r in _set(c["load_async"])}
    submitted = {t["#tup"][0] for c in _calls(row, "start_load_kv") for t in _set(c["submitted"])}
    assert waiting and not waiting & submitted
    assert row["loop_index"] is not None


@pytest.mark.verify
def test_failed_hit_is_retried(ci_results: dict[str, dict[str, Any]]) -> None:
    """N13: a request's load fails, and the lookup answers load_async for it again."""
    row = ci_results["AsyncRetryFailedHit"]
    failed = {r for calls in _recv_reports(row) for c in calls for r in _set(c["failed_recving"])}
    hits = [r for c in _calls(row, "get_num_new_matched_tokens") for r in _set(c["load_async"])]
    assert any(hits.count(r) >= 2 for r in failed)


@pytest.mark.verify
def test_send_report_frees_a_request_still_receiving(ci_results: dict[str, dict[str, Any]]) -> None:
    """Not in the note: a tracked request (dumped before a preemption) is re-admitted with an asynchronous
    load and aborted; both the save and the load delay its free, and the worker's finished_sending frees
    it while the load still writes its block."""
    row = ci_results["AsyncSendAndRecv"]
    both = [a for a in _remote_aborts(row) if _set(a["calls"]["#tup"][0]["ucm_delayed"])]
    assert both
    req = both[0]["req"]
    assert any(req in _set(c["finished_sending"]) for c in _calls(row, "get_finished"))
    last = row["trace"][-1]["state"]
    assert dict(last["reqState"]["#map"])[req] == "done"
    assert any(t["req"] == req for t in _running_loads(last))


@pytest.mark.verify
def test_lost_load_without_expiry_holds_the_aborted_request(ci_results: dict[str, dict[str, Any]]) -> None:
    """N4: the request is aborted while loading (delayed free), its load is lost, and no receive report
    ever names it: it stays delayed on the loop."""
    row = ci_results["AsyncNoLoadExpiry"]
    delayed = [a for a in _remote_aborts(row) if _set(a["delayed"])]
    assert delayed
    req = delayed[0]["req"]
    assert any(c["req"] == req and c["outcome"] == "lost" for c in _calls(row, "load_complete"))
    assert _first(_recv_reports(row), lambda c: req in _set(c["finished_recving"])) is None
    assert row["loop_index"] is not None
    assert all(dict(step["state"]["reqState"]["#map"])[req] == "delayed" for step in row["trace"][row["loop_index"]:])


@pytest.mark.verify
def test_every_sharer_recomputing_rewrites_the_block_under_the_first_dump(ci_results: dict[str, dict[str, Any]]) -> None:
    """N11's other candidate fix: both holders of the failed block are rolled back; the first recompute
    rewrites and dumps it, and the second, later, rewrites it while that dump still runs."""
    row = ci_results["SharedPrefixAllRecompute"]
    (update,) = _calls(row, "_update_requests_with_invalid_blocks")
    assert len(_set(update["affected"])) == 2
    dumps = [c for c in _calls(row, "build_connector_meta") if _set(c["dump"])]
    assert len(dumps) == 2, "both holders recompute and dump the block"
    first, second = ({d["block"] for d in _set(c["dump"])} for c in dumps)
    assert first == second and len(first) == 1
    assert {d["req"] for d in _set(dumps[0]["dump"])} != {d["req"] for d in _set(dumps[1]["dump"])}
    assert row["trace"][-1]["state"]["dumpOverwrites"] is True


@pytest.mark.verify
def test_lost_load_without_expiry_leaves_the_request_waiting(ci_results: dict[str, dict[str, Any]]) -> None:
    """N5 (receive side, vllm#35943): the request's load is lost, no receive report ever names it, and it
    waits for remote KV on the whole loop, holding its block."""
    row = ci_results["AsyncNoLoadExpiryWaiting"]
    lost = [c for c in _calls(row, "load_complete") if c["outcome"] == "lost"]
    assert lost
    req = lost[0]["req"]
    assert _first(_recv_reports(row), lambda c: req in _set(c["finished_recving"])) is None
    assert row["loop_index"] is not None
    for step in row["trace"][row["loop_index"]:]:
        state = step["state"]
        assert dict(state["reqState"]["#map"])[req] == "remote"
        blocks = dict(state["blocksOf"]["#map"])[req]
        assert (blocks["#tup"] if isinstance(blocks, dict) else blocks), "the waiting request holds no block"


def test_contract_models_cover_each_design_and_each_broken_connector() -> None:
    """Each safety design passes the contract, each broken connector fails the clause it breaks, and
    DeferDump is checked against the contract's spec and invariants, with two mutants that break it."""
    by_name = {e.name: e for e in CONTRACT_MODELS}
    expect = {name: (e.expect.violation if not e.expect.passes else "pass") for name, e in by_name.items()}
    assert expect == {
        "ContractDelay": "pass", "ContractFlush": "pass", "ContractPin": "pass", "ContractDelayLive": "pass",
        "ContractReportBeforeCopy": "NoWriteWhileTransferInv", "ContractFreeBeforeCopy": "NoWriteWhileTransferInv",
        "ContractNeverReports": "DelayedEventuallyReportedProp", "ContractReportUndelayed": "SendingOnlyDelayedInv",
        "DeferDumpRefinesContract": "pass",
        "ContractRefinementReportBeforeWait": "ContractNoWriteWhileTransferInv",
        "ContractRefinementAggFirst": "ContractSendingOnlyDelayedInv",
        "DeferDumpRefinesContractLive": "pass",
        "ContractRefinementTrackAfterMLAReturn": "ContractDelayedEventuallyReportedProp",
    }
    designs = {name: _constants(name).get("Design") for name in by_name if by_name[name].module == "ConnectorContract"}
    assert {designs[n] for n in ("ContractDelay", "ContractFlush", "ContractPin")} == {'"delay"', '"flush"', '"pin"'}
    for name in ("DeferDumpRefinesContract", "DeferDumpRefinesContractLive", "ContractRefinementReportBeforeWait",
                 "ContractRefinementAggFirst"):
        cfg = strip_comments(by_name[name].config_path.read_text())
        assert "ContractSpecProp" in cfg and _constants(name)["FusedStep"] == "FALSE", name


def _states(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [step["state"] for step in row["trace"]]


def _fun(value: Any) -> dict[str, Any]:
    return {json.dumps(k): v for k, v in value["#map"]}


@pytest.mark.verify
def test_contract_counterexamples_show_each_fault(ci_results: dict[str, dict[str, Any]]) -> None:
    """Report before copy: a delayed request is freed while a transfer of it still runs. Free before copy:
    a request's free is not delayed while a transfer of it runs. Report undelayed: the reported request
    was never delayed. Never reports: a delayed (or receiving) request waits in every state of the loop."""
    def running_reqs(state: dict[str, Any]) -> set[str]:
        return {json.dumps(r) for x in _set(state["xfer"]) for r in _set(x["reqs"])}

    early = _states(ci_results["ContractReportBeforeCopy"])
    assert any(_fun(a["rstate"])[r] == "delayed" and _fun(b["rstate"])[r] == "done" and r in running_reqs(a)
               for a, b in zip(early, early[1:]) for r in _fun(a["rstate"]))
    free = _states(ci_results["ContractFreeBeforeCopy"])
    assert any(_fun(a["rstate"])[r] in ("running", "preempted") and _fun(b["rstate"])[r] in ("done", "preempted")
               and r in running_reqs(a) and not _set(b["pinned"]) for a, b in zip(free, free[1:]) for r in _fun(a["rstate"]))
    undelayed = _states(ci_results["ContractReportUndelayed"])
    reported = {json.dumps(r) for r in _set(undelayed[-1]["misSent"])}
    assert reported and not any(_fun(s["rstate"])[r] == "delayed" for s in undelayed for r in reported)
    never = ci_results["ContractNeverReports"]
    loop = _states(never)[never["loop_index"]:] if never.get("loop_index") is not None else _states(never)[-1:]
    # TLC may close the lasso on either waiting state (which one depends on its search order): a delayed free
    # that is never reported, or a remote load that is never reported; in both the request waits the whole loop.
    stuck = set.intersection(*({r for r, v in _fun(s["rstate"]).items() if v in ("delayed", "recving")} for s in loop))
    assert stuck, [_fun(s["rstate"]) for s in loop]
