"""The explorer (tools/mro/run/explore.py): vLLM's moves chosen from the class's own answers, so a class
whose answers no model's labels describe is still run, and the MLA case with a worker per rank, each in a
process of its own. Every hazard it reports must be one vLLM can reach: correct classes (the corpus keys'
safe cases) never show one."""
from __future__ import annotations

from pathlib import Path

import pytest

from deferdump.tools.mro.judge import judge_files
from deferdump.tools.mro.run.explore import explore_class
from deferdump.tools.mro.run.runner import run_report
from support import FIXTURES
from support.mro import QUICK_RUN, RUN_TIMEOUT, judge_cases

CORPUS = FIXTURES / "mro" / "corpus"
RUNNABLE = FIXTURES / "mro" / "runnable"
STORE = ("blockstore_client",)


def explore(path: Path, cls: str, case: str, hma: bool = False, schedules: int = 200,  # type: ignore[no-untyped-def]
            multi: bool = False):
    where = "multi" if multi else "hma" if hma else "non_hma"
    return explore_class([str(path)], cls, where, case, STORE, schedules=schedules)


def test_an_undelayed_abort_no_label_describes_is_found_and_its_safe_case_stays_clean() -> None:
    """`AbortDropConnector` delays a finished request's free until its dump is waited, except on an abort
    (vLLM sets FINISHED_ABORTED): no label says "delay unless aborted", so every model schedule diverges at
    its first finish. The explorer aborts a request whose dump runs; the freed blocks are handed on and
    rewritten. On the all-sliding-window model (its key: safe) nothing is found."""
    path = CORPUS / "blind_abort_policy_connectors.py"
    single = explore(path, "AbortDropConnector", "single")
    assert (single.status, single.hazard) == ("reproduced", "NoOverwriteWhileDumpingInv"), single
    assert "explored schedule" in single.detail and "still reads it" in single.detail
    # the abort the class does not delay, its own answer in the calls
    assert any("scheduler.request_finished" in call and "aborted) -> free now" in call for call in single.calls)
    assert explore(path, "AbortDropConnector", "hybrid").status == "diverged"


def test_mla_runs_a_worker_per_rank_and_frees_on_get_finished_count_reports() -> None:
    """Two tensor-parallel ranks, vLLM's KVOutputAggregator counting `get_finished_count() or world_size`
    reports. `LeaderReportConnector` counts 1 and only rank 0 waits: rank 1's dump reads a block freed on
    rank 0's report. Its two siblings are safe on MLA (their keys), and the explorer finds nothing there."""
    path = CORPUS / "blind_rank_reports.py"
    leader = explore(path, "LeaderReportConnector", "mla")
    assert (leader.status, leader.hazard) == ("reproduced", "NoOverwriteWhileDumpingInv"), leader
    assert "of rank 1" in leader.detail and "worker 1" in leader.detail
    assert any(call.endswith("scheduler.get_finished_count()") for call in leader.calls)
    for safe in ("AllRanksReportConnector", "LeaderDumpConnector"):
        outcome = explore(path, safe, "mla", schedules=QUICK_RUN.explored)
        assert outcome.status == "diverged", safe
        assert f"no hazard in {QUICK_RUN.explored} explored schedules" in outcome.detail, safe
    # with one rank the leader is the only worker: safe (its key), nothing found
    assert explore(path, "LeaderReportConnector", "single", schedules=QUICK_RUN.explored).status == "diverged"


def test_each_rank_has_its_own_module_state_as_in_vllms_worker_processes() -> None:
    """A class-level registry keyed by (request, step) would be shared by two ranks in one process, and rank
    1's entry would overwrite rank 0's; vLLM runs each rank in a process of its own (the multiprocessing
    executor), where the class is safe. The explorer imports the class afresh per rank and sends the metadata
    to each as a pickled copy."""
    outcome = explore(CORPUS / "blind_class_registry_connectors.py", "StepKeyedRegistryConnector", "mla")
    assert outcome.status == "diverged", outcome
    assert "no hazard" in outcome.detail and "raising" not in outcome.detail


_UNPICKLABLE = '''
import threading
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata


class LockedMeta(KVConnectorMetadata):
    def __init__(self):
        self.lock = threading.Lock()  # a lock does not pickle


class LockedConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return LockedMeta()

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass
'''


def test_metadata_that_cannot_reach_another_process_is_not_run_on_two_ranks(tmp_path: Path) -> None:
    path = tmp_path / "locked_meta.py"
    path.write_text(_UNPICKLABLE, encoding="utf-8")
    mla = explore(path, "LockedConnector", "mla", schedules=5)
    assert mla.status == "not_runnable" and "does not pickle" in mla.detail, mla
    assert explore(path, "LockedConnector", "single", schedules=5).status == "diverged"  # one process: no copy


