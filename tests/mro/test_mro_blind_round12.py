"""The rule the twelfth blind round called for (two helpers wrote 12 files, 47 classes, with answer keys:
tests/fixtures/mro/corpus/blind_{mangled_hooks,mutating_iteration,loop_leak,task_equality,key_types,flag_states}.py
and blind_{remote_params,request_tracker,flush_jobs,sender_thread,worker_meta,shared_prefix}.py, judged with TLC by
the corpus test). One wrong verdict by reading: ``EagerFlagStateConnector`` **unsafe** on the sliding-window model,
where its key says safe. Its ``handle_preemptions`` first marks flags in ``for req_id in meta.preempted``, then waits
in ``for req_id, state in list(self._flags.items())`` under ``if self._must_drain(state)``, which this subclass makes
always true: every tracked request's tasks are waited before each forward (a fence). The reader closed the wait's
selection over every binding of ``req_id`` in the method, the first loop's ``meta.preempted`` included, and over
``self._flags[req_id] = …`` as if it rebound ``req_id``; so the wait read as chosen by preemption
(``wait_preempted``: no fence, unsafe on a hybrid model). Now a name bound by a loop around the wait holds that loop's
iterable only, and a subscript or attribute store rebinds nothing: the wait is not selected by preemption, and
the handler is ``unknown``. Reader tests without TLC."""
from __future__ import annotations

from pathlib import Path

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.run.runner import run_report
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES
from support.mro import RUN_TIMEOUT, judge_cases

CORPUS = FIXTURES / "mro" / "corpus"


def _judge(path: Path) -> Judge:
    return Judge(build_hierarchy(read_files([path], None), sources=[path]), ModelRunner(ModelBounds(), 60))


def test_a_wait_in_a_loop_over_every_tracked_request_is_not_chosen_by_an_earlier_loops_preempted_ids() -> None:
    judge = _judge(CORPUS / "blind_flag_states.py")
    for cls in ("FlagStateConnector", "EagerFlagStateConnector"):
        label = judge.reader.label(cls, "FlagStateConnector", "handle_preemptions")
        assert label.label == "unknown", (cls, label)
        assert "not selected by the preempted requests" in label.reasons[0]
        hybrid = {f"{l.owner}.{l.method}": l.label for l in judge._labels(cls, None, [], "hybrid")}  # noqa: SLF001
        assert hybrid["FlagStateConnector.handle_preemptions"] == "unknown"


_HANDLERS = '''
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


class Reused(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._store = BlockStore()
        self._tasks = {}
        self._seen = {}

    def handle_preemptions(self, metadata):
        for rid in metadata.finished_ids:
            self._seen[rid] = True
        for rid in metadata.preempted:
            for task in self._tasks.pop(rid, ()):
                self._store.wait(task)


class Swept(Reused):
    def handle_preemptions(self, metadata):
        for rid in metadata.preempted:
            self._seen[rid] = True
        for rid in list(self._tasks):
            for task in self._tasks.pop(rid, ()):
                self._store.wait(task)


class Renamed(Reused):
    def handle_preemptions(self, metadata):
        for rid in list(self._tasks):
            rid = metadata.preempted_map.get(rid, rid)
            for task in self._tasks.pop(rid, ()):
                self._store.wait(task)
'''


def test_the_loop_that_binds_the_name_decides_and_a_rebinding_in_its_body_counts(tmp_path: Path) -> None:
    """Opposites: waiting the preempted ids' tasks stays a preemption wait though another loop reuses the name
    for finished ids; a second loop over every task table key is not one, though the first loop's ``rid`` was
    the preempted ids; a name rebound inside its loop from the preempted requests is chosen by them again."""
    path = tmp_path / "reused_names.py"
    path.write_text(_HANDLERS, encoding="utf-8")
    judge = _judge(path)
    assert judge.reader.label("Reused", "Reused", "handle_preemptions").label == "wait_preempted"
    assert judge.reader.label("Swept", "Swept", "handle_preemptions").label == "unknown"
    assert judge.reader.label("Renamed", "Renamed", "handle_preemptions").label == "wait_preempted"


def test_a_flush_on_reuse_on_an_all_sliding_window_model_is_not_overwritten_through_the_models_full_group() -> None:
    """`mro --run`: ``ReuseFencedOffloader`` (not `SupportsHMA`) waits, before the forward, the store jobs of every
    block newly handed out (new requests' and cached requests' ``new_block_ids``) and of preempted requests; its key
    says safe on a model whose every layer is sliding-window. The model keeps a full-attention group beside that
    case's sliding-window group as a modelling aid; the class sees only the sliding-window group's blocks, and a
    sampled schedule had the forward write a full-attention block the class could not see handed out, under its
    dump: a wrong **unsafe** from running. Off the HMA path only the sliding-window group's writes are replayed;
    its sibling that flushes new requests' blocks only (key: unsafe) is still found on that model. Only that case
    is judged and run (every case of both: about 6 minutes)."""
    path = CORPUS / "blind_flush_jobs.py"
    hybrid = {"ReuseFencedOffloader": ["hybrid"], "AdmissionFencedOffloader": ["hybrid"]}
    report = run_report(judge_cases([path], hybrid), [path], ("blockstore_client",), timeout=RUN_TIMEOUT)
    fenced = {j.context.key: j for j in report.connectors["ReuseFencedOffloader"].judgements}
    assert fenced["hybrid"].verdict != "unsafe", fenced["hybrid"].run
    admission = {j.context.key: j for j in report.connectors["AdmissionFencedOffloader"].judgements}
    assert (admission["hybrid"].verdict, admission["hybrid"].source) == ("unsafe", "running"), admission["hybrid"].run


_SHAPE_CHECKER = '''
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA


class ShapeChecker(KVConnectorBase_V1):
    """Raises unless the scheduler output's block ids have vLLM 0.32's shapes (sched/output.py): a tuple of
    per-group lists of ints for new requests and for each cached request's new blocks (ints, not ``type(b) is
    int``: the replay's are ``BlockId``, an int subclass, so that the recording store can tell them from ints the
    class made)."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        cached = scheduler_output.scheduled_cached_reqs
        tables = [r.block_ids for r in scheduler_output.scheduled_new_reqs]
        tables += [ids for ids in cached.new_block_ids if ids is not None]
        for table in tables:
            if not (isinstance(table, tuple) and all(
                    isinstance(group, list) and all(isinstance(b, int) for b in group) for group in table)):
                raise TypeError(f"block ids {table!r}")
        return KVConnectorMetadata()

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass


class ShapeCheckerHMA(ShapeChecker, SupportsHMA):
    def request_finished_all_groups(self, request, block_ids):
        return False, None
'''


def test_cached_requests_new_block_ids_have_vllms_shape(tmp_path: Path) -> None:
    """A cached request's ``new_block_ids`` entry is a tuple with one list of block ids per KV-cache group; the
    replay gave a list wrapped in a list per group, and ``AdmissionFencedOffloader`` raised on it in every
    schedule (its hazard, a freed block handed to a running request, was never reached)."""
    from deferdump.tools.mro.run.explore import explore_class

    path = tmp_path / "shape_checker.py"
    path.write_text(_SHAPE_CHECKER, encoding="utf-8")
    for case, where in (("single", "non_hma"), ("hybrid", "hma"), ("hybrid", "non_hma")):
        cls = "ShapeCheckerHMA" if where == "hma" else "ShapeChecker"
        outcome = explore_class([str(path)], cls, where, case, (), schedules=40)
        assert outcome.detail == "no hazard in 40 explored schedules", (case, where, outcome.detail)
