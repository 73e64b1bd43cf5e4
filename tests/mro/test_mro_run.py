"""`deferdump mro --run`: counterexamples replayed against the judged class itself, on stub vLLM with a
recording store (tools/mro/run/). The runnable connectors (tests/fixtures/mro/runnable/) are written in
full against vLLM's API and import their store client from `blockstore_client`, which exists nowhere but
as the recording store. Running confirms a hazard with the class's own calls, withdraws a reading's claim
that the class does not reach, overrules a reading's `safe` where the class runs into a hazard, and never
makes a class safe."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deferdump.tools.mro.behaviour import DefinitionLabel, EffectReader
from deferdump.tools.mro.judge import Context, ContextJudgement, MroReport, judge_files
from deferdump.tools.mro.run.replay import ReplayOutcome
from deferdump.tools.mro.run.runner import fold, run_report
from deferdump.tools.mro.run.store import BlockId, RecordingStore, StoreCallUnmodelled
from deferdump.tools.mro.run.stubs import StubMissing, stub_modules
from support import FIXTURES
from support.mro import QUICK_RUN, RUN_TIMEOUT, judge_cases

pytestmark = pytest.mark.slow  # TLC and child processes: tests/conftest.py starts it early

RUNNABLE = FIXTURES / "mro" / "runnable"
COMMON = RUNNABLE / "runnable_common.py"
STORE = ("blockstore_client",)


def _judged(name: str) -> tuple[MroReport, list[Path]]:
    paths = [RUNNABLE / name, COMMON]
    only = None
    if name == "report_unwaited.py":  # a subclass of the unfenced connector: its file is read too
        paths.append(RUNNABLE / "unfenced_hybrid.py")
        only = ["UnwaitedReportConnector"]
    return run_report(judge_files(paths, only=only), paths, STORE, timeout=RUN_TIMEOUT, budget=QUICK_RUN), paths


@pytest.fixture(scope="module")
def pr_style() -> MroReport:
    return _judged("pr_style_unfenced.py")[0]


@pytest.fixture(scope="module")
def unwaited() -> MroReport:
    return _judged("report_unwaited.py")[0]


# ---- the recording store and the stubs -----------------------------------------------------------------
def test_the_recording_store_tracks_what_each_task_reads_until_it_is_waited() -> None:
    store = RecordingStore()
    b = [BlockId(n) for n in range(5)]
    first = store.dump(([b[1], 0, b[2]], [b[3]]))  # per-group lists; 0 is the null block
    second = store.dump_data(b[4])
    assert first.blocks == {1, 2, 3} and second.blocks == {4}
    assert [t.ordinal for t in store.running_readers(2)] == [1] and not store.check(first)
    store.wait(first)
    assert store.check(first) and store.running_readers(2) == []
    assert store.complete(2) and not store.complete(3) and store.running_readers(4) == []
    with pytest.raises(StoreCallUnmodelled, match="store.load_data"):
        store.load_data([1])
    with pytest.raises(StoreCallUnmodelled, match="not a task"):
        store.wait(object())
    with pytest.raises(StoreCallUnmodelled, match="block ids"):
        store.dump(["b1"])


def test_the_recording_store_reads_only_block_ids_vllm_handed_out() -> None:
    """A dump of ints the class made (staging slots, ``int(b)``, offsets) names memory the replay does not model:
    it is not taken for KV blocks, so a class that copies blocks to host slots and dumps the slots is never
    called unsafe through slot numbers that equal block ids. Handed-out ids survive lists, slices and pickling."""
    import pickle
    store = RecordingStore()
    handed = [BlockId(1), BlockId(2)]
    carried = pickle.loads(pickle.dumps({"r1": handed[:1] + [0]}))  # metadata sent to a worker process
    assert store.dump(carried["r1"]).blocks == {1}
    for made in ([1], [int(handed[0])], [handed[0] + 0], (handed[1], 7)):
        with pytest.raises(StoreCallUnmodelled, match="an int the class computed"):
            store.dump(made)
    assert len(store.tasks) == 1  # a refused dump starts no task


def test_the_stub_request_answers_what_vllms_does_and_stops_on_anything_else() -> None:
    """A finishing request as vLLM hands it (tests/vllm/test_vllm_mro_stubs.py checks the names against vLLM's
    Request); a name the stub lacks stops the run as not runnable instead of reading as the class's own crash."""
    from deferdump.tools.mro.run import stubs

    request = stubs.Request(request_id="r1", prompt_token_ids=list(range(40)))
    assert (request.num_prompt_tokens, request.num_output_tokens, request.num_tokens) == (40, 0, 40)
    assert len(request.block_hashes) == 2 and request.block_hashes != stubs.Request("r2", list(range(40))).block_hashes
    assert request.status == stubs.RequestStatus.RUNNING and not request.is_finished()
    request.status = stubs.RequestStatus.FINISHED_ABORTED
    assert request.is_finished() and str(request.status) == "FINISHED_ABORTED"
    assert request.sampling_params.extra_args is None  # served since 2026-12-06 (the explorer's not_runnable cases)
    with pytest.raises(StubMissing, match="SamplingParams.max_tokens"):
        _ = request.sampling_params.max_tokens  # the replay's schedule decides a request's length, never a guess
    with pytest.raises(StubMissing, match="Request.lora_request"):
        _ = request.lora_request


