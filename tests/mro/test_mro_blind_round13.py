"""The rules the thirteenth blind round called for (two helpers wrote 12 files, 44 classes, with answer keys:
tests/fixtures/mro/corpus/blind_{match_dispatch,shortcircuit_waits,class_level_tables,shallow_copies,
partial_callbacks,suppressed_errors}.py and blind_{cpu_offload_simple,hf3fs_style,flexkv_style,hisparse_style,
moriio_style,mooncake_store_style}.py, judged with TLC by the corpus test). Two wrong verdicts by reading:

* ``StepAliasConnector`` **safe**, its key unsafe. Its ``handle_preemptions`` waits every entry of ``self._previous``
  each step, read as "every pending task before each forward" (``wait_all_always``), but ``_previous`` is set by
  ``self._previous = self._current`` followed by ``self._current.clear()``: one list under two names, emptied before
  the drain ever sees a task. Now a drain of a container that another attribute is aliased into, or one that does
  not reach where the dumps are kept (directly, by a copy, or by a move that starts the old name afresh), is
  ``unknown``.
* ``MooncakeStyleStoreConnector`` **unsafe**, its key safe (and its ``V2`` unsafe on cases where only MLA is): the
  classes pin their dumps' blocks in vLLM's block pool (``BlockPool.touch``, given to the connector by
  ``bind_kv_cache_manager``) and drop the pins (``free_blocks``) once every rank reported; a finish answered False
  then frees nothing under a dump. The model frees blocks only as vLLM's requests do: every case of a class that
  takes or drops block references is ``unknown``, neither the model's counterexample nor its pass being the class's.
"""
from __future__ import annotations

from pathlib import Path

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.run.runner import run_report
from deferdump.tools.mro.source import read_files
from deferdump.tools.mro.tla import ModelBounds
from support.mro import RUN_TIMEOUT, judge_cases

_DRAINS = '''
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


class Copied(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._store = BlockStore()
        self._current = []
        self._previous = []

    def request_finished(self, request, block_ids):
        return False, None

    def wait_for_save(self):
        for rid, blocks in self._get_connector_metadata().stores:
            self._current.append(self._store.dump(blocks, rid))
        self._rotate()

    def _rotate(self):
        self._previous = list(self._current)
        self._current.clear()

    def handle_preemptions(self, metadata):
        for task in self._previous:
            self._store.wait(task)
        self._previous = []


class Aliased(Copied):
    def _rotate(self):
        self._previous = self._current
        self._current.clear()


class Swapped(Copied):
    def _rotate(self):
        self._previous, self._current = self._current, []


class Moved(Copied):
    def _rotate(self):
        self._previous = self._current
        self._current = []


class Elsewhere(Copied):
    def _rotate(self):
        self._previous = list(self._older)


class Returned(Copied):
    def wait_for_save(self):
        for rid, blocks in self._get_connector_metadata().stores:
            self._current.append(self._dump(blocks, rid))
        self._rotate()

    def _dump(self, blocks, rid):
        return self._store.dump(blocks, rid)


class ReturnedElsewhere(Returned):
    def _rotate(self):
        self._previous = list(self._older)


class InitAliased(Copied):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._previous = self._current

    def _rotate(self):
        self._current.clear()
'''


def _judge(tmp_path: Path, source: str) -> Judge:
    path = tmp_path / "connectors.py"
    path.write_text(source, encoding="utf-8")
    return Judge(build_hierarchy(read_files([path], None), sources=[path]), ModelRunner(ModelBounds(), 120))


def test_a_drain_counts_as_waiting_every_task_only_where_the_dumps_are_handed_to_it_whole(tmp_path: Path) -> None:
    judge = _judge(tmp_path, _DRAINS)
    for cls in ("Copied", "Swapped", "Moved", "Returned"):
        label = judge.reader.label(cls, "Copied", "handle_preemptions")
        assert label.label == "wait_all_always", (cls, label)
    for cls in ("Aliased", "InitAliased"):  # the alias made in a hook, or once in __init__
        aliased = judge.reader.label(cls, "Copied", "handle_preemptions")
        assert aliased.label == "unknown", cls
        assert "self._previous = self._current makes one container of the two" in aliased.reasons[0]
    for cls in ("Elsewhere", "ReturnedElsewhere"):  # the task appended directly, or returned by a helper
        elsewhere = judge.reader.label(cls, "Copied", "handle_preemptions")
        assert elsewhere.label == "unknown", cls
        assert "the dumps are kept in self._current" in elsewhere.reasons[0]


