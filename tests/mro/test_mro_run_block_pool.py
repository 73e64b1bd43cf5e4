"""Classes that pin blocks in vLLM's GPU block pool, and report completions through worker metadata, run as vLLM
runs them (tools/mro/run/block_pool.py): the twenty-third blind round's KVBM-style connectors
(tests/fixtures/mro/corpus/blind_kvbm_leader_pins.py) hold each dumped block with ``block_pool.touch`` from
``build_connector_meta`` until every rank reported the job in its ``build_connector_worker_meta``, and release it
with ``free_blocks`` in ``update_connector_output``. Before, the replay bound no pool (each schedule ended with
``'NoneType' object has no attribute 'touch'``), and an engine that ignores the pins hands the pinned blocks out
again: a false hazard on every correct pinning class."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from deferdump.tools.mro.run import block_pool
from deferdump.tools.mro.run.explore import explore_class
from deferdump.tools.mro.run.replay import run_class
from deferdump.tools.mro.run.stubs import StubMissing, missing
from support.mro import QUIET_METHODS

KVBM = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_kvbm_leader_pins.py"


def _explore(cls: str, case: str) -> tuple[str, str]:
    outcome = explore_class([str(KVBM)], cls, "hma", case, ["blockstore_client"], schedules=30)
    return outcome.status, outcome.detail


@pytest.mark.parametrize(("cls", "case"), [("KvbmLeaderPinConnector", "single"), ("KvbmLeaderPinConnector", "mla"),
                                           ("KvbmDeferredSubmitConnector", "single")])
def test_a_class_pinning_what_it_dumps_gets_no_hazard_from_blocks_vllm_would_not_hand_out(cls: str, case: str) -> None:
    status, detail = _explore(cls, case)
    assert status == "diverged" and detail == "no hazard in 30 explored schedules", detail


def test_the_same_class_on_an_engine_that_ignored_its_pins_would_be_overwritten(monkeypatch: pytest.MonkeyPatch) -> None:
    """The opposite: the pins are what keeps the blocks; without them the first schedules overwrite a dump."""
    monkeypatch.setattr(block_pool.BlockPool, "pinned", lambda self, block_id: False)
    status, detail = _explore("KvbmLeaderPinConnector", "single")
    assert status == "reproduced", detail


def test_worker_metadata_is_aggregated_over_the_ranks_and_a_union_of_reports_frees_early() -> None:
    """``KvbmUnionPinConnector`` merges the ranks' completions as a set: the first rank's report releases the pins
    while rank 1 still dumps. The hazard needs both ranks' metadata aggregated through ``aggregate`` as
    kv_connector/utils.py ~144-152 does; the single-rank case of the same class is clean."""
    status, detail = _explore("KvbmUnionPinConnector", "mla")
    assert status == "reproduced" and "of rank" in detail, detail
    assert _explore("KvbmUnionPinConnector", "single") == ("diverged", "no hazard in 30 explored schedules")


PINNER = """
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata
class Pinner(KVConnectorBase_V1):
    def bind_gpu_block_pool(self, gpu_block_pool):
        self.pool = gpu_block_pool
    def build_connector_meta(self, scheduler_output):
        for new in scheduler_output.scheduled_new_reqs:
            self.pool.touch([self.pool.blocks[b] for b in new.block_ids[0]])
        return KVConnectorMetadata()
    def wait_for_save(self):
        pass
""" + QUIET_METHODS


def test_a_trace_that_allocates_a_block_the_class_pinned_is_not_a_run_of_vllm(tmp_path: Path) -> None:
    path = tmp_path / "pinner.py"
    path.write_text(textwrap.dedent(PINNER), encoding="utf-8")

    def drive(replay):  # noqa: ANN001, ANN202 - the replay's engine
        def schedule(req: str) -> None:
            replay.schedule({"allocated": [{"req": req, "block": "b1", "idx": 1}],
                             "calls": [{"name": "build_connector_meta"}]})
        schedule("r1")
        replay._request_finished({"reqs": ["r1"]}, replay.stubs.RequestStatus.FINISHED_STOPPED)  # noqa: SLF001
        schedule("r2")
        raise AssertionError("the second allocation of b1 was accepted")

    outcome = run_class([str(path)], "Pinner", "non_hma", "single", [], drive, follow=True)
    assert outcome.status == "diverged" and "holds a reference on (BlockPool.touch)" in outcome.detail, outcome.detail
    assert any("[block pool: touch [1]]" in call for call in outcome.calls), outcome.calls


def test_the_pool_counts_the_class_references_and_stops_at_what_it_does_not_model() -> None:
    pool = block_pool.BlockPool(8, missing)
    pool.touch([pool.blocks[2], pool.blocks[2], pool.null_block])
    pool.free_blocks([pool.blocks[2]])
    assert pool.pinned(2) and not pool.pinned(0) and not pool.pinned(3)
    pool.free_blocks([pool.blocks[2], pool.blocks[3]])
    assert not pool.pinned(2) and not pool.pinned(3)
    pool.touch([pool.blocks[3]])  # the free of 3 it never took does not cancel a later pin
    assert pool.pinned(3)
    for use in (lambda: pool.blocks[1].ref_cnt, lambda: pool.get_new_blocks(1), lambda: pool.touch([2]),
                lambda: block_pool.KVCacheManager(pool, lambda req: ([],)).coordinator):
        with pytest.raises(StubMissing):
            use()
