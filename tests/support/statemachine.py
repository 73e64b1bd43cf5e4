"""The Hypothesis state machine of the protocol property tests (shared by the property test and the mutant
tests): the real connectors inside the simulated vLLM engine (`deferdump.tools.engine`), driven rule by
rule. Hypothesis makes the environment's moves: requests arrive and are aborted, the next preemption's
victim, dump tasks complete or fail (`ManualStore`), submits, checks and device reads fail."""
from __future__ import annotations

import dataclasses
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from deferdump.reference.config import ConnectorConfig
from deferdump.reference.invariants import InvariantViolation
from deferdump.reference.testing.late_copy import LateCopyDevice
from deferdump.reference.testing.manual_store import ManualStore
from deferdump.tools.engine.forward import ModelShape
from deferdump.tools.engine.moves import ScriptedMoves
from deferdump.tools.engine.scheduler import WorkloadConfig
from deferdump.tools.engine.steploop import LoopConfig, Mode, StepLoop

settings.register_profile(
    "deferdump-ci",
    max_examples=int(os.environ.get("DEFERDUMP_HYPOTHESIS_EXAMPLES", "2000")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)

TOKEN_VOCAB = 50  # the forward's "tokens" content encodes token ids below 50 exactly


@dataclasses.dataclass(frozen=True)
class Deployment:
    """Shape of one simulated deployment."""

    variant: str = "direct"  # direct | layerwise | cp
    use_layerwise: bool = False  # cp only
    is_mla: bool = False
    world_size: int = 2
    block_size: int = 2
    num_blocks: int = 8
    num_layers: int = 2
    token_budget: int = 6
    verify_dumps: bool = False
    defer_finalize: bool = False  # spec-decode order: get_finished runs before this step's wait_for_save
    kv_load_failure_policy: str = "fail"  # vLLM's default; "recompute" breaks an invariant (docs/engine.md)
    sliding_window: int | None = None  # a hybrid model: full attention + a sliding window of this many tokens
    hybrid_fence: str = "freed"  # the connector's fence for hybrid models ("none" is #989 as merged)
    load_async: bool = False  # asynchronous loads (WAITING_FOR_REMOTE_KVS, finished_recving)
    test_drop_aborted_recving: bool = False  # TEST-ONLY broken mode: real bug P8

    def loop_config(self) -> LoopConfig:
        workload = WorkloadConfig(
            block_size=self.block_size, num_blocks=self.num_blocks, max_running=self.num_blocks * self.block_size,
            max_batched_tokens=self.token_budget, prompt_tokens=(1, 1), output_tokens=(1, 1), shared_prefix_prob=0.0,
            shared_prefixes=0, abort_prob=0.0, preempt_prob=0.0, waiting_target=0,
            kv_load_failure_policy=self.kv_load_failure_policy, sliding_window=self.sliding_window,
        )
        shape = ModelShape(
            layers=self.num_layers, kv_heads=1, head_dim=1, block_size=self.block_size, dtype="float32", hidden_dim=1,
            matmuls_per_layer=0, content="tokens",
        )
        connector = ConnectorConfig(
            variant=self.variant, block_size=self.block_size,
            cp_world_size=self.world_size if self.variant == "cp" else 1, use_layerwise=self.use_layerwise,
            is_mla=self.is_mla, verify_dumps=self.verify_dumps, hybrid_fence=self.hybrid_fence,
            load_async=self.load_async, test_drop_aborted_recving=self.test_drop_aborted_recving,
        )
        return LoopConfig(
            workload, shape, connector, Mode.DEFERRED, world_size=self.world_size, check_invariants=True, oracle=True,
            defer_finalize=self.defer_finalize,
        )


DEPLOYMENTS = [
    Deployment(variant="direct"),
    Deployment(variant="direct", is_mla=True),
    Deployment(variant="direct", verify_dumps=True, num_blocks=6),
    Deployment(variant="layerwise"),
    Deployment(variant="layerwise", defer_finalize=True),
    Deployment(variant="direct", defer_finalize=True, num_blocks=6),
    Deployment(variant="layerwise", is_mla=True, block_size=3),
    Deployment(variant="cp"),
    Deployment(variant="cp", use_layerwise=True),
    Deployment(variant="direct", world_size=3, token_budget=4, num_blocks=12),
]


# Hybrid models (two KV-cache groups; the connector needs variant "direct"). A request of up to 15 tokens
# holds 8 full-attention blocks plus its sliding-window blocks; 14 blocks (one is vLLM's null block) leave
# room for two or three requests, so preemptions by lack of blocks happen too. Window 1 frees every
# computed block at the next schedule (the dumps submitted one step earlier still read them), 3 keeps
# one and a half blocks, 4 (block size 3) keeps one full block and a bit.
HYBRID_DEPLOYMENTS = [
    Deployment(sliding_window=1, world_size=1, num_blocks=14),
    Deployment(sliding_window=3, world_size=1, num_blocks=14),
    Deployment(sliding_window=4, world_size=1, num_blocks=16, block_size=3),
    Deployment(sliding_window=1, world_size=1, num_blocks=14, defer_finalize=True),
    Deployment(sliding_window=1, world_size=1, num_blocks=14, verify_dumps=True),
    Deployment(sliding_window=2, world_size=2, num_blocks=14),
    Deployment(sliding_window=1, world_size=2, num_blocks=14, is_mla=True),
]


def engine_violations(engine: StepLoop) -> list[str]:
    """The invariant violations the engine's checks report now (empty when every invariant holds)."""
    try:
        engine.check()
    except InvariantViolation as caught:
        return caught.violations
    return []


def prompt_of(base: int, length: int) -> list[int]:
    """A prefix of base sequence `base` (shared prefixes give store hits)."""
    return [(base * 17 + i * 5 + (i * i) % 7) % TOKEN_VOCAB for i in range(length)]


class DeferredDumpMachine(RuleBasedStateMachine):
    engine: StepLoop
    store: ManualStore
    moves: ScriptedMoves
    devices: list[LateCopyDevice]
    deployment: Deployment
    tolerated: tuple[str, ...] = ()  # violations a subclass expects (a known cost), every other one fails

    @initialize(deployment=st.sampled_from(DEPLOYMENTS))
    def deploy(self, deployment: Deployment) -> None:
        self._deploy(deployment)

    def _deploy(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.store = ManualStore(auto_complete_on_wait=True)
        self.moves = ScriptedMoves(TOKEN_VOCAB)
        self.devices = []

        def device(rank: int) -> LateCopyDevice:
            self.devices.append(LateCopyDevice())
            return self.devices[-1]

        self.engine = StepLoop(deployment.loop_config(), self.store, device_factory=device, moves=self.moves)

    def _unfinished(self) -> list[str]:
        return [request.req_id for request in self.engine.scheduler.unfinished()]

    def _running(self) -> list[str]:
        return [request.req_id for request in self.engine.scheduler.running]

    def _dump_tasks(self) -> list:  # type: ignore[type-arg]
        return [task for task in self.store.pending_tasks() if task.kind == "dump"]

    @rule(base=st.integers(0, 2), length=st.integers(1, 11), max_new=st.integers(1, 4))
    def add_request(self, base: int, length: int, max_new: int) -> None:
        self.engine.scheduler.add_request(prompt_of(base, length), max_new)

    @rule()
    def step(self) -> None:
        self.engine.step()

    @rule(steps=st.integers(2, 4))
    def run_steps(self, steps: int) -> None:
        for _ in range(steps):
            self.engine.step()

    @rule(data=st.data())
    @precondition(lambda self: bool(self._unfinished()))
    def abort(self, data: st.DataObject) -> None:
        self.engine.abort(data.draw(st.sampled_from(self._unfinished()), label="request"))

    @rule(data=st.data())
    @precondition(lambda self: bool(self._running()))
    def preempt_next_step(self, data: st.DataObject) -> None:
        self.moves.preempt_next = data.draw(st.sampled_from(self._running()), label="victim")

    @rule(data=st.data())
    @precondition(lambda self: bool(self._dump_tasks()))
    def complete_task(self, data: st.DataObject) -> None:
        self.store.complete(data.draw(st.sampled_from(self._dump_tasks()), label="task"))

    @rule(data=st.data())
    @precondition(lambda self: bool(self._dump_tasks()))
    def fail_task(self, data: st.DataObject) -> None:
        self.store.fail(data.draw(st.sampled_from(self._dump_tasks()), label="task"))

    def _load_faults_fatal(self) -> bool:
        """Under two KV-cache groups vLLM 0.32 dies on any block-level load error (`HybridLoadErrors`,
        pinned by tests/engine/test_engine_sliding_window.py): the hybrid machines inject no fault that
        can end in one (a refused submit may be a load's). Failed dumps may: the lookup offers a block only
        once every rank stored its shard (tests/reference/test_reference_lookup_ranks.py)."""
        return self.deployment.sliding_window is not None

    @rule()
    @precondition(lambda self: not self._load_faults_fatal())
    def inject_submit_failure(self) -> None:
        self.store.submit_fail_next += 1

    @rule(rank=st.integers(0, 2))
    def inject_device_read_failure(self, rank: int) -> None:
        self.devices[rank % len(self.devices)].read_fail_next += 1

    @rule(failing=st.booleans())
    def set_check_failure(self, failing: bool) -> None:
        self.store.check_fail = failing

    def _check(self) -> None:
        if not self.tolerated:
            self.engine.check()
            return
        try:
            self.engine.check()
        except InvariantViolation as caught:
            unexpected = [line for line in caught.violations if not line.startswith(self.tolerated)]
            if unexpected:
                raise InvariantViolation(unexpected) from None

    @invariant()
    def invariants_hold(self) -> None:
        self._check()

    def teardown(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        self.store.check_fail = False
        engine.drain_and_shutdown()
        self._check()


DeferredDumpMachine.TestCase.settings = settings.get_profile("deferdump-ci")


class SlidingWindowMachine(DeferredDumpMachine):
    """The same machine on hybrid models (full attention + sliding window): sliding-window blocks leave
    the window and are freed while their request runs, and reused at once."""

    deployments: tuple[Deployment, ...] = tuple(HYBRID_DEPLOYMENTS)

    @initialize(data=st.data())
    def deploy(self, data: st.DataObject) -> None:  # type: ignore[override]
        self._deploy(data.draw(st.sampled_from(self.deployments), label="deployment"))


def hybrid_machine(fence: str, tolerated: tuple[str, ...] = ()) -> type[SlidingWindowMachine]:
    """`SlidingWindowMachine` with every deployment's `hybrid_fence` set to `fence`."""
    deployments = tuple(dataclasses.replace(d, hybrid_fence=fence) for d in HYBRID_DEPLOYMENTS)
    machine = type(f"SlidingWindowMachine_{fence}", (SlidingWindowMachine,), {"deployments": deployments, "tolerated": tolerated})
    machine.TestCase.settings = settings.get_profile("deferdump-ci")
    return machine  # type: ignore[return-value]


# Asynchronous loads (`load_async`): hits are parked in WAITING_FOR_REMOTE_KVS until every rank reported
# them in finished_recving. Load tasks end only when the machine completes or fails them, so aborts, preemptions
# of other requests and faults land while loads run; failed loads are block errors (one group) or failed
# receives (hybrid: not fatal any more, so the hybrid deployments here inject every fault).
ASYNC_LOAD_DEPLOYMENTS = [
    Deployment(load_async=True, world_size=1),
    Deployment(load_async=True),
    Deployment(load_async=True, kv_load_failure_policy="recompute", world_size=1),
    Deployment(load_async=True, defer_finalize=True, num_blocks=6),
    Deployment(load_async=True, sliding_window=1, world_size=1, num_blocks=14, kv_load_failure_policy="recompute"),
    Deployment(load_async=True, sliding_window=3, world_size=2, num_blocks=14),
]


class AsyncLoadMachine(DeferredDumpMachine):
    """The protocol machine with asynchronous loads: load tasks complete or fail under the machine's control."""

    deployments: tuple[Deployment, ...] = tuple(ASYNC_LOAD_DEPLOYMENTS)

    @initialize(data=st.data())
    def deploy(self, data: st.DataObject) -> None:  # type: ignore[override]
        self._deploy(data.draw(st.sampled_from(self.deployments), label="deployment"))

    def _load_faults_fatal(self) -> bool:
        return False  # an asynchronous load's failure is a failed receive under two groups

    def _load_tasks(self) -> list:  # type: ignore[type-arg]
        return [task for task in self.store.pending_tasks() if task.kind == "load"]

    @rule(data=st.data())
    @precondition(lambda self: bool(self._load_tasks()))
    def complete_load(self, data: st.DataObject) -> None:
        self.store.complete(data.draw(st.sampled_from(self._load_tasks()), label="load"))

    @rule(data=st.data())
    @precondition(lambda self: bool(self._load_tasks()))
    def fail_load(self, data: st.DataObject) -> None:
        self.store.fail(data.draw(st.sampled_from(self._load_tasks()), label="load"))

    def teardown(self) -> None:
        """A store ends every task eventually: the loads still running end before the drain."""
        if getattr(self, "engine", None) is not None:
            self.store.check_fail = False
            for task in self._load_tasks():
                self.store.complete(task)
        super().teardown()


AsyncLoadMachine.TestCase.settings = settings.get_profile("deferdump-ci")
