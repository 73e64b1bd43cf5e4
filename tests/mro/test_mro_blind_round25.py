"""The reading rule the twenty-fifth blind round called for (two helpers wrote 12 files of mutant families: a base
design keyed safe and one-edit mutants of it, of this team's designs and of the field's — UCM PR #989, vLLM's
offloading connector, NIXL's send hold, LMCache's save spec; tests/fixtures/mro/corpus/blind_family_*.py and their
siblings are judged with TLC by the corpus test):

* **a store wait in a worker method the model has no action for ends dumps the model leaves running.**
  ``ReleaseSettledLayerConnector`` moves its layer-dump wait from ``wait_for_save`` into ``clear_connector_metadata``,
  which vLLM 0.32 calls in every step after the transfer results (kv_connector_model_runner_mixin.py ~105), before
  the step's output reaches the scheduler: every dump ends within its step. It was judged **unsafe** on a model with
  no wait at all, where the key says safe. A counterexample of such a class is now ``unknown`` (``--run`` replays it
  with every method vLLM calls)."""
from __future__ import annotations

import textwrap

import pytest

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_source
from deferdump.tools.mro.tla import ModelBounds

from test_mro_blind_round6 import HEADER, PROTOCOL

#: PR #989's protocol with its finish never delaying: its deferred dumps are freed under them (unsafe).
UNDELAYED = """
def request_finished(self, request, block_ids):
    return False, None
"""


def _single(hooks: str) -> tuple[str, tuple[str, ...]]:
    source = HEADER + textwrap.dedent(PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(UNDELAYED + hooks),
                                                                             "    ")))
    judge = Judge(build_hierarchy(read_source(source, "<t>")), ModelRunner(ModelBounds(), 60))
    judgement = judge.judge("Proto", cases=["single"]).judgements[0]
    return judgement.verdict, judgement.reasons


@pytest.mark.parametrize("method", ["clear_connector_metadata", "get_kv_connector_stats",
                                    "build_connector_worker_meta", "start_load_kv"])
def test_a_wait_where_the_model_has_no_action_leaves_the_counterexample_undecided(method: str) -> None:
    verdict, reasons = _single(f"""
def {method}(self, *args):
    for task in self._pending:
        self.store.wait(task)
    self._pending = []
""")
    assert verdict == "unknown" and any(f"Proto.{method} waits store tasks of self._pending, which its saves fill" in r for r in reasons), reasons


def test_without_the_wait_the_same_class_stays_unsafe() -> None:
    """The opposite: the clear drops the task list without waiting it, a hook that only polls, and a load wait
    over another table than the saves keep their tasks in (UCM's ``wait_for_layer_load``)."""
    assert _single("""
def clear_connector_metadata(self):
    self._pending = []
def get_kv_connector_stats(self):
    return {"done": sum(1 for task in self._pending if self.store.check(task))}
def wait_for_layer_load(self, layer_name):
    for task in self._short:
        self.store.wait(task)
""")[0] == "unsafe"


# -- the finish's answer resting on more than the tracking set -------------------------------------------------------
def _verdict(hooks: str) -> tuple[str, tuple[str, ...]]:
    source = HEADER + textwrap.dedent(PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(hooks), "    ")))
    judge = Judge(build_hierarchy(read_source(source, "<t>")), ModelRunner(ModelBounds(), 60))
    judgement = judge.judge("Proto", cases=["single"]).judgements[0]
    return judgement.verdict, judgement.reasons


@pytest.mark.parametrize("finish", [
    # FirstTokenChunkSaveConnector: held only for requests handed to a decode instance
    """held = request.request_id in self._async_dump_req_ids and bool((request.kv_transfer_params or {}).get("remote"))
self._async_dump_req_ids.discard(request.request_id)
return held, None""",
    # a flag read before the tracking set
    """if not self._sync and not block_ids:
    return False, None
if request.request_id in self._async_dump_req_ids:
    self._async_dump_req_ids.discard(request.request_id)
    return True, None
return False, None""",
    # a conditional expression
    """rid = request.request_id
tracked = rid in self._async_dump_req_ids
self._async_dump_req_ids.discard(rid)
return (tracked if request.status != "aborted" else False), None""",
])
def test_a_finish_whose_delay_also_rests_on_another_condition_is_not_delay_if_tracked(finish: str) -> None:
    """``FirstTokenChunkSaveConnector`` answers True only for tracked requests *and* ``do_remote_decode``: an
    ordinary request with dumps in flight is freed at once. Read as "delay if tracked" it was judged safe."""
    verdict, reasons = _verdict("def request_finished(self, request, block_ids):\n"
                                + textwrap.indent(finish, "    ") + "\n")
    assert verdict == "unknown" and any("its answer also rests on" in r for r in reasons), (verdict, reasons)


