"""The simulated engine with asynchronous loads (`load_async`): vLLM 0.32's WAITING_FOR_REMOTE_KVS, the
per-rank finished_recving, failed receives on a hybrid model, an abort during a load, and the engine's
verdict on the TEST-ONLY broken mode of real bug P8 (the aborted request's report never comes)."""
from __future__ import annotations

import pytest

from deferdump.reference.testing.late_copy import LateCopyDevice
from deferdump.reference.testing.manual_store import ManualStore
from deferdump.tools.engine.moves import ScriptedMoves
from deferdump.tools.engine.scheduler import SimRequest, Status
from deferdump.tools.engine.steploop import StepLoop
from support.statemachine import TOKEN_VOCAB, Deployment, prompt_of, engine_violations as _violations


def _engine(**deployment: object) -> tuple[StepLoop, ManualStore]:
    store = ManualStore()
    config = Deployment(load_async=True, **deployment).loop_config()  # type: ignore[arg-type]
    engine = StepLoop(config, store, device_factory=lambda rank: LateCopyDevice(), moves=ScriptedMoves(TOKEN_VOCAB))
    return engine, store


def _complete_all(store: ManualStore) -> None:
    for task in store.pending_tasks():
        store.complete(task)


def _stored_prompt(engine: StepLoop, store: ManualStore) -> list[int]:
    """Run one 9-token request to its end with every dump completed: the store holds its 4 full blocks."""
    prompt = prompt_of(1, 9)
    engine.scheduler.add_request(prompt, 1)
    for _ in range(6):
        engine.step()
        _complete_all(store)
    assert not engine.scheduler.requests and _violations(engine) == []
    return prompt


def _parked(engine: StepLoop, store: ManualStore, prompt: list[int]) -> SimRequest:
    request = engine.scheduler.add_request(prompt, 2)
    engine.step()  # admitted as a hit: parked, its load submitted on every rank, nothing scheduled
    assert request.status is Status.RECVING and request.num_computed == 8
    assert all(rank.connector is not None and rank.connector.receiving_request_ids() == {request.req_id}
               for rank in engine.ranks)
    return request


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_hit_is_parked_until_every_rank_reported_its_load_then_runs_on_the_loaded_blocks(world_size: int) -> None:
    engine, store = _engine(world_size=world_size)
    request = _parked(engine, store, _stored_prompt(engine, store))
    blocks = list(request.blocks)
    engine.step()
    assert request.status is Status.RECVING  # the loads run: no report, no schedule
    _complete_all(store)
    engine.step()  # every rank reports finished_recving: promoted at the next schedule
    assert request.status is Status.RECVING and request.recv_reports == world_size
    engine.step()
    assert request.status is Status.RUNNING and request.blocks[:4] == blocks
    assert _violations(engine) == []  # the oracle compared every loaded block with the stored prompt
    engine.drain_and_shutdown()
    assert _violations(engine) == []


def test_an_abort_during_the_load_holds_the_blocks_until_the_load_is_reported() -> None:
    engine, store = _engine(world_size=2)
    request = _parked(engine, store, _stored_prompt(engine, store))
    assert engine.abort(request.req_id) is False  # vLLM delays this free itself, not the connector
    for _ in range(3):
        engine.step()
        assert request.status is Status.HELD_RECV and request.req_id in engine.scheduler.requests
    _complete_all(store)
    engine.step()
    assert request.req_id not in engine.scheduler.requests and request.status is Status.DONE
    engine.drain_and_shutdown()
    assert _violations(engine) == []


def test_the_p8_broken_mode_leaves_the_aborted_request_held_and_the_engine_says_so() -> None:
    engine, store = _engine(world_size=1, test_drop_aborted_recving=True)
    request = _parked(engine, store, _stored_prompt(engine, store))
    engine.abort(request.req_id)
    engine.step()  # the worker drops the aborted request from its receive set
    _complete_all(store)
    report = engine.drain_and_shutdown()
    assert report.held_requests == 1
    assert any(v.startswith("Liveness (Python-only)") and request.req_id in v for v in _violations(engine))


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_failed_async_load_truncates_at_the_first_bad_block_or_fails_the_request(policy: str) -> None:
    engine, store = _engine(world_size=1, kv_load_failure_policy=policy)
    request = _parked(engine, store, _stored_prompt(engine, store))
    [load] = store.pending_tasks()
    store.fail(load)
    outcome = engine.step()
    if policy == "fail":
        assert outcome.failed_loads == [request.req_id] and request.status is Status.DONE
    else:
        assert outcome.recomputed_loads == [request.req_id] and request.num_computed == 0
        engine.step()  # promoted with no valid token: its blocks freed, a fresh lookup (the store hits again)
        assert request.loads == 2
    _complete_all(store)
    engine.drain_and_shutdown()
    assert _violations(engine) == []


def test_a_failed_async_load_on_a_hybrid_model_is_a_failed_receive_not_an_engine_crash() -> None:
    engine, store = _engine(world_size=1, sliding_window=3, num_blocks=14, kv_load_failure_policy="recompute")
    request = _parked(engine, store, _stored_prompt(engine, store))
    for task in store.pending_tasks():
        store.fail(task)
    outcome = engine.step()
    assert outcome.recomputed_loads == [request.req_id] and request.recv_failed
    for _ in range(12):
        engine.step()
        _complete_all(store)
    engine.drain_and_shutdown()
    violations = _violations(engine)
    assert violations == [] and not any("HybridLoadErrors" in v for v in violations)
