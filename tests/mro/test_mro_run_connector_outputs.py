"""The rest of what vLLM 0.32 asks a connector each step, run as vLLM runs it (tools/mro/run/replay.py): after its
transfer results each rank's worker answers ``get_block_ids_with_load_errors``, ``get_kv_connector_stats`` and
``get_kv_connector_kv_cache_events`` (kv_connector_model_runner_mixin.py ~100-103), aggregated over the ranks and
handed to the scheduler-side ``update_connector_output`` (kv_connector/utils.py ~130-170); after the frees the
scheduler side answers its own ``get_kv_connector_stats`` and ``take_events`` (scheduler.py ~2340-2380). A class may
wait, poll or drop store tasks in any of them: an engine that skips them runs another class than vLLM does."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from deferdump.tools.mro.run.explore import explore_class
from support.mro import QUIET_METHODS

STEP_SAVER = """
from dataclasses import dataclass, field
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.distributed.kv_events import KVConnectorKVEvents

@dataclass
class Saves(KVConnectorMetadata):
    saves: dict = field(default_factory=dict)

@dataclass
class StepStats(KVConnectorStats):
    def aggregate(self, other):
        return StepStats({"bytes": self.data.get("bytes", 0) + other.data.get("bytes", 0)})
    def is_empty(self):
        return not self.data

class StepEvents(KVConnectorKVEvents):
    def __init__(self, events):
        self.events, self.workers = list(events), 1
    def add_events(self, events):
        self.events += events
    def aggregate(self):
        return self
    def increment_workers(self, count=1):
        self.workers += count
    def get_all_events(self):
        return self.events
    def get_number_of_workers(self):
        return self.workers
    def clear_events(self):
        self.events = []

class StepSaver(KVConnectorBase_V1):
    \"\"\"Dumps each step's new blocks at the end of the forward and never delays a free: the step's dumps are
    waited in FENCE, which vLLM calls before the step's output leaves the worker.\"\"\"
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._store = BlockStore() if role == KVConnectorRole.WORKER else None
        self._step_tasks = []
    def build_connector_meta(self, scheduler_output):
        meta = Saves({n.req_id: list(n.block_ids[0]) for n in scheduler_output.scheduled_new_reqs})
        cached = scheduler_output.scheduled_cached_reqs
        for rid, ids in zip(cached.req_ids, cached.new_block_ids):
            if ids and ids[0]:
                meta.saves[rid] = list(ids[0])
        return meta
    def wait_for_save(self):
        for rid, blocks in self._get_connector_metadata().saves.items():
            self._step_tasks.append(self._store.dump(blocks, rid))
    def _settle(self):
        done, self._step_tasks = len(self._step_tasks), []
        return done
    def get_kv_connector_stats(self):
        if self._store is None:
            return None
        return StepStats({"bytes": STATS_WAIT})
    def get_kv_connector_kv_cache_events(self):
        return StepEvents([EVENTS_WAIT])
""" + QUIET_METHODS


def _explore(tmp_path: Path, source: str, cls: str, case: str) -> tuple[str, str]:
    path = tmp_path / "step_saver.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    outcome = explore_class([str(path)], cls, "non_hma", case, ["blockstore_client"], schedules=30)
    return outcome.status, outcome.detail


WAIT_ALL = "sum(self._store.wait(t) for t in self._step_tasks) + self._settle()"


@pytest.mark.parametrize("case", ["single", "mla"])
def test_dumps_waited_in_the_workers_stats_hook_end_before_any_free(tmp_path: Path, case: str) -> None:
    """vLLM asks the worker's stats each step, before the step's output (and any finish) reaches the scheduler:
    the dumps waited there end before their blocks can be freed. An engine that never asked freed them running
    (reproduced in every case before the replay called the hook)."""
    source = STEP_SAVER.replace("STATS_WAIT", WAIT_ALL).replace("EVENTS_WAIT", "0")
    assert _explore(tmp_path, source, "StepSaver", case) == ("diverged", "no hazard in 30 explored schedules")


def test_dumps_waited_in_the_workers_events_hook_end_before_any_free(tmp_path: Path) -> None:
    source = STEP_SAVER.replace("STATS_WAIT", "0").replace("EVENTS_WAIT", WAIT_ALL)
    assert _explore(tmp_path, source, "StepSaver", "single") == ("diverged", "no hazard in 30 explored schedules")


def test_with_no_hook_waiting_them_the_same_dumps_are_overwritten(tmp_path: Path) -> None:
    """The opposite: the stats count the tasks without waiting them (``check`` never blocks)."""
    counting = "sum(1 for t in self._step_tasks if self._store.check(t)) + self._settle()"
    source = STEP_SAVER.replace("STATS_WAIT", counting).replace("EVENTS_WAIT", "0")
    status, detail = _explore(tmp_path, source, "StepSaver", "single")
    assert status == "reproduced" and "still reads it" in detail, detail


HOLDING = """
from dataclasses import dataclass, field
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

