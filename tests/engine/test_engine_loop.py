"""The simulated vLLM engine (`deferdump.tools.engine`) on its own: the environment's moves, vLLM 0.32's
load-failure policies, preemption, and the same engine under the seeded policy bench and soak use."""
from __future__ import annotations

import pytest

from deferdump.reference.invariants import InvariantViolation
from deferdump.reference.testing.late_copy import LateCopyDevice
from deferdump.reference.testing.manual_store import ManualStore
from deferdump.tools.engine.forward import ModelShape
from deferdump.tools.engine.moves import ScriptedMoves
from deferdump.tools.engine.scheduler import Status, WorkloadConfig
from deferdump.tools.engine.steploop import LoopConfig, Mode, StepLoop
from support.statemachine import TOKEN_VOCAB, Deployment, prompt_of


def _engine(policy: str = "fail", world_size: int = 1) -> tuple[StepLoop, ManualStore, ScriptedMoves]:
    store = ManualStore(auto_complete_on_wait=True)
    moves = ScriptedMoves(TOKEN_VOCAB)
    config = Deployment(world_size=world_size, kv_load_failure_policy=policy).loop_config()
    engine = StepLoop(config, store, device_factory=lambda rank: LateCopyDevice(), moves=moves)
    return engine, store, moves


def _store_prompt(engine: StepLoop, store: ManualStore, prompt: list[int]) -> None:
    """Run one request to its end and let its dumps finish: the store then holds its full blocks."""
    engine.scheduler.add_request(prompt, 1)
    for _ in range(6):
        engine.step()
        for task in store.pending_tasks():
            store.complete(task)
    engine.check()
    assert not engine.scheduler.requests


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_a_failed_load_fails_the_request_or_recomputes_it_as_vllm_does(policy: str) -> None:
    engine, store, _ = _engine(policy)
    prompt = prompt_of(1, 9)
    _store_prompt(engine, store, prompt)
    request = engine.scheduler.add_request(prompt, 2)
    store.submit_fail_next = 1  # the step's first submit is the hit's load (start_load_kv runs before the saves)
    outcome = engine.step()
    engine.check()
    if policy == "fail":
        assert outcome.failed_loads == [request.req_id] and outcome.recomputed_loads == []
        assert request.req_id in outcome.finished and request.status is not Status.RUNNING
    else:
        assert outcome.recomputed_loads == [request.req_id] and outcome.failed_loads == []
        assert request.status is Status.RUNNING and request.num_computed == 0  # rewound to the first bad block
        for _ in range(8):  # recomputed by the forward; the oracle checks every byte dumped on the way
            engine.step()
        engine.check()
        assert request.req_id not in engine.scheduler.requests or request.status is Status.HELD
    engine.drain_and_shutdown()
    engine.check()


def _fail_a_resumed_hit(fails: int) -> tuple[StepLoop, ManualStore]:
    """Two requests; the first is preempted in step 4 (out of blocks) and resumes with a hit of three blocks
    whose load fails (`fails` load submits fail: one per rank) while the same step computes and would dump its
    fourth block; vLLM then rolls it back to the first failed block and recomputes every block in place."""
    engine, store, _ = _engine("recompute", world_size=2)
    engine.scheduler.add_request(prompt_of(0, 6), 4)
    engine.scheduler.add_request(prompt_of(0, 7), 1)
    for _ in range(4):
        engine.step()
    store.submit_fail_next = fails
    outcome = engine.step()
    assert outcome.recomputed_loads == ["req-1"]
    engine.check()
    return engine, store


def test_under_recompute_a_failed_loads_request_is_not_dumped_in_that_step_and_is_dumped_after_the_recompute() -> None:
    """The connector submits no dump slice of a request whose load failed in the step (its block was computed
    over the failed blocks and is rewritten by the recompute): NoOverwriteWhileDumpingInv holds, and the
    oracle finds every stored byte right, the recomputed blocks' dumps included (docs/engine.md)."""
    engine, store = _fail_a_resumed_hit(fails=2)
    dumped_before = len(store.stored_hashes())
    for _ in range(2):
        engine.step()
        engine.check()
    engine.drain_and_shutdown()
    engine.check()
    assert len(store.stored_hashes()) > dumped_before  # the recompute dumped the rolled-back blocks


