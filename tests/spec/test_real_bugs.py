"""The CI models that reproduce the field's bugs (manifest key ``reproduces``): each counterexample shows the
bug's mechanism, its key connector calls in the order the thread describes (docs/real-bugs.md).

Like tests/spec/test_spec_models.py the tests that judge check results are marked `verify`: under `make verify`
they read that run's report, alone (``pytest -m verify tests/spec/test_real_bugs.py``) they run
``deferdump check`` on the reproducing models only.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from support.verify_report import verify_report
from deferdump.tools.tlc.manifest import load_manifest

pytestmark = pytest.mark.slow

MODELS = {e.name: e for e in load_manifest().models}
REPRODUCING = [e for e in MODELS.values() if e.reproduces is not None]
# The rows this file pins (the "Saves, preemption, ranks, windows" section with N11, and N2 and N10 of the
# asynchronous-load one), by model.
ROWS = {"OuterNoForward": "P4", "PreemptLate": "P1", "ExtraNotShipped": "P5", "CountNotForwarded": "P6",
        "RfagDelaysAll": "P7", "ReportLostOnError": "P9", "WaitOneSave": "P13", "SlidingWindow": "P14",
        "IdleIgnoresDelayed": "N12", "FenceCountsEmpty": "P3", "PreemptFenced": "N1", "ReqIdReuse": "P2",
        "MultiBothLoad": "N2", "HybridRecomputeInPlace": "N10", "SharedPrefixReadsInvalid": "N11"}


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, Any]]:
    """Check rows of the reproducing models: from `make verify`'s report, else one `deferdump check` of them."""
    report = verify_report()
    if report is not None:
        return {row["model"]: row for row in report["checks"]}
    proc = subprocess.run(
        [sys.executable, "-m", "deferdump.tools.cli.app", "check", *[e.name for e in REPRODUCING], "--json"],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    return {row["model"]: row for row in json.loads(proc.stdout)}


def _set(value: Any) -> list[Any]:
    return value["#set"]


def _int(value: Any) -> int:
    return int(value["#bigint"]) if isinstance(value, dict) else int(value)


def _key(value: Any) -> str:
    """A rank (ITF integer) as its digits, a request or block (model value) as its JSON text."""
    return str(_int(value)) if isinstance(value, (int, dict)) else json.dumps(value)


def _map(value: Any) -> dict[str, Any]:
    """An ITF function on ranks or requests as a dict keyed by `_key`."""
    return {_key(k): v for k, v in value["#map"]}


def _walk(value: Any) -> Iterator[dict[str, Any]]:
    """Every record with a `name`, in the order of the action history (phases, ranks, calls)."""
    if isinstance(value, dict):
        if isinstance(value.get("name"), str):
            yield value
        for key, item in value.items():
            if key == "#map":
                for _, sub in item:
                    yield from _walk(sub)
            else:
                yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def _steps(row: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Per trace state, the named records of its `action` in order."""
    return [list(_walk(step["state"]["action"])) for step in row["trace"]]


def _calls(row: dict[str, Any], name: str) -> list[tuple[int, dict[str, Any]]]:
    """(state index, record) of every call named `name`."""
    return [(i, c) for i, calls in enumerate(_steps(row)) for c in calls if c["name"] == name]


def _rank_calls(row: dict[str, Any], step: int) -> dict[str, list[dict[str, Any]]]:
    """The calls each rank made in the execute_model phase of trace state `step`, by rank."""
    for record in _walk(row["trace"][step]["state"]["action"]):
        if record["name"] == "execute_model":
            return {rank: calls["#tup"] if isinstance(calls, dict) else calls
                    for rank, calls in _map(record["ranks"]).items()}
    raise AssertionError(f"no execute_model in state {step}")


def _last(row: dict[str, Any], var: str) -> Any:
    return row["trace"][-1]["state"][var]


def _delayed_at_end(row: dict[str, Any]) -> set[str]:
    return {k for k, v in _map(_last(row, "reqState")).items() if v == "delayed"}


def test_every_row_of_the_section_is_reproduced_by_a_ci_mutant() -> None:
    for name, row in ROWS.items():
        entry = MODELS[name]
        assert (entry.tier, entry.row) == ("ci", row), name
        assert not entry.expect.passes, name
    twins = {e.name for e in MODELS.values() if e.name.endswith("Twin") and e.name != "CPTwin"}
    assert twins == {f"{n}Twin" for n in ROWS if n not in ("OuterNoForward", "SlidingWindow")}
    for twin in twins:  # the same bounds, the bug off: the protocol passes there
        assert MODELS[twin].expect.passes and MODELS[twin].tier == "ci"


@pytest.mark.parametrize("name", sorted(ROWS))
@pytest.mark.verify
def test_reproducing_model_violates_the_property_the_bug_breaks(rows: dict[str, dict[str, Any]], name: str) -> None:
    row = rows[name]
    assert row["status"] == "violation" and row["property"] == MODELS[name].expect.violation, row["message"]
    assert row["trace"]


@pytest.mark.verify
def test_p4_wrapper_answers_no_save_for_a_dumped_request(rows: dict[str, dict[str, Any]]) -> None:
    """UCM#989: r is tracked, yet the wrapper's request_finished is not UCM's: only the sibling delays r, no
    extra save is counted, the first report frees r and a later one reaches a freed request."""
    row = rows["OuterNoForward"]
    i_fin, fin = next((i, c) for i, c in _calls(row, "request_finished") if _set(c["delayed"]))
    r = _set(fin["delayed"])[0]
    assert not _set(fin["ucm_delayed"])
    assert any(r in _set(m["tracked"]) for i, m in _calls(row, "build_connector_meta") if i <= i_fin)
    emitted = [i for i, u in _calls(row, "_update_from_kv_xfer_finished") if r in _set(u["finished_sending"])]
    unexpected = [i for i, u in _calls(row, "_update_from_kv_xfer_finished") if r in _set(u["unexpected"])]
    assert len(emitted) == 2 and emitted[0] > i_fin and unexpected == [emitted[1]]


@pytest.mark.verify
def test_p1_preemption_handled_after_the_forward(rows: dict[str, dict[str, Any]]) -> None:
    """vllm#52360: the step that preempts r and hands its freed block to another request runs the forward
    (writing that block) before the worker waits r's queued save."""
    row = rows["PreemptLate"]
    step, meta = next((i, m) for i, m in _calls(row, "build_connector_meta") if _set(m["preempted_req_ids"]))
    dumped = {json.dumps(d["block"]): json.dumps(d["req"])
              for i, m in _calls(row, "build_connector_meta") if i < step for d in _set(m["dump"])}
    victim = {json.dumps(r) for r in _set(meta["preempted_req_ids"])}
    (calls,) = _rank_calls(row, step).values()
    order = [c["name"] for c in calls]
    assert order.index("forward") < order.index("handle_preemptions")
    forward = calls[order.index("forward")]
    written = {json.dumps(w["#tup"][0]) for w in _set(forward["writes"])}
    assert any(dumped.get(b) in victim for b in written), "the forward writes no block the victim's save reads"
    waited = _set(calls[order.index("handle_preemptions")]["waited"])
    assert any(w["blocking"] and victim & {json.dumps(r) for r in _set(w["reqs"])} for w in waited)


@pytest.mark.verify
def test_p5_extra_saves_never_reach_the_worker(rows: dict[str, dict[str, Any]]) -> None:
    """vllm#18246: both children delay r, the metadata showing r finished ships no extra save, the worker
    emits UCM's report alone (r is freed), and the second child's later report is unexpected."""
    row = rows["ExtraNotShipped"]
    i_fin, fin = next((i, c) for i, c in _calls(row, "request_finished") if _set(c["delayed"]))
    r = _set(fin["delayed"])[0]
    assert r in _set(fin["ucm_delayed"])
    i_meta, meta = next((i, m) for i, m in _calls(row, "build_connector_meta") if r in _set(m["finished_req_ids"]))
    assert i_meta > i_fin and not _set(meta["extra_async_saves"])
    reports = [(i, g) for i, g in _calls(row, "get_finished") if r in _set(g["finished_sending"])]
    (i_ucm, ucm), (i_sib, sib) = reports
    assert r in _set(ucm["ucm_sending"]) and r not in _set(ucm["sibling_sending"])
    assert i_sib > i_ucm and r in _set(sib["sibling_sending"])
    i_unexp = max(i for i, u in _calls(row, "_update_from_kv_xfer_finished") if r in _set(u["unexpected"]))
    assert i_unexp == i_sib


@pytest.mark.verify
def test_p6_silent_ranks_against_a_world_size_count(rows: dict[str, dict[str, Any]]) -> None:
    """vllm#53903: rank 0 reports r; rank 1 saw r finish yet reports nothing; the aggregator, expecting one
    report per rank, never emits r, which stays delayed on the lasso."""
    row = rows["CountNotForwarded"]
    (_, fin), = [(i, c) for i, c in _calls(row, "request_finished") if _set(c["delayed"])]
    r = _set(fin["delayed"])[0]
    step = next(i for i, m in _calls(row, "build_connector_meta") if r in _set(m["finished_req_ids"]))
    by_rank = {rank: next(c for c in calls if c["name"] == "get_finished")
               for rank, calls in _rank_calls(row, step).items()}
    assert r in _set(by_rank["0"]["finished_sending"])
    assert r in _set(by_rank["1"]["ucm_sending"]) and not _set(by_rank["1"]["finished_sending"])
    assert all(r not in _set(u["finished_sending"]) for _, u in _calls(row, "_update_from_kv_xfer_finished"))
    assert json.dumps(r) in _delayed_at_end(row) and row["loop_index"] is not None


@pytest.mark.verify
def test_p7_all_groups_delays_a_request_with_no_save(rows: dict[str, dict[str, Any]]) -> None:
    """vllm-ascend#10843: r is never dumped nor tracked, yet the HMA entry point delays it; no rank ever
    reports it."""
    row = rows["RfagDelaysAll"]
    (_, fin), = [(i, c) for i, c in _calls(row, "request_finished") if _set(c["delayed"])]
    r = _set(fin["delayed"])[0]
    assert all(r not in _set(m["tracked"]) and not _set(m["dump"]) for _, m in _calls(row, "build_connector_meta"))
    assert any(r in _set(g["finished_req_ids"]) for _, g in _calls(row, "get_finished"))
    assert all(not _set(g["finished_sending"]) for _, g in _calls(row, "get_finished"))
    assert json.dumps(r) in _delayed_at_end(row)


@pytest.mark.verify
def test_p9_a_wait_error_loses_the_report(rows: dict[str, dict[str, Any]]) -> None:
    """vllm#43742: r's save fails, the poll's check raises and keeps it, get_finished's wait of it raises
    and r is never reported."""
    row = rows["ReportLostOnError"]
    failed = [i for i, t in _calls(row, "task_complete") if t["outcome"] == "error"]
    assert failed
    i_gf, gf = next((i, g) for i, g in _calls(row, "get_finished") if _set(g["finished_req_ids"]))
    r = _set(gf["finished_req_ids"])[0]
    assert i_gf > failed[0]
    assert any(w["outcome"] == "error" and r in _set(w["reqs"]) for w in _set(gf["waited"]))
    assert r not in _set(gf["finished_sending"])
    assert all(r not in _set(u["finished_sending"]) for _, u in _calls(row, "_update_from_kv_xfer_finished"))
    assert json.dumps(r) in _delayed_at_end(row)


@pytest.mark.verify
def test_p13_one_save_waited_the_other_still_running(rows: dict[str, dict[str, Any]]) -> None:
    """LMCache#5062: r's two saves are submitted in two steps; get_finished waits one and reports r, r is
    freed, and a later forward rewrites r's block under the save still running."""
    row = rows["WaitOneSave"]
    i_gf, gf = next((i, g) for i, g in _calls(row, "get_finished") if _set(g["finished_sending"]))
    r = _set(gf["finished_sending"])[0]
    submits = [i for i, w in _calls(row, "wait_for_save") if _int(w["submitted"]) != 0 and r in _set(w["tracked"])]
    assert len(submits) == 2 and submits[-1] < i_gf
    assert len(_set(gf["waited"])) == 1
    running = [t for t in _set(_map(_last(row, "pending"))["0"])
               if t["status"] == "running" and r in _set(t["reqs"])]
    assert running, "no save of the reported request still runs"
    assert _map(_last(row, "reqState"))[json.dumps(r)] == "done"
    blocks = {json.dumps(b) for t in running for b in _set(t["blocks"])}
    last_forward = _calls(row, "forward")[-1]
    assert last_forward[0] > i_gf
    assert blocks & {json.dumps(w["#tup"][0]) for w in _set(last_forward[1]["writes"])}


@pytest.mark.verify
def test_p2_a_stale_completion_ends_the_readmitted_requests_count(rows: dict[str, dict[str, Any]]) -> None:
    """vllm#51637: r's save is waited at its preemption but its completion stays queued for the id (staleSaves);
    r is re-admitted under the same id and dumps again; when it finishes, get_finished counts the stale
    completion for the new save, waits nothing and reports r, and vLLM frees r's block while that save reads it."""
    row = rows["ReqIdReuse"]
    i_hp, hp = next((i, h) for i, h in _calls(row, "handle_preemptions") if _set(h["preempted_req_ids"]))
    r = _set(hp["preempted_req_ids"])[0]
    assert any(r in _set(t["reqs"]) for t in _set(hp["waited"])), "the preemption waited no save of the victim"
    stale = [i for i, step in enumerate(row["trace"]) if r in _set(_map(step["state"]["staleSaves"])["0"])]
    assert stale and stale[0] == i_hp
    readmitted = [i for i, s in _calls(row, "build_connector_meta") if i > i_hp and r in _set(s["tracked"])]
    assert readmitted, "the victim was not re-admitted and dumped under its id"
    i_gf, gf = next((i, g) for i, g in _calls(row, "get_finished") if r in _set(g["finished_sending"]))
    assert readmitted[0] <= i_gf and _set(gf["waited"]) == []
    running = [t for t in _set(_map(_last(row, "pending"))["0"]) if t["status"] == "running" and r in _set(t["reqs"])]
    assert running, "no save of the reported request still runs"
    assert _map(_last(row, "reqState"))[json.dumps(r)] == "done"
    assert _set(_map(_last(row, "staleSaves"))["0"]) == []  # the stale completion was consumed by that report


@pytest.mark.verify
def test_n12_engine_stops_with_a_delayed_request(rows: dict[str, dict[str, Any]]) -> None:
    """vllm#46579: r's free waits for the second child's report; the step that shows r finished reports
    UCM's part only, and then the engine stutters for ever with r delayed and the report pending."""
    row = rows["IdleIgnoresDelayed"]
    (_, fin), = [(i, c) for i, c in _calls(row, "request_finished") if _set(c["delayed"])]
    r = _set(fin["delayed"])[0]
    i_gf, gf = next((i, g) for i, g in _calls(row, "get_finished") if r in _set(g["finished_req_ids"]))
    assert r in _set(gf["ucm_sending"]) and not _set(gf["finished_sending"])
    assert i_gf == len(row["trace"]) - 1, "the engine stepped after the step that showed r finished"
    assert row["loop_index"] == len(row["trace"]) - 1  # stuttering in the last state
    assert json.dumps(r) in _delayed_at_end(row)
    assert r in _set(_map(_last(row, "sibPending"))["0"])


def _seq(value: Any) -> list[Any]:
    return value["#tup"] if isinstance(value, dict) else value


def _parked(row: dict[str, Any], i: int) -> list[dict[str, Any]]:
    return _set(row["trace"][i]["state"]["parked"])


@pytest.mark.verify
def test_p3_a_fence_on_an_empty_step_is_never_drained(rows: dict[str, dict[str, Any]]) -> None:
    """UCM#1350: async scheduling with deferred frees; a schedule preempts the fenced requester itself
    (nothing allocated, an empty step) and parks its block with a fence that counts that empty step; the
    empty step's output is processed, the fence has passed, and no drain returns the block."""
    row = rows["FenceCountsEmpty"]
    i, meta = next((i, m) for i, m in _calls(row, "build_connector_meta") if _set(m["preempted_req_ids"]))
    (schedule,) = [c for c in _steps(row)[i] if c["name"] == "schedule"]
    assert not _set(schedule["allocated"]), "the preempting step allocates nothing"
    inflight = _seq(row["trace"][i]["state"]["inflight"])
    assert len(inflight) == 2 and _set(inflight[0]["ran"]) and not _set(inflight[1]["ran"])
    assert [e["by"] for e in _parked(row, i)] == ["preempt"]
    updates = [j for j, _ in _calls(row, "update_from_output") if j > i]
    assert updates and updates[-1] == len(row["trace"]) - 1, "the violation comes with processing a step"
    assert not _seq(row["trace"][-1]["state"]["inflight"]) or len(updates) >= 2
    assert all(_parked(row, j) for j in range(i, len(row["trace"]))), "the parked block was returned"
    assert [_int(e["wait"]) for e in _parked(row, len(row["trace"]) - 1)] == [0]


@pytest.mark.verify
def test_n1_preempting_fenced_victims_frees_nothing(rows: dict[str, dict[str, Any]]) -> None:
    """vllm#49674: the in-flight step ran both requests; the next schedule, short of a block, preempts
    them both, their blocks are parked by deferred frees, and nothing is allocated."""
    row = rows["PreemptFenced"]
    i, meta = next((i, m) for i, m in _calls(row, "build_connector_meta") if _set(m["preempted_req_ids"]))
    victims = set(_set(meta["preempted_req_ids"]))
    assert len(victims) == 2
    before = _seq(row["trace"][i - 1]["state"]["inflight"])
    assert before and victims <= set(_set(before[-1]["ran"]))
    (schedule,) = [c for c in _steps(row)[i] if c["name"] == "schedule"]
    assert not _set(schedule["allocated"])
    held = {json.dumps(b) for r in victims for b in _seq(_map(row["trace"][i - 1]["state"]["blocksOf"])[json.dumps(r)])}
    parked = [e for e in _parked(row, i) if e["by"] == "preempt"]
    assert parked and held == {json.dumps(b) for e in parked for b in _set(e["blocks"])}


@pytest.mark.verify
def test_n2_both_children_load_and_the_later_receive_is_unexpected(rows: dict[str, dict[str, Any]]) -> None:
    """vllm#53049: MultiConnector gives r's external tokens to both children, both start a load of r's block;
    one child's finished_recving (the union has no count) moves r on, the scheduler promotes it out of
    WAITING_FOR_REMOTE_KVS, and the other child's later finished_recving reaches a request that no longer
    waits for remote KV (vLLM asserts, scheduler.py ~3224-3230)."""
    row = rows["MultiBothLoad"]
    i_alloc, alloc = next((i, a) for i, a in _calls(row, "update_state_after_alloc") if _set(a["ucm_external"]))
    r = _set(alloc["ucm_external"])[0]
    assert r in _set(alloc["sibling_external"]), "the second child was not given r's external tokens"
    i_sl, sl = next((i, c) for i, c in _calls(row, "start_load_kv") if _set(c["submitted"]))
    assert i_sl == i_alloc
    assert [t["#tup"][0] for t in _set(sl["submitted"])] == [r]
    assert _set(sl["submitted"]) == _set(sl["sibling_submitted"]), "the children did not load the same block"
    reports = [(i, g) for i, g in _calls(row, "get_finished") if r in _set(g["finished_recving"])]
    assert len(reports) == 2, "r is not reported received twice"
    (i_first, first), (i_second, second) = reports
    children = {"ucm": "ucm_recving", "sib": "sibling_recving"}
    (early,) = [c for c, key in children.items() if r in _set(first[key])]
    (late,) = [c for c, key in children.items() if r in _set(second[key])]
    assert early != late, "one child reported r twice"
    done = {c["child"]: i for i, c in _calls(row, "load_complete") if c["req"] == r}
    assert done[early] < i_first < done[late] <= i_second, "the second load was not still running at the first report"
    running = [t for t in _set(_map(row["trace"][i_first]["state"]["loadTasks"])["0"]) if t["req"] == r]
    assert [(t["child"], t["status"]) for t in running] == [(late, "running")]
    promoted = [i for i, u in _calls(row, "_update_waiting_for_remote_kv") if r in _set(u["reqs"])]
    assert promoted and i_first < promoted[0] <= i_second, "r was not promoted between the two reports"
    updates = [u for i, u in _calls(row, "_update_from_kv_xfer_finished") if i == i_second and "finished_recving" in u]
    assert [r in _set(u["unexpected"]) for u in updates] == [True]
    assert _map(_last(row, "reqState"))[json.dumps(r)] != "remote"
    assert _set(_last(row, "unexpectedReports")) == [r]


@pytest.mark.verify
def test_n2_the_first_childs_report_lets_the_block_go_under_the_other_load(rows: dict[str, dict[str, Any]]) -> None:
    """vllm#51786 (the late write): both children load r's block; one child's finished_recving (a child given 0
    tokens reports at once) promotes r, or frees it if it was aborted while it waited, while the other child's
    load still writes the block: r computes on it, or the pool hands it to another request."""
    row = rows["MultiBothLoadWrite"]
    i_sl, sl = next((i, c) for i, c in _calls(row, "start_load_kv") if _set(c["submitted"]))
    assert _set(sl["submitted"]) == _set(sl["sibling_submitted"]), "the children did not load the same block"
    (load,) = _set(sl["submitted"])
    r, block = load["#tup"]
    reports = [(i, g) for i, g in _calls(row, "get_finished") if r in _set(g["finished_recving"])]
    assert len(reports) == 1, "r was reported received other than once"
    (i_first, first), = reports
    (early,) = [c for c, key in (("ucm", "ucm_recving"), ("sib", "sibling_recving")) if r in _set(first[key])]
    tasks = [t for t in _set(_map(_last(row, "loadTasks"))["0"]) if t["req"] == r]
    assert [(t["child"], t["status"], t["block"]) for t in tasks] == [
        ("sib" if early == "ucm" else "ucm", "running", block)], "the other child's load is not still writing"
    state = _map(_last(row, "reqState"))[json.dumps(r)]
    held = [json.dumps(b) for b in _seq(_map(_last(row, "blocksOf"))[json.dumps(r)])]
    assert state == "running" or (state == "done" and held == []), (state, held)
    if state == "done":  # aborted while it waited: vLLM's delayed free ends at the first report
        aborts = [i for i, c in _calls(row, "finish_requests") if c["req"] == r and _set(c["delayed"]) == [r]]
        assert aborts and aborts[0] < i_first


@pytest.mark.verify
def test_n10_a_failed_hybrid_load_recomputed_in_place_writes_the_null_block(rows: dict[str, dict[str, Any]]) -> None:
    """vllm#56733: on a hybrid model a hit of a two-block prompt takes two full-attention blocks and, in the
    sliding-window group, the null block for the first prompt block (out of the window) and one block for
    the last; the load fails, the request keeps those blocks and recomputes its prompt in them, and the
    forward writes the first block's sliding-window KV into the null block every request shares."""
    row = rows["HybridRecomputeInPlace"]
    i_hit, hit = next((i, c) for i, c in _calls(row, "get_num_new_matched_tokens") if _set(c["load_async"]))
    (r,) = _set(hit["load_async"])
    (schedule,) = [c for c in _steps(row)[i_hit] if c["name"] == "schedule"]
    allocated = sorted((a for a in _set(schedule["allocated"]) if a["req"] == r), key=lambda a: _int(a["idx"]))
    assert [(_int(a["idx"]), a["hit"]) for a in allocated] == [(1, True), (2, True)]
    assert _is_null(allocated[0]["sw"]) and not _is_null(allocated[1]["sw"]), "the first block left the window"
    loads = [c for i, c in _calls(row, "start_load_kv") if i == i_hit]
    loaded = {json.dumps(t["#tup"][1]) for c in loads for t in _set(c["submitted"]) if t["#tup"][0] == r}
    assert len(loaded) == 3 and not any(_is_null(json.loads(b)) for b in loaded), "the load writes no null block"
    assert any(c["req"] == r and c["outcome"] == "failed" for _, c in _calls(row, "load_complete"))
    i_fail = next(i for i, c in _calls(row, "get_finished") if r in _set(c.get("failed_recving", {"#set": []})))
    i_redo, _ = next((i, u) for i, u in _calls(row, "_update_waiting_for_remote_kv") if r in _set(u["failed"]))
    assert i_fail < i_redo == len(row["trace"]) - 1, "the recompute follows the failed receive and ends the trace"
    (forward,) = [c for i, c in _calls(row, "forward") if i == i_redo]
    written = {(_int(t["#tup"][0]) if _is_null(t["#tup"][0]) else json.dumps(t["#tup"][0]), _int(t["#tup"][2]))
               for t in _set(forward["sw_writes"]) if t["#tup"][1] == r}
    assert (0, 1) in written, "the recompute did not write the first block's sliding-window KV into the null block"
    last = row["trace"][-1]["state"]
    assert last["nullWrites"] is True and _map(last["reqState"])[json.dumps(r)] == "running"
    assert _is_null(_seq(_map(last["swBlocksOf"])[json.dumps(r)])[0]), "the request still holds the null block"



@pytest.mark.verify
def test_n11_a_sharer_runs_on_a_block_whose_recompute_is_still_to_come(rows: dict[str, dict[str, Any]]) -> None:
    """vllm#49250: two requests with the same prompt share a block (the prefix cache); the load of it fails;
    vLLM lets the first affected request recompute it and the other keep it as computed, and when the
    recompute's chunk comes later the other request runs on the block first, over the failed load's KV."""
    row = rows["SharedPrefixReadsInvalid"]
    i_share, share = next((i, c) for i, c in _calls(row, "schedule") if _set(c["shared"]))
    (sharing,) = _set(share["shared"])
    sharer, block = sharing["#tup"]
    i_fail, fail = next((i, c) for i, c in _calls(row, "_update_requests_with_invalid_blocks"))
    assert i_share <= i_fail, "the block was shared when its load failed"
    (owner,) = _set(fail["reqs"])
    assert owner != sharer and set(_set(fail["affected"])) == {owner, sharer}, "both hold the failed block"
    loads = [c for i, c in _calls(row, "build_connector_meta") if any(l["req"] == owner for l in _set(c["load"]))]
    assert loads and all(l["block"] == block for c in loads for l in _set(c["load"]) if l["req"] == owner)
    assert _set(_last(row, "invalidKV")) == [block]
    (i_read, read), = [(i, c) for i, c in _calls(row, "schedule") if _set(c["invalid_reads"])]
    assert i_fail < i_read == len(row["trace"]) - 1
    assert _set(read["invalid_reads"]) == [sharer] and _set(read["recompute_later"]) == [owner]
    assert not any(w["#tup"][0] == block for c in (c for i, c in _calls(row, "forward") if i == i_read)
                   for w in _set(c["writes"])), "nothing rewrote the block before the sharer read it"
    assert row["trace"][-1]["state"]["staleReads"] is True


def _is_null(value: Any) -> bool:
    """Is this ITF value vLLM's null block (the integer 0; real blocks are model values)?"""
    return isinstance(value, (int, dict)) and _int(value) == 0
