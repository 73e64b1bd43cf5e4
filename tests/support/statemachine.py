"""The Hypothesis state machine of the protocol property tests (shared by the property test and the mutant
tests): the real connectors inside the simulated vLLM engine, driven rule by rule."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from deferdump.reference.simulation import ProtocolSimulation, SimConfig

settings.register_profile(
    "deferdump-ci",
    max_examples=int(os.environ.get("DEFERDUMP_HYPOTHESIS_EXAMPLES", "2000")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)

DEPLOYMENTS = [
    SimConfig(variant="direct"),
    SimConfig(variant="direct", is_mla=True),
    SimConfig(variant="direct", verify_dumps=True, num_blocks=6),
    SimConfig(variant="layerwise"),
    SimConfig(variant="layerwise", defer_finalize=True),
    SimConfig(variant="direct", defer_finalize=True, num_blocks=6),
    SimConfig(variant="layerwise", is_mla=True, block_size=3),
    SimConfig(variant="cp"),
    SimConfig(variant="cp", use_layerwise=True),
    SimConfig(variant="direct", world_size=3, token_budget=4, num_blocks=12),
]


class DeferredDumpMachine(RuleBasedStateMachine):
    sim: ProtocolSimulation

    @initialize(deployment=st.sampled_from(DEPLOYMENTS))
    def deploy(self, deployment: SimConfig) -> None:
        self.sim = ProtocolSimulation(deployment)

    @rule(base=st.integers(0, 2), length=st.integers(1, 11), max_new=st.integers(1, 4))
    def add_request(self, base: int, length: int, max_new: int) -> None:
        self.sim.add_request(base, length, max_new)

    @rule()
    def step(self) -> None:
        self.sim.step()

    @rule(steps=st.integers(2, 4))
    def run_steps(self, steps: int) -> None:
        for _ in range(steps):
            self.sim.step()

    @rule(data=st.data())
    @precondition(lambda self: bool(self.sim.unfinished()))
    def abort(self, data: st.DataObject) -> None:
        self.sim.abort(data.draw(st.sampled_from(self.sim.unfinished()), label="request"))

    @rule(data=st.data())
    @precondition(lambda self: bool(self.sim.dump_tasks()))
    def complete_task(self, data: st.DataObject) -> None:
        self.sim.complete_task(data.draw(st.sampled_from(self.sim.dump_tasks()), label="task"))

    @rule(data=st.data())
    @precondition(lambda self: bool(self.sim.dump_tasks()))
    def fail_task(self, data: st.DataObject) -> None:
        self.sim.fail_task(data.draw(st.sampled_from(self.sim.dump_tasks()), label="task"))

    @rule()
    def inject_submit_failure(self) -> None:
        self.sim.inject_submit_failure()

    @rule(failing=st.booleans())
    def set_check_failure(self, failing: bool) -> None:
        self.sim.set_check_failure(failing)

    @invariant()
    def invariants_hold(self) -> None:
        self.sim.check()

    def teardown(self) -> None:
        sim = getattr(self, "sim", None)
        if sim is None:
            return
        sim.drain_and_shutdown()
        sim.check()


DeferredDumpMachine.TestCase.settings = settings.get_profile("deferdump-ci")