def test_under_recompute_the_merged_connector_dumping_a_failed_loads_block_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """PR #989 as merged dumps every slice: the block computed over the failed load is rewritten by the
    recompute while its dump still reads it."""
    engine, store, _ = _engine("recompute", world_size=2)
    for rank in engine.ranks:
        assert rank.connector is not None
        monkeypatch.setattr(rank.connector.inner, "_failed_load_requests", frozenset)
    engine.scheduler.add_request(prompt_of(0, 6), 4)
    engine.scheduler.add_request(prompt_of(0, 7), 1)
    for _ in range(4):
        engine.step()
    store.submit_fail_next = 1  # rank 0's load
    engine.step()
    for _ in range(2):
        engine.step()
    with pytest.raises(InvariantViolation, match="NoOverwriteWhileDumpingInv: rank 0 writes block"):
        engine.check()


def test_under_recompute_a_load_failed_on_one_rank_still_races_on_the_rank_whose_load_succeeded() -> None:
    """An open finding, pinned: the rank whose load succeeded cannot see the other rank's failure in the step,
    so it dumps the next block; vLLM unions the ranks' invalid_block_ids and rolls the request back on every
    rank, and the recompute rewrites that block under its dump (docs/engine.md)."""
    engine, _ = _fail_a_resumed_hit(fails=1)
    for _ in range(2):
        engine.step()
    with pytest.raises(InvariantViolation, match="NoOverwriteWhileDumpingInv: rank 1 writes block"):
        engine.check()


def test_kv_load_failure_policy_is_checked() -> None:
    with pytest.raises(ValueError, match="kv_load_failure_policy"):
        WorkloadConfig(kv_load_failure_policy="retry")


def test_a_scripted_preemption_frees_the_victims_blocks_at_once() -> None:
    engine, _, moves = _engine(world_size=2)
    first = engine.scheduler.add_request(prompt_of(0, 5), 3)
    engine.scheduler.add_request(prompt_of(2, 3), 3)
    engine.step()
    blocks = set(first.blocks)
    moves.preempt_next = first.req_id
    engine.step()
    engine.check()
    assert engine.scheduler.preempted_total == 1
    assert first.status is Status.WAITING and first.resumed
    reused = {block for other in engine.scheduler.running for block in other.blocks}
    assert blocks <= engine.scheduler.pool.freed_by_preemption() | reused  # free at once, or already reused
    assert engine.scheduler.pool.freed_by_preemption() <= engine.scheduler.pool.free_blocks()
    engine.drain_and_shutdown()
    engine.check()


def test_an_abort_between_steps_reaches_the_workers_in_the_next_step() -> None:
    engine, _, _ = _engine(world_size=2)
    request = engine.scheduler.add_request(prompt_of(0, 7), 4)
    engine.step()
    delayed = engine.abort(request.req_id)
    assert delayed  # a dump slice was planned in the first step: request_finished delays the free
    assert request.status is Status.HELD
    engine.drain_and_shutdown()
    engine.check()
    assert engine.scheduler.idle()


def _seeded_run(seed: int) -> tuple[int, int, int, int]:
    workload = WorkloadConfig(
        block_size=4, num_blocks=32, max_running=4, max_batched_tokens=24, prompt_tokens=(4, 20), output_tokens=(1, 4),
        abort_prob=0.05, preempt_prob=0.2, seed=seed,
    )
    shape = ModelShape(layers=1, kv_heads=1, head_dim=2, block_size=4, dtype="float32", hidden_dim=4, matmuls_per_layer=0)
    loop = StepLoop(LoopConfig(workload, shape, None, Mode.NO_SAVE))
    loop.run(requests=REQUESTS)
    sched = loop.scheduler
    return loop.steps, sched.preempted_total, sched.aborted_total, sched.freed_total


REQUESTS = 120  # enough for every seed to preempt and abort: 30 left seed 14 with no preemption (seeds 1-200 checked)


@pytest.mark.seed(5)
def test_the_seeded_policy_is_reproducible_and_makes_its_moves(seed: int) -> None:
    first = _seeded_run(seed)
    assert first == _seeded_run(seed)
    assert first[1] > 0 and first[2] > 0 and first[3] == REQUESTS