def test_stub_vllm_imports_a_connector_module_and_leaves_sys_modules_as_it_was(tmp_path: Path) -> None:
    module = tmp_path / "stubbed_mod.py"
    module.write_text(textwrap.dedent("""
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
        from vllm.some.module.nobody.stubs import Helper
        from blockstore_client.sub import Client

        def make_store():
            return Client.connect("x")
    """))
    before = {name for name in sys.modules if name == "vllm" or name.startswith("vllm.")}
    store = RecordingStore()
    with stub_modules(STORE, store):
        sys.path.insert(0, str(tmp_path))
        try:
            import stubbed_mod  # type: ignore[import-not-found]

            assert stubbed_mod.make_store() is store
            assert stubbed_mod.KVConnectorRole.WORKER.name == "WORKER"
            with pytest.raises(StubMissing, match="vllm.some.module.nobody.stubs.Helper"):
                stubbed_mod.Helper()
        finally:
            sys.path.remove(str(tmp_path))
            sys.modules.pop("stubbed_mod", None)
    assert {name for name in sys.modules if name == "vllm" or name.startswith("vllm.")} == before
    assert "blockstore_client" not in sys.modules


# ---- verdicts ------------------------------------------------------------------------------------------
def test_a_reading_unsafe_is_replayed_with_the_class_own_calls(pr_style: MroReport) -> None:
    judgement = pr_style.connectors["PRStyleHybridConnector"]
    assert judgement.verdict == "unsafe"
    cases = {j.context.key: j for j in judgement.judgements}
    hybrid = cases["hybrid"]
    assert (hybrid.verdict, hybrid.source, hybrid.violated) == ("unsafe", "reading, replayed",
                                                                "NoOverwriteWhileDumpingInv")
    assert hybrid.run.status == "reproduced" and hybrid.run.hazard == "NoOverwriteWhileDumpingInv"
    assert "still reads it" in hybrid.run.detail
    # the calls the class really made, scheduler and worker, in vLLM's order
    assert any("worker.wait_for_save" in call for call in hybrid.run.calls)
    assert any("scheduler.build_connector_meta" in call for call in hybrid.run.calls)
    # the safe cases were run through sampled schedules of their models too, and stay safe
    assert all(cases[key].verdict == "safe" and cases[key].source == "reading" for key in ("single", "multi", "mla"))
    assert all(cases[key].run.status == "diverged" and "no hazard in" in cases[key].run.detail
               for key in ("single", "multi", "mla")), [cases[key].run for key in ("single", "multi", "mla")]
    # the MLA case runs two workers, one per tensor-parallel rank
    assert any(call.split(": ", 1)[1].startswith("worker 1.get_finished") for call in cases["mla"].run.calls)


def test_an_unknown_the_class_reproduces_becomes_unsafe_from_running(unwaited: MroReport) -> None:
    judgement = unwaited.connectors["UnwaitedReportConnector"]
    assert judgement.resolves["get_finished"] == "UnwaitedReportConnector"  # the rest from its base, another file
    assert judgement.resolves["wait_for_save"] == "UnfencedHybridConnector"
    assert (judgement.verdict, judgement.violated) == ("unsafe", "NoOverwriteWhileDumpingInv")
    single = next(j for j in judgement.judgements if j.context.key == "single")
    assert (single.verdict, single.source, single.run.status) == ("unsafe", "running", "reproduced")
    assert judgement.deciding is single and judgement.to_json()["source"] == "running"
    mla = next(j for j in judgement.judgements if j.context.key == "mla")  # two ranks, each reaches it
    assert (mla.verdict, mla.source, mla.run.status) == ("unsafe", "running", "reproduced"), mla.run


