"""`deferdump mro --run` through sampled schedules (tools/mro/run/search.py): where no counterexample is a
run of the class, 300 behaviours of its case's model are; a hazard found there is the class's own, and a
search that finds nothing leaves the case unknown. Also classes that hang or raise when run."""
from __future__ import annotations

import pytest

from deferdump.tools.mro.judge import Judge, ModelRunner, MroReport, judge_files
from deferdump.tools.mro.run.runner import run_report
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES
from support.mro import QUICK_RUN, RUN_TIMEOUT, judge_cases

pytestmark = pytest.mark.slow  # TLC's sampling and child processes: tests/conftest.py starts it early

RUNNABLE = FIXTURES / "mro" / "runnable"
COMMON = RUNNABLE / "runnable_common.py"
STORE = ("blockstore_client",)


@pytest.fixture(scope="module")
def unfenced() -> MroReport:
    paths = [RUNNABLE / "unfenced_hybrid.py", COMMON]
    return run_report(judge_cases(paths, {"UnfencedHybridConnector": ["single", "hybrid", "mla"]}), paths, STORE,
                      timeout=RUN_TIMEOUT)


def test_sampled_schedules_find_the_hazard_no_counterexample_shows(unfenced: MroReport) -> None:
    """The unfenced hybrid connector waits what it reports, so the worst-label counterexamples are not its
    runs; sampled behaviours of the hybrid model are, and one frees and rewrites a sliding-window block under
    its running dump. With one KV-cache group the connector is correct: the same search finds nothing, and
    those cases stay unknown (never safe). Its MultiConnector case is left out here (the one-group case's run)."""
    judgement = unfenced.connectors["UnfencedHybridConnector"]
    assert (judgement.verdict, judgement.context.case) == ("unsafe", "hybrid")
    cases = {j.context.key: j for j in judgement.judgements}
    hybrid = cases["hybrid"]
    assert (hybrid.verdict, hybrid.source, hybrid.violated) == ("unsafe", "running", "NoOverwriteWhileDumpingInv")
    assert "sampled schedule" in hybrid.run.detail and "still reads it" in hybrid.run.detail
    contexts = Judge(unfenced.hierarchy, ModelRunner(ModelBounds(), 60)).contexts("UnfencedHybridConnector")
    assert "layerwise" not in {c.key for c in contexts}  # its save_kv_layer does nothing: no per-layer tasks
    case = cases["single"]
    assert (case.verdict, case.source, case.run.status) == ("unknown", "reading", "diverged")
    assert "no hazard in 300 sampled schedules" in case.run.detail
    # two ranks, each a worker of its own: nothing found, as with one group
    assert (cases["mla"].verdict, cases["mla"].run.status) == ("unknown", "diverged"), cases["mla"].run
    assert "explored: no hazard in 200 explored schedules" in cases["mla"].run.detail


def test_flush_on_reuse_correct_stays_unknown_and_broken_is_unsafe_from_running() -> None:
    """Another safety design (vLLM's offloading style: never delay, wait the tasks reading blocks handed
    out this step before the forward). The correct class gives no hazard in any sampled schedule (run in two of
    its cases: one group and hybrid); the one that waits only on preemption is caught when a finished request's
    blocks are handed on."""
    path = RUNNABLE / "flush_on_reuse.py"
    cases = {"FlushOnReuse": ["single", "hybrid"], "FlushPreemptedOnly": ["single", "multi", "hybrid", "mla"]}
    report = run_report(judge_cases([path], cases), [path], STORE, timeout=RUN_TIMEOUT, budget=QUICK_RUN)
    correct = report.connectors["FlushOnReuse"]
    assert correct.verdict == "unknown"
    for case in correct.judgements:
        assert case.verdict == "unknown" and case.run.status in ("diverged", "not_runnable"), case.context.key
    broken = report.connectors["FlushPreemptedOnly"]
    assert (broken.verdict, broken.violated) == ("unsafe", "NoOverwriteWhileDumpingInv")
    assert {j.context.key for j in broken.judgements if j.source == "running"} == {"single", "multi", "hybrid", "mla"}


def test_a_class_that_hangs_or_raises_ends_the_run_cleanly_and_is_never_safe() -> None:
    """A class whose save blocks is ended at the run's timeout, one per rank or alone (one group and MLA's two
    ranks run); one whose planner raises stops its run with the error named. Neither case is ever safe."""
    paths = [RUNNABLE / "misbehaving.py"]
    cases = {"BlockingSaver": ["single", "mla"], "RaisingPlanner": ["single", "hybrid"]}
    report = run_report(judge_cases(paths, cases), paths, STORE, timeout=10)
    for name in ("BlockingSaver", "RaisingPlanner"):
        judgement = report.connectors[name]
        assert judgement.verdict != "safe", name
        for case in judgement.judgements:
            if case.run is not None:
                assert case.run.status in ("not_runnable", "diverged"), (name, case.context.key)
                assert case.source == "reading" or case.verdict == "unknown", (name, case.context.key)
    hung = [j.run for j in report.connectors["BlockingSaver"].judgements if j.run is not None]
    assert hung and all("did not end within 10 s" in run.detail or "2 ranks" in run.detail for run in hung)
    assert any("did not end within 10 s" in run.detail for run in hung)
    raised = [j.run for j in report.connectors["RaisingPlanner"].judgements if j.run is not None]
    assert raised and all("RuntimeError: the planner lost its table" in run.detail for run in raised)


