"""The scheduler side deciding frees, run as vLLM runs it (tools/mro/run/replay.py): each rank's
``build_connector_worker_meta`` is aggregated through ``aggregate`` and handed to ``update_connector_output``, and vLLM
frees the ids ``finished_sending`` holds *after* that call (scheduler.py ~3218-3235). The twenty-fourth blind round's
``PublishedEventsConnector`` reports a request from its workers at once and holds it back on the scheduler side until
every rank's metadata says its dumps ended; an engine freeing on the workers' reports overwrites dumps vLLM keeps
safe."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from deferdump.tools.mro.run.explore import explore_class
from support.mro import QUIET_METHODS

HOLDING = """
from dataclasses import dataclass, field
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorWorkerMetadata)

@dataclass
class Saves(KVConnectorMetadata):
    saves: dict = field(default_factory=dict)
    preempted: set = field(default_factory=set)

@dataclass
class Running(KVConnectorWorkerMetadata):
    running: set = field(default_factory=set)
    def aggregate(self, other):
        return Running(self.running | other.running)

class Holding(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._saving, self._parked, self._tasks, self._closing = set(), set(), [], set()
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
        done, self._closing = self._closing | set(finished_req_ids), set()
        return done or None, None
    def build_connector_worker_meta(self):
        self._tasks = [(rid, task) for rid, task in self._tasks if not self._store.check(task)]
        return Running({rid for rid, _ in self._tasks})
HOOK
""" + QUIET_METHODS

UPDATE = """
    def update_connector_output(self, connector_output):
        meta = connector_output.kv_connector_worker_meta
        running = meta.running if meta is not None else set()
        self._parked |= set(connector_output.finished_sending or ())
        ready = self._parked - running
        self._parked -= ready
        connector_output.finished_sending = ready or None
"""


def _explore(tmp_path: Path, hook: str, case: str) -> tuple[str, str]:
    path = tmp_path / "holding.py"
    path.write_text(textwrap.dedent(HOLDING).replace("HOOK", hook), encoding="utf-8")
    outcome = explore_class([str(path)], "Holding", "non_hma", case, ["blockstore_client"], schedules=30)
    return outcome.status, outcome.detail


@pytest.mark.parametrize("case", ["single", "mla"])
def test_a_scheduler_side_holding_reports_until_the_workers_metadata_says_the_dumps_ended_is_clean(
        tmp_path: Path, case: str) -> None:
    assert _explore(tmp_path, textwrap.indent(textwrap.dedent(UPDATE), "    "), case) == (
        "diverged", "no hazard in 30 explored schedules")


def test_without_the_scheduler_side_hold_the_workers_early_reports_free_running_dumps(tmp_path: Path) -> None:
    status, detail = _explore(tmp_path, "", "single")
    assert status == "reproduced" and "still reads it" in detail, detail


def test_a_scheduler_side_that_passes_on_a_request_it_never_delayed_is_the_schedulers_assertion(
        tmp_path: Path) -> None:
    adding = UPDATE.replace("connector_output.finished_sending = ready or None",
                            "connector_output.finished_sending = (ready | {'r9'}) or None")
    status, detail = _explore(tmp_path, textwrap.indent(textwrap.dedent(adding), "    "), "single")
    assert status == "reproduced" and "update_connector_output passes ['r9']" in detail, detail


HISPARSE = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_hisparse_style.py"


def test_short_of_blocks_vllm_waits_for_the_frees_a_class_says_are_pending_instead_of_preempting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``FencedSpillConnector`` pins nothing: while a spill runs, ``has_pending_block_frees`` is True and vLLM 0.32
    schedules no more running requests rather than preempt one (scheduler.py ~787-791), so a running spill's blocks
    are never handed out with one group. The explorer preempted anyway: a false hazard in every case keyed safe (the
    whole-corpus explorer of 2026-12-06, once ``get_block_ids`` let the class run). The sliding-window case stays
    unsafe: out-of-window frees are no preemption."""
    def explore(case: str) -> str:
        return explore_class([str(HISPARSE)], "FencedSpillConnector", "hma", case, ["blockstore_client"],
                             schedules=30).status

    assert explore("single") == "diverged" and explore("hybrid") == "reproduced"
    from deferdump.tools.mro.run import replay
    monkeypatch.setattr(replay._Replay, "scheduler_asks", lambda self, method: False)  # noqa: SLF001
    assert explore("single") == "reproduced"