@pytest.mark.parametrize(("path", "cls", "hma"), [
    (RUNNABLE / "flush_on_reuse.py", "FlushOnReuse", True),
    (CORPUS / "blind_abort_policy_connectors.py", "AbortDropConnector", False),
])
def test_the_explorer_never_reports_a_hazard_on_a_correct_case(path: Path, cls: str, hma: bool) -> None:
    """The moves are vLLM's: a class correct in a case (flush on reuse: every task reading a block handed out
    again is waited before the forward, on one group and on the hybrid model with its window frees; the
    abort-dropping class on the sliding-window model) runs 400 schedules without a hazard."""
    cases = ("single", "hybrid") if cls == "FlushOnReuse" else ("hybrid",)
    for case in cases:
        outcome = explore(path, cls, case, hma=hma, schedules=400)
        assert outcome.status == "diverged" and "no hazard in 400" in outcome.detail, (case, outcome)


def test_a_schedule_that_preempts_admits_nothing_as_in_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.32 schedules no waiting (or preempted) request in a step that preempted (scheduler.py ~899-900): a
    victim is never resumed in the schedule that freed its blocks. The explorer once did, and a class taking "admitted
    and not scheduled" for its victims (`AdmittedMirrorConnector`, thirtieth blind round, keyed safe in every case)
    was reported unsafe by running: its victim was in ``num_scheduled_tokens`` beside its freed blocks."""
    from deferdump.tools.mro.run import explore as explorer, replay

    phases: list[dict | None] = []  # None: a fresh engine (the next explored schedule)
    schedule, start = replay._Replay.schedule, explorer._Explorer.__init__  # noqa: SLF001

    def recording(self, phase):  # type: ignore[no-untyped-def]
        phases.append(phase)
        return schedule(self, phase)

    def starting(self, *args):  # type: ignore[no-untyped-def]
        phases.append(None)
        start(self, *args)

    monkeypatch.setattr(replay._Replay, "schedule", recording)  # noqa: SLF001
    monkeypatch.setattr(explorer._Explorer, "__init__", starting)  # noqa: SLF001
    explore(RUNNABLE / "flush_on_reuse.py", "FlushOnReuse", "single", hma=True, schedules=200)
    running: set[str] = set()
    preempting = 0
    for phase in phases:
        if phase is None:
            running = set()
            continue
        allocated = {a["req"] for a in phase["allocated"]}
        if phase["preempted"]:
            preempting += 1
            assert allocated <= running - set(phase["preempted"]), phase
        running = (running | allocated) - set(phase["preempted"])
    assert preempting > 20, preempting  # the explorer does preempt
    for case, multi in (("single", False), ("mla", False), ("single", True)):
        outcome = explore(CORPUS / "blind_victim_selection.py", "AdmittedMirrorConnector", case, hma=True,
                          multi=multi)
        assert outcome.status == "diverged" and "no hazard in 200" in outcome.detail, (case, multi, outcome)


def test_a_class_dumping_host_staging_slots_is_not_judged_through_slot_numbers() -> None:
    """`StagingCopyConnector` copies blocks into host slots in `wait_for_save` and dumps the slots: the forward
    never writes what its store reads. Slot numbers once passed for block ids and the explorer reported the
    forward overwriting "block 1" under a task reading slot 1, a hazard in a case its key calls safe."""
    for case in ("single", "hybrid"):
        outcome = explore(CORPUS / "blind_staging_copy.py", "StagingCopyConnector", case, schedules=30)
        assert outcome.status == "not_runnable" and "an int the class computed" in outcome.detail, (case, outcome)


def test_flush_on_reuse_broken_is_found_by_the_explorer_too() -> None:
    """`FlushPreemptedOnly` waits only for preempted requests: a finished request's blocks are handed on
    and rewritten under its running dump."""
    outcome = explore(RUNNABLE / "flush_on_reuse.py", "FlushPreemptedOnly", "single", hma=True)
    assert (outcome.status, outcome.hazard) == ("reproduced", "NoOverwriteWhileDumpingInv"), outcome


def test_run_report_turns_an_unknown_the_model_cannot_schedule_into_unsafe_from_exploring() -> None:
    """Through `mro --run`: reading leaves `AbortDropConnector` unknown, its counterexample and the sampled
    schedules diverge at the first finish (it delays where the worst labels do not), and the explorer's
    schedules reach the hazard: unsafe from running, the explored schedule named."""
    path = CORPUS / "blind_abort_policy_connectors.py"
    report = run_report(judge_cases([path], {"AbortDropConnector": ["single", "hybrid"]}), [path], STORE,
                        timeout=RUN_TIMEOUT)
    judgement = report.connectors["AbortDropConnector"]
    cases = {j.context.key: j for j in judgement.judgements}
    assert (cases["single"].verdict, cases["single"].source) == ("unsafe", "running"), cases["single"].run
    assert "explored schedule" in cases["single"].run.detail
    assert cases["hybrid"].verdict != "unsafe"  # its key: safe on the sliding-window model
    assert judgement.verdict == "unsafe"


_HMA_ONLY_DELAY = '''
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA


class Meta(KVConnectorMetadata):
    def __init__(self, saves, preempted):
        self.saves, self.preempted = saves, preempted


class GroupsOnlyDelay(KVConnectorBase_V1, SupportsHMA):
    """Delays through request_finished_all_groups only; request_finished is the base's (False, None)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.store = BlockStore()
        self.tasks = {}
        self.dumping = set()
        self.new = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.new[request.request_id] = list(blocks.get_block_ids()[0])

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def build_connector_meta(self, scheduler_output):
        meta = Meta(self.new, set(scheduler_output.preempted_req_ids))
        self.dumping |= set(self.new)
        self.new = {}
        return meta

    def request_finished_all_groups(self, request, block_ids):
        return request.request_id in self.dumping, None

    def wait_for_save(self):
        for rid, ids in self._get_connector_metadata().saves.items():
            self.tasks.setdefault(rid, []).append(self.store.dump(ids, rid))

    def handle_preemptions(self, metadata):
        for rid in metadata.preempted:
            for task in self.tasks.pop(rid, []):
                self.store.wait(task)

    def get_finished(self, finished_req_ids):
        sent = set()
        for rid in finished_req_ids:
            for task in self.tasks.pop(rid, []):
                self.store.wait(task)
            sent.add(rid)
        return sent or None, None