def test_the_transfer_facts_tell_a_copy_a_move_and_an_alias_apart(tmp_path: Path) -> None:
    judge = _judge(tmp_path, _DRAINS)
    transfers = {cls: judge.hierarchy.method(cls, "_rotate").attr_transfers
                 for cls in ("Copied", "Aliased", "Swapped", "Moved", "Elsewhere")}
    assert transfers == {
        "Copied": (("_previous", "_current", "copy"),),
        "Aliased": (("_previous", "_current", "alias"),),
        "Swapped": (("_previous", "_current", "moved"),),
        "Moved": (("_previous", "_current", "moved"),),
        "Elsewhere": (("_previous", "_older", "copy"),),
    }


_PINNED = '''
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata


class SaveMeta(KVConnectorMetadata):
    def __init__(self, stores):
        self.stores = stores


class Unpinned(KVConnectorBase_V1):
    """Delayed frees, waits in get_finished, no handle_preemptions: a preemption frees blocks a dump still reads."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.store = BlockStore()
        self._saving_reqs = set()
        self._inflight = []

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def build_connector_meta(self, scheduler_output):
        stores = [(new.req_id, list(new.block_ids[0])) for new in scheduler_output.scheduled_new_reqs]
        self._saving_reqs.update(rid for rid, _ in stores)
        return SaveMeta(stores)

    def request_finished(self, request, block_ids):
        if request.request_id in self._saving_reqs:
            self._saving_reqs.discard(request.request_id)
            return True, None
        return False, None

    def wait_for_save(self):
        for rid, blocks in self._get_connector_metadata().stores:
            self._saving_reqs.add(rid)
            self._inflight.append((self.store.dump(blocks, rid), {rid}))

    def get_finished(self, finished_req_ids):
        done = finished_req_ids & self._saving_reqs
        for entry in list(self._inflight):
            if entry[1] & done:
                self.store.wait(entry[0])
                self._inflight.remove(entry)
        self._saving_reqs -= done
        return done or None, None


class Pinned(Unpinned):
    """The same, each step's dump blocks pinned in vLLM's pool first (and unpinned elsewhere)."""

    def bind_kv_cache_manager(self, kv_cache_manager):
        self._manager = kv_cache_manager

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        pool = self._manager.block_pool
        for _, blocks in meta.stores:
            pool.touch([pool.blocks[b] for b in blocks])
        return meta
'''


def test_a_class_that_pins_blocks_in_vllms_pool_is_unknown_where_the_same_code_unpinned_is_unsafe(
        tmp_path: Path) -> None:
    """Real TLC: the same counterexample (a preemption frees a block its dump still reads, and the next forward
    writes it) is the unpinned class's run and not the pinned one's, whose pin keeps the block held."""
    judge = _judge(tmp_path, _PINNED)
    pinned = judge.judge("Pinned", ["single"])
    unpinned = judge.judge("Unpinned", ["single"])
    assert [j.verdict for j in unpinned.judgements] == ["unsafe"]
    (case,) = pinned.judgements
    assert case.verdict == "unknown"
    assert case.violated == "NoOverwriteWhileDumpingInv"
    assert any("Pinned.build_connector_meta calls touch() on vLLM's block pool" in r for r in case.reasons)


def test_running_leaves_a_class_that_pins_blocks_to_its_reading(tmp_path: Path) -> None:
    """The replay's engine frees a block when its requests let go of it and binds no block pool: a hazard it
    reaches in a pinning class may be one the pin prevents. The case is not run and says why; the unpinned
    class's counterexample is replayed and confirmed (a child process, the stub store)."""
    path = tmp_path / "connectors.py"
    path.write_text(_PINNED, encoding="utf-8")
    report = run_report(judge_cases([path], {"Pinned": ["single"], "Unpinned": ["single"]}), [path],
                        ("blockstore_client",), timeout=RUN_TIMEOUT)
    (pinned,) = report.connectors["Pinned"].judgements
    assert (pinned.verdict, pinned.source, pinned.run) == ("unknown", "reading", None)
    assert pinned.reasons[-1].endswith("not run: the replay's engine has no block pool for the class to pin blocks in")
    (unpinned,) = report.connectors["Unpinned"].judgements
    assert (unpinned.verdict, unpinned.source) == ("unsafe", "reading, replayed")