def test_a_reading_safe_the_class_runs_into_a_hazard_is_overruled_by_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reading that says more than the code does (here: a deferred dump read as a synchronous save) passes
    the model, so reading alone calls the class safe. --run also runs a safe case's class through sampled
    schedules of its passed model; the class's own dump, still running when its finished request's blocks
    are reused, makes the case unsafe from running."""
    forgetful = tmp_path / "forgetful.py"
    forgetful.write_text(textwrap.dedent('''
        from pr_style_unfenced import PRStyleHybridConnector


        class NeverDelayingConnector(PRStyleHybridConnector):
            """Defers its dumps like its base but never delays a finish or waits: the blocks go back while it reads."""

            def request_finished(self, request, block_ids):
                self._async_dump_req_ids.discard(request.request_id)
                return False, None

            def get_finished(self, finished_req_ids):
                return None, None  # nothing delayed, nothing to report (and nothing ever waited)
    '''))
    for name in ("pr_style_unfenced.py", COMMON.name):
        (tmp_path / name).write_text((RUNNABLE / name).read_text())
    paths = [forgetful, tmp_path / "pr_style_unfenced.py", tmp_path / COMMON.name]
    only = ["NeverDelayingConnector"]
    assert judge_files(paths, only=only).connectors["NeverDelayingConnector"].verdict == "unsafe"  # read right

    read_label = EffectReader.label

    def misread(self: EffectReader, cls: str, owner: str, method: str) -> DefinitionLabel:
        label = read_label(self, cls, owner, method)
        return DefinitionLabel(owner, method, "sync_save") if method == "wait_for_save" else label

    monkeypatch.setattr(EffectReader, "label", misread)
    misjudged = judge_cases(paths, {"NeverDelayingConnector": ["single"]})  # the case that shows it
    single = next(j for j in misjudged.connectors["NeverDelayingConnector"].judgements if j.context.key == "single")
    assert (single.verdict, single.counterexample) == ("safe", None) and single.model_files
    run = run_report(misjudged, paths, STORE, timeout=RUN_TIMEOUT).connectors["NeverDelayingConnector"]
    single = next(j for j in run.judgements if j.context.key == "single")
    assert (single.verdict, single.source, single.run.status) == ("unsafe", "running", "reproduced"), single.run
    assert single.violated == "NoOverwriteWhileDumpingInv" and "still reads it" in single.run.detail
    assert run.verdict == "unsafe"


def test_the_replay_asks_get_transfer_results_as_vllm_does(tmp_path: Path) -> None:
    """vLLM's runners call get_transfer_results (kv_connector_model_runner_mixin.py:94). A class whose
    get_finished waits (UnfencedHybridConnector's) but whose get_transfer_results reports at once reaches the
    hazard with one group; a replay calling get_finished would not have seen it."""
    early = tmp_path / "early_results.py"
    early.write_text(textwrap.dedent('''
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
        from unfenced_hybrid import UnfencedHybridConnector


        class EarlyResultsConnector(UnfencedHybridConnector):
            def get_transfer_results(self, finished_req_ids):
                done = {r for r in finished_req_ids if self._tasks.pop(r, None) is not None}
                return KVConnectorTransferResults(finished_sending=done)
    '''))
    for name in ("unfenced_hybrid.py", COMMON.name):  # beside it: the child imports them by module name
        (tmp_path / name).write_text((RUNNABLE / name).read_text())
    paths = [early, tmp_path / "unfenced_hybrid.py", tmp_path / COMMON.name]
    report = run_report(judge_files(paths, only=["EarlyResultsConnector"]), paths, STORE, timeout=RUN_TIMEOUT)
    judgement = report.connectors["EarlyResultsConnector"]
    single = next(j for j in judgement.judgements if j.context.key == "single")
    assert (single.verdict, single.source, single.run.status) == ("unsafe", "running", "reproduced"), (
        single.verdict, single.reasons, single.run)


def test_a_schedule_handing_a_finished_id_twice_is_not_a_run_vllm_makes() -> None:
    """vLLM 0.32 hands each finished id to the connector once (Scheduler.schedule clears finished_req_ids).
    Sampled schedules handed one twice in a row, and a class that reports every id it is handed once its dumps
    end (the seventh round's CoroutineLifecycleConnector, safe by its answer key) reported it twice: a wrong
    NoUnexpectedReportInv from running. Such a replay now diverges, and the reading verdict stands (one group
    and hybrid run)."""
    paths = [FIXTURES / "mro" / "corpus" / "blind_coroutine_lifecycle_connectors.py"]
    report = run_report(judge_cases(paths, {"CoroutineLifecycleConnector": ["single", "hybrid"]}), paths, STORE,
                        timeout=RUN_TIMEOUT, budget=QUICK_RUN)
    judgement = report.connectors["CoroutineLifecycleConnector"]
    assert judgement.verdict != "unsafe", judgement.reasons
    single = next(j for j in judgement.judgements if j.context.key == "single")
    assert single.verdict == "unknown" and single.run is not None, (single.verdict, single.run)
    assert single.run.status == "diverged", single.run  # before the guard: "reproduced", NoUnexpectedReportInv


def test_a_class_that_cannot_run_keeps_the_reading_verdict() -> None:
    """The corpus's connectors are excerpts (vLLM's abstract methods and their store helpers are not defined,
    so vLLM could not build them either): the reading verdict stands, and the outcome says why."""
    paths = [FIXTURES / "mro" / "corpus" / "hybrid_unfenced.py"]
    report = run_report(judge_files(paths), paths, timeout=RUN_TIMEOUT)
    hybrid = next(j for j in report.connectors["HybridDeferredConnector"].judgements if j.context.key == "hybrid")
    assert (hybrid.verdict, hybrid.source, hybrid.run.status) == ("unsafe", "reading", "not_runnable")
    assert "Can't instantiate abstract class HybridDeferredConnector" in hybrid.run.detail


def test_a_reading_unsafe_the_class_does_not_reach_is_withdrawn() -> None:
    judgement = ContextJudgement(Context("hma", None, "hybrid"), "unsafe", "NoOverwriteWhileDumpingInv")
    folded = fold(judgement, ReplayOutcome("diverged", "request_finished(r1) answered False"))
    assert folded.verdict == "unknown" and "does not reach it" in folded.reasons[0]
    kept = fold(judgement, ReplayOutcome("not_runnable", "no class"))
    assert (kept.verdict, kept.source) == ("unsafe", "reading")
    unknown = ContextJudgement(Context("hma", None, "single"), "unknown", "NoOverwriteWhileDumpingInv", ("why",))
    assert fold(unknown, ReplayOutcome("diverged", "answered otherwise")).verdict == "unknown"


# ---- the CLI -------------------------------------------------------------------------------------------
def _mro(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deferdump.tools.cli.app", "mro", *args],
                          capture_output=True, text=True, check=False)


def test_cli_run_reports_the_replay_in_json() -> None:
    out = _mro(str(RUNNABLE / "report_unwaited.py"), str(RUNNABLE / "unfenced_hybrid.py"), str(COMMON), "--run",
               "--store-module", "blockstore_client", "--json", "--class", "UnwaitedReportConnector",
               "--run-timeout", str(RUN_TIMEOUT))
    assert out.returncode == 1, out.stderr
    connector = json.loads(out.stdout)["connectors"]["UnwaitedReportConnector"]
    assert connector["verdict"] == "unsafe" and connector["source"] == "running"
    single = connector["cases"]["single"]
    assert single["run"]["status"] == "reproduced" and single["source"] == "running"


@pytest.mark.parametrize(("args", "message"), [
    (["--store-module", "x"], "--store-module needs --run"),
    (["--run", "--run-timeout", "0"], "--run-timeout 0: must be positive"),
])
def test_cli_refuses_bad_run_options_in_one_line(args: list[str], message: str) -> None:
    out = _mro(str(RUNNABLE / "report_unwaited.py"), *args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_a_run_budget_needs_a_schedule_of_each_kind_and_the_cli_default_is_the_full_one() -> None:
    from deferdump.tools.mro.run.explore import EXPLORED_SCHEDULES
    from deferdump.tools.mro.run.runner import RunBudget
    from deferdump.tools.mro.run.search import SEARCH_BEHAVIOURS

    assert RunBudget() == RunBudget(SEARCH_BEHAVIOURS, EXPLORED_SCHEDULES) == RunBudget(300, 200)
    for sampled, explored in ((0, 40), (60, 0)):
        with pytest.raises(ValueError, match="at least one schedule"):
            RunBudget(sampled, explored)