'''


def test_as_a_multiconnector_child_the_siblings_report_frees_under_a_dump_the_class_did_not_delay(
        tmp_path: Path) -> None:
    """MultiConnector calls the children's `request_finished` (the non-HMA path): a class that delays only in
    `request_finished_all_groups` (UCM's FAWA inherits a `request_finished` that answers False) leaves the
    delay to the sibling, whose report frees the blocks (no extra async save pending: multi_connector.py
    ~357-376) while the class's dump still reads them, or, once the class freed them by its own report,
    reaches vLLM a second time. At the top level (HMA path) it delays and waits before it reports: clean."""
    path = tmp_path / "groups_only.py"
    path.write_text(_HMA_ONLY_DELAY, encoding="utf-8")
    multi = explore(path, "GroupsOnlyDelay", "single", multi=True)
    assert multi.status == "reproduced", multi
    assert any("sibling.get_finished -> sent" in call for call in multi.calls), multi.calls[-12:]
    assert any("scheduler.request_finished(" in call and "-> free now" in call for call in multi.calls)
    single = explore(path, "GroupsOnlyDelay", "single", hma=True, schedules=300)
    assert single.status == "diverged" and "no hazard in 300" in single.detail, single


@pytest.mark.parametrize(("path", "cls"), [
    (CORPUS / "blind_oldest_k.py", "OldestFirstConnector"),
    (CORPUS / "blind_frozen_state.py", "FrozenRecordConnector"),
])
def test_a_child_that_delays_and_reports_once_is_clean_beside_the_sibling(path: Path, cls: str) -> None:
    """Classes that delay a request with dumps and report it once they waited them, as MultiConnector children
    (their keys: safe there): both children delay, MultiConnector counts one extra async save, and the request
    is freed after both reported; 400 schedules, no hazard."""
    outcome = explore(path, cls, "single", multi=True, schedules=400)
    assert outcome.status == "diverged" and "no hazard in 400" in outcome.detail, outcome


def test_the_frozen_record_stats_hole_as_a_child_is_found() -> None:
    """Round 11's `FrozenRecordStatsConnector` (read safe as a MultiConnector child before the partial-wait
    rule; its key: unsafe there) drops its deferred dump's task and reports the request: the sibling's report
    and its own release the blocks under the dump."""
    outcome = explore(CORPUS / "blind_frozen_state.py", "FrozenRecordStatsConnector", "single", multi=True)
    assert (outcome.status, outcome.hazard) == ("reproduced", "NoOverwriteWhileDumpingInv"), outcome



class _OrderedSet(set):  # type: ignore[type-arg]
    """A set that iterates in a chosen order, as a process's string hashing may."""

    def __init__(self, items: list[str]) -> None:
        super().__init__(items)
        self.order = items

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.order)


def test_the_siblings_reports_depend_on_the_seed_not_on_set_order() -> None:
    """The explorer's schedules come from its seed alone: the sibling's reports are drawn over the owed ids in
    sorted order, not in the set's iteration order (string hashing differs per process, PYTHONHASHSEED), so a
    hazard one `mro --run` child finds repeats in another."""
    import random
    from types import SimpleNamespace

    from deferdump.tools.mro.run.explore import _Explorer, _Plan

    chosen = []
    for order in (["r1", "r2", "r3", "r4"], ["r4", "r3", "r2", "r1"]):
        phases: list[dict] = []  # type: ignore[type-arg]
        replay = SimpleNamespace(hybrid=False, path="multi", ranks=[0], sibling_owed=_OrderedSet(order),
                                 execute_model=phases.append)
        explorer = _Explorer(replay, _Plan(((1, 0),), pool=2, complete_p=0.0, abort_p=0.0),  # type: ignore[arg-type]
                             random.Random(7))
        explorer._execute([])  # noqa: SLF001
        chosen.append(phases[0]["ranks"][0][-1]["sibling_sending"])
    assert chosen[0] == chosen[1] and 0 < len(chosen[0]) < 4, chosen