@dataclass
class Saves(KVConnectorMetadata):
    saves: dict = field(default_factory=dict)
    preempted: set = field(default_factory=set)

@dataclass
class Running(KVConnectorStats):
    def aggregate(self, other):
        return Running({"running": self.data.get("running", set()) | other.data.get("running", set())})
    def is_empty(self):
        return not self.data.get("running")

class Holding(KVConnectorBase_V1):
    \"\"\"The workers report a finished request at once; their stats list the requests whose dumps still run, and
    the scheduler side holds a report back until no rank lists it.\"\"\"
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._saving, self._parked, self._tasks = set(), set(), []
        self._store = BlockStore() if role == KVConnectorRole.WORKER else None
    def build_connector_meta(self, scheduler_output):
        meta = Saves({n.req_id: list(n.block_ids[0]) for n in scheduler_output.scheduled_new_reqs},
                     set(scheduler_output.preempted_req_ids or ()))
        cached = scheduler_output.scheduled_cached_reqs
        for rid, ids in zip(cached.req_ids, cached.new_block_ids):
            if ids and ids[0]:
                meta.saves[rid] = list(ids[0])
        self._saving |= set(meta.saves)
        return meta
    def request_finished(self, request, block_ids):
        held = request.request_id in self._saving
        self._saving.discard(request.request_id)
        return held, None
    def handle_preemptions(self, metadata):
        for rid, task in self._tasks:
            if rid in metadata.preempted:
                self._store.wait(task)
    def wait_for_save(self):
        for rid, blocks in self._get_connector_metadata().saves.items():
            self._tasks.append((rid, self._store.dump(blocks, rid)))
    def get_finished(self, finished_req_ids):
        return set(finished_req_ids) or None, None
    def get_kv_connector_stats(self):
        if self._store is None:
            return SCHEDULER_STATS
        self._tasks = [(rid, task) for rid, task in self._tasks if not self._store.check(task)]
        return Running({"running": {rid for rid, _ in self._tasks}})
    def update_connector_output(self, connector_output):
        stats = connector_output.kv_connector_stats
        running = stats.data.get("running", set()) if stats is not None else set()
        self._parked |= set(connector_output.finished_sending or ())
        ready = self._parked - running
        self._parked -= ready
        connector_output.finished_sending = ready or None
    TAKE_EVENTS
