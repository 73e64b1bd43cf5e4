"""The reading rule the eighteenth blind round called for (two helpers wrote 12 files with answer keys, names that
mislead a reader and KV-cache groups; tests/fixtures/mro/corpus/blind_misleading_sets.py and its siblings are
judged with TLC by the corpus test):

* a preemption handler is the sliding-window fence (``wait_freed``) only when the word ``freed`` comes from what
  it is given (``metadata.freed_block_ids``, ``getattr(metadata, "freed_block_ids", ())``), never from a name the
  class chose for its own state: ``RetiringSaveConnector`` kept every store task in ``self._freed``, waited only
  the preempted requests' ones and was judged **safe** on the sliding-window model, truth unsafe."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from deferdump.tools.mro.behaviour import UNKNOWN
from support.mro import judge_cases
from test_mro_blind_round6 import HEADER, PROTOCOL, _labels

KEPT = """
def handle_preemptions(self, metadata):
    for req_id in metadata.preempted_req_ids:
        for task in [t for t in self._freed if self._owner[t] == req_id]:
            self.store.wait(task)
            self._freed.discard(task)
"""


@pytest.mark.parametrize("selection", [
    "self._freed",  # RetiringSaveConnector's table of every task
    "self._pick(self._freed_tasks)",  # through a helper's argument
])
def test_a_freed_named_table_the_class_keeps_is_no_fence(selection: str) -> None:
    hooks = KEPT.replace("self._freed if", f"{selection} if")
    for case in ("single", "hybrid"):
        label = _labels(hooks, case)["Proto.handle_preemptions"]
        assert label.label == UNKNOWN and "which the class keeps itself" in label.reasons[0], label


@pytest.mark.parametrize("freed", [
    "metadata.freed_block_ids",
    'getattr(metadata, "freed_block_ids", ())',  # the reference connector's spelling
])
def test_the_freed_blocks_the_metadata_carries_make_the_fence(freed: str) -> None:
    hooks = f"""
    def handle_preemptions(self, metadata):
        freed = set({freed})
        for task in list(self._pending):
            if task.reqs & set(metadata.preempted_req_ids) or task.blocks & freed:
                self.store.wait(task)
                self._pending.remove(task)
    """
    assert _labels(hooks, "hybrid")["Proto.handle_preemptions"].label == "wait_freed"
    # the same words kept under self, read from the metadata in the same handler, are still the metadata's
    kept = hooks.replace("freed = set(", "self._freed = freed = set(")
    assert _labels(kept, "hybrid")["Proto.handle_preemptions"].label == "wait_freed"


def test_the_kept_table_is_not_judged_safe_on_the_sliding_window_model(tmp_path: Path) -> None:
    """With TLC: the protocol whose preemption handler selects from ``self._freed`` (waiting the preempted
    requests' tasks only) was safe on the sliding-window model through the fence label; now that case is not."""
    hooks = KEPT + "def _note(self):\n    self._freed = set()\n    self._owner = {}\n"
    source = HEADER + textwrap.dedent(PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(hooks), "    ")))
    path = tmp_path / "kept_table.py"
    path.write_text(source)
    judgement = judge_cases([path], {"Proto": ["hybrid"]}).connectors["Proto"]
    assert [j.verdict for j in judgement.judgements] == [UNKNOWN], judgement.judgements


HMA_NO_FINISH = HEADER + """from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA


class NoFinishHMA(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._async_dump_req_ids = set()
        self._by_req = {}
    def build_connector_meta(self, scheduler_output):
        self._async_dump_req_ids.update(scheduler_output.saving)
        return scheduler_output
    def wait_for_save(self):
        meta = self._get_connector_metadata()
        self._async_dump_req_ids.update(meta.saving)
        task = self.store.dump(meta.blocks)
        for req_id in meta.saving:
            self._by_req.setdefault(req_id, []).append(task)
    def handle_preemptions(self, metadata):
        for req_id in metadata.preempted_req_ids:
            for task in self._by_req.pop(req_id, []):
                self.store.wait(task)
    def get_finished(self, finished_req_ids):
        done = finished_req_ids & self._async_dump_req_ids
        self._async_dump_req_ids -= done
        return done, None
{finish}
"""


def test_a_supports_hma_class_without_request_finished_all_groups_cannot_be_constructed(tmp_path: Path) -> None:
    """``SupportsHMA.request_finished_all_groups`` is an @abstractmethod: a ``SupportsHMA`` class that defines none
    cannot be constructed (the eighteenth blind round's ``_ForwardingHMAWrapper`` was judged unsafe, through a
    counterexample whose finish answered False, and as a MultiConnector child): unknown in every case. The twin
    that answers ``(False, None)`` is unsafe (its report comes before the dump ends)."""
    path = tmp_path / "no_finish.py"
    path.write_text(HMA_NO_FINISH.replace("{finish}", ""))
    for judgement in judge_cases([path], {"NoFinishHMA": ["single", "multi"]}).connectors["NoFinishHMA"].judgements:
        assert judgement.verdict == UNKNOWN, judgement
        assert any("constructing NoFinishHMA raises TypeError" in r for r in judgement.reasons), judgement.reasons
    path.write_text(HMA_NO_FINISH.replace("{finish}", FINISH.format(body="return False, None")))
    twin = judge_cases([path], {"NoFinishHMA": ["single"]}).connectors["NoFinishHMA"].judgements[0]
    assert twin.verdict == "unsafe", twin


FINISH = "    def request_finished_all_groups(self, request, block_ids):\n        {body}\n"


def test_a_counterexample_past_a_finish_that_raises_is_no_run(tmp_path: Path) -> None:
    """A ``request_finished_all_groups`` that only raises NotImplementedError (not abstract: the class is built)
    stops the engine at the first finish: a counterexample that goes past a finish is no run of the class, so the
    case is unknown, never unsafe (every reading of the finish fails here: the early report follows a finish)."""
    path = tmp_path / "raising_finish.py"
    path.write_text(HMA_NO_FINISH.replace("{finish}", FINISH.format(body="raise NotImplementedError")))
    judgement = judge_cases([path], {"NoFinishHMA": ["single"]}).connectors["NoFinishHMA"].judgements[0]
    assert judgement.verdict == UNKNOWN, judgement
    assert any("this counterexample goes on past a finish" in r for r in judgement.reasons), judgement.reasons