def test_a_finish_deciding_on_the_tracking_set_alone_stays_safe() -> None:
    for finish in ("""rid = request.request_id
held = rid in self._async_dump_req_ids
self._async_dump_req_ids.discard(rid)
return held, None""", """if request.request_id not in self._async_dump_req_ids:
    return False, None
self._async_dump_req_ids.discard(request.request_id)
return True, None"""):
        assert _verdict("def request_finished(self, request, block_ids):\n" + textwrap.indent(finish, "    ")
                        + "\n") == ("safe", ()), finish


# -- a helper keeping a save's task one per key ------------------------------------------------------------------------
KEEPING = """
def wait_for_save(self):
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    task = self.store.dump(meta.blocks)
    self._pending.append(task)
    for req_id in meta.saving:
        self._keep(req_id, task)
def _keep(self, req_id, task):
    KEEP
"""


def test_a_save_handing_its_task_to_a_helper_that_keeps_one_per_request_loses_the_earlier_ones() -> None:
    """``KeyedChunkSaveConnector._track_task`` stores ``self._tasks[req_id] = [task]``: a request's second chunk
    replaces its first, which nothing then waits. The helper's parameter was not followed: judged safe."""
    verdict, reasons = _verdict(KEEPING.replace("KEEP", "self._by_req[req_id] = [task]"))
    assert verdict == "unknown" and any("one per key" in r for r in reasons), (verdict, reasons)
    assert _verdict(KEEPING.replace("KEEP", "self._by_req.setdefault(req_id, []).append(task)")) == ("safe", ())


# -- the tracking set emptied where the model has no action --------------------------------------------------------------
def test_requests_taken_out_of_the_tracking_set_by_update_connector_output_leave_the_case_undecided() -> None:
    """``CompletionAwareDumpConnector`` drops a request from its scheduler-side set when the workers say its dumps
    landed, while a later chunk's dump runs: its finish then frees the request at once."""
    verdict, reasons = _verdict("""
def update_connector_output(self, connector_output):
    self._async_dump_req_ids -= set(connector_output.finished_sending or ())
""")
    assert verdict == "unknown" and any("takes requests out of the tracking set" in r for r in reasons), reasons
    assert _verdict("""
def update_connector_output(self, connector_output):
    self._recving |= set(connector_output.finished_recving or ())
""") == ("safe", ())


ASYNC_LOADS = """
def request_finished(self, request, block_ids):
    if request.request_id in self._recving:
        return False, None
    if request.request_id in self._async_dump_req_ids:
        self._async_dump_req_ids.discard(request.request_id)
        return True, None
    return False, None
def build_connector_meta(self, scheduler_output):
    self._async_dump_req_ids.update(scheduler_output.saving)
    for rid in scheduler_output.loading:
        self._recving.add(rid)
        UNTRACK
    return scheduler_output
def update_connector_output(self, finished_recving=()):
    self._recving.difference_update(finished_recving)
"""


def test_a_finish_answering_false_while_the_requests_load_runs_stays_delay_if_tracked() -> None:
    """The reference connector's shape: a request enters its loading set where it leaves the tracking set, and
    leaves the loading set at ``finished_recving``; while it waits for its load vLLM holds its blocks itself
    (``finish_requests`` ~2702-2708), so answering False for it frees nothing a dump reads. Without the untracking
    the two sets may overlap: a tracked request answered False."""
    untracked = _verdict(ASYNC_LOADS.replace("UNTRACK", "self._async_dump_req_ids.discard(rid)"))
    assert untracked == ("safe", ()), untracked
    verdict, reasons = _verdict(ASYNC_LOADS.replace("UNTRACK", "pass"))
    assert verdict == "unknown" and any("self._recving" in r for r in reasons), reasons