""" + QUIET_METHODS


@pytest.mark.parametrize("case", ["single", "mla"])
def test_the_workers_stats_reach_update_connector_output_aggregated_over_the_ranks(tmp_path: Path,
                                                                                   case: str) -> None:
    """On two ranks each rank's stats reach the engine core pickled and accumulate through ``aggregate``; the
    scheduler side holds every report whose dumps a rank still runs. Before, the output carried no stats: the
    class released every report at once and its running dumps were overwritten."""
    source = HOLDING.replace("SCHEDULER_STATS", "None").replace("TAKE_EVENTS", "")
    assert _explore(tmp_path, source, "Holding", case) == ("diverged", "no hazard in 30 explored schedules")


def test_released_at_once_the_same_reports_free_running_dumps(tmp_path: Path) -> None:
    source = HOLDING.replace("SCHEDULER_STATS", "None").replace("TAKE_EVENTS", "").replace(
        "ready = self._parked - running", "ready = set(self._parked)")
    status, detail = _explore(tmp_path, source, "Holding", "single")
    assert status == "reproduced" and "still reads it" in detail, detail


def test_the_scheduler_sides_stats_and_events_are_asked_after_the_frees(tmp_path: Path) -> None:
    """vLLM asks the scheduler side's stats (``is_empty``, then aggregated into the workers') and then
    ``take_events`` every step (scheduler.py ~2340-2380): a class raising there ends the run at that call."""
    raising = "def take_events(self):\n        raise RuntimeError('taken')"
    source = HOLDING.replace("SCHEDULER_STATS", "Running({'running': {'x'}})").replace("TAKE_EVENTS", raising)
    status, detail = _explore(tmp_path, source, "Holding", "single")
    assert status == "diverged" and "scheduler.take_events raised RuntimeError: taken" in detail, detail


def test_a_worker_reporting_load_errors_is_not_a_run_the_replay_can_follow(tmp_path: Path) -> None:
    """The replay drives no loads: a class that reports failed loads would have vLLM reschedule requests
    (scheduler.py ~2062) the replay never does."""
    source = (STEP_SAVER.replace("STATS_WAIT", WAIT_ALL).replace("EVENTS_WAIT", "0")
              + "    def get_block_ids_with_load_errors(self):\n        return {1}\n")
    status, detail = _explore(tmp_path, source, "StepSaver", "single")
    assert status == "diverged" and "get_block_ids_with_load_errors answered [1]" in detail, detail


STUBBED_NAMES = """
from dataclasses import dataclass, field
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole
from vllm.distributed.parallel_state import get_pp_group, get_tp_group
from vllm.distributed.kv_events import BlockStored, MEDIUM_STORAGE
from vllm.utils.math_utils import cdiv

@dataclass
class Saves(KVConnectorMetadata):
    saves: dict = field(default_factory=dict)

class Named(KVConnectorBase_V1):
    \"\"\"Reads the names real connectors read: the pipeline stage, the layer count, the port, sampling
    parameters; publishes BlockStored events.\"\"\"
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._layers = vllm_config.model_config.get_total_num_hidden_layers()
        assert self._layers == len([n for g in kv_cache_config.kv_cache_groups for n in g.layer_names])
        self._port = int(vllm_config.kv_transfer_config.kv_port) + get_tp_group().rank_in_group
        self._store = None
        if role == KVConnectorRole.WORKER:
            assert get_pp_group().world_size == 1 and get_pp_group().is_last_rank
            self._store = BlockStore(port=self._port)
        self._events = []
    def build_connector_meta(self, scheduler_output):
        meta = Saves()
        for n in scheduler_output.scheduled_new_reqs:
            meta.saves[n.req_id] = list(n.block_ids[0])[:cdiv(16, 16)]
        return meta
    def request_finished(self, request, block_ids):
        extra = request.sampling_params.extra_args or {}
        self._events.append(BlockStored(block_hashes=[request.request_id], parent_block_hash=None, token_ids=[],
                                        block_size=16, lora_id=None, medium=MEDIUM_STORAGE, lora_name=None))
        return bool(extra.get("hold")), None
    def take_events(self):
        events, self._events = self._events, []
        return events
    def wait_for_save(self):
        for rid, blocks in self._get_connector_metadata().saves.items():
            self._store.dump(blocks, rid)
""" + QUIET_METHODS


@pytest.mark.parametrize("case", ["single", "mla"])
def test_the_names_real_connectors_read_are_served(tmp_path: Path, case: str) -> None:
    """``get_pp_group``, ``get_tp_group``, ``cdiv``, ``get_total_num_hidden_layers``, ``kv_port``,
    ``Request.sampling_params`` and the KV events stopped such a class as not runnable (the whole-corpus explorer:
    89 cases). Served as vLLM 0.32 has them, the class runs, and its unwaited dumps (never delayed) are found."""
    status, detail = _explore(tmp_path, STUBBED_NAMES, "Named", case)
    assert status == "reproduced" and "still reads it" in detail, detail