def test_classes_that_read_the_layout_run_on_the_stub_config_and_a_missing_field_stops_the_run() -> None:
    """vLLM hands both roles a VllmConfig and the KV-cache layout; a class that sizes its plans by
    cache_config.block_size and picks the groups to dump from kv_cache_config runs. Dumping the sliding-window
    group too is caught on the hybrid model; dumping the full-attention groups alone is never called safe; a
    config field the stubs lack stops the run, named, and changes no verdict. The cases that show it are run."""
    paths = [RUNNABLE / "layout_groups.py", COMMON]
    cases = {"EveryGroupConnector": ["hybrid"], "GroupAwareConnector": ["single", "hybrid"],
             "PoolSizedConnector": ["single", "multi", "hybrid", "mla"]}
    report = run_report(judge_cases(paths, cases), paths, STORE, timeout=RUN_TIMEOUT, budget=QUICK_RUN)
    every = report.connectors["EveryGroupConnector"]
    cases = {j.context.key: j for j in every.judgements}
    assert (every.verdict, cases["hybrid"].verdict, cases["hybrid"].source) == ("unsafe", "unsafe", "running")
    assert "still reads it" in cases["hybrid"].run.detail
    aware = report.connectors["GroupAwareConnector"]
    assert all(j.verdict != "unsafe" for j in aware.judgements)
    assert {j.context.key: j.run.status for j in aware.judgements}["hybrid"] == "diverged"
    sized = report.connectors["PoolSizedConnector"]
    for case in sized.judgements:
        assert case.run.status == "not_runnable" and "CacheConfig.num_gpu_blocks" in case.run.detail
        assert case.verdict != "unsafe" or case.source.startswith("reading")


def test_an_independently_written_family_runs_and_its_unknowns_turn_into_the_truth() -> None:
    """A corpus family written blind (one dump task shared by several requests, reference counts): reading
    leaves all three unknown. Run, the class that frees the blocks when the last holder reports before the
    shared task ends is unsafe in every case (two ranks too), the one that dumps every KV-cache group only on the
    hybrid model (the answer key's cases exactly), and the correct one stays unknown. The cases that show it
    are run, on the tests' smaller budget."""
    path = FIXTURES / "mro" / "corpus" / "blind_shared_task_refcount.py"
    cases = {"SharedDumpConnector": ["single"], "LastHolderSharedConnector": ["single", "hybrid", "mla"],
             "AllGroupsSharedConnector": ["hybrid", "mla"]}
    report = run_report(judge_cases([path], cases), [path], STORE, timeout=RUN_TIMEOUT, budget=QUICK_RUN)
    verdicts = {name: {j.context.key: (j.verdict, j.source) for j in judgement.judgements}
                for name, judgement in report.connectors.items()}
    assert all(v[0] == "unknown" for v in verdicts["SharedDumpConnector"].values())
    last = verdicts["LastHolderSharedConnector"]
    assert {key: last[key] for key in ("single", "hybrid")} == {key: ("unsafe", "running") for key in ("single", "hybrid")}
    groups = verdicts["AllGroupsSharedConnector"]
    assert groups["hybrid"] == ("unsafe", "running")
    assert all(groups[key][0] == "unknown" for key in groups if key != "hybrid")
    # two ranks, a worker each: the last-holder release breaks on every rank, the all-groups dump only on
    # the hybrid model (its key: safe on MLA, one group)
    assert last["mla"] == ("unsafe", "running")
    assert groups["mla"] == ("unknown", "reading")


def test_sampled_schedules_leave_out_the_idle_stutter_so_no_finished_id_is_handed_twice() -> None:
    """A behaviour that runs out of work stutters in the spec's ``Idle`` up to the sampling depth, and TLC
    writes each stutter as a copy of the last state, its ``action`` record included. Read as schedules, the
    copies were further engine steps handing the last finished ids to ``build_connector_meta`` again (and
    ``get_finished`` reporting them again): vLLM 0.32 never does that (``Scheduler.schedule`` clears
    ``finished_req_ids``), and a class that reports what it is handed was called unsafe for it."""
    from deferdump.tools.mro.run.replay import plain
    from deferdump.tools.mro.run.search import SEARCH_DEPTH, schedule_traces

    judgement = judge_files([RUNNABLE / "flush_on_reuse.py"], only=["FlushOnReuse"]).connectors["FlushOnReuse"]
    single = next(j for j in judgement.judgements if j.context.key == "single")
    traces = schedule_traces(single.model or "", single.model_files, num=60)
    assert any(len(trace) < SEARCH_DEPTH for trace in traces)  # some behaviours reached Idle: cut there
    handed_twice = []
    for trace in traces:
        actions = [plain(entry["state"]["action"]) for entry in trace]
        handed: set[str] = set()
        for action in actions:
            for phase in action.get("phases", ()):
                if phase.get("name") != "schedule":
                    continue
                meta = next(c for c in phase["calls"] if c["name"] == "build_connector_meta")
                finished = set(meta["finished_req_ids"])
                handed_twice += sorted(finished & handed)
                handed = (handed - {str(a["req"]) for a in phase["allocated"]}) | finished
    assert handed_twice == []
