"""Synchronous against asynchronous loads (`load_async`) over one request stream with store hits: what the
step loop's forward thread pays for loads, and how long hits wait for them.

Both runs go through the same step loop with the same seeded requests, on a store warmed by that stream;
the figures are per run and compared with each other, never with a goal. A synchronous load is waited and
written in `start_load_kv`, before the forward; an asynchronous one is submitted there and finished in
`get_finished`, after the forward, while the request waits in WAITING_FOR_REMOTE_KVS, so each hit costs the
request extra steps but no step waits for a store read.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from deferdump.reference.config import ConnectorConfig
from deferdump.reference.stores.memory import MemoryStore
from deferdump.tools.engine.forward import ModelShape
from deferdump.tools.engine.phase_timer import PhaseTimer
from deferdump.tools.engine.scheduler import WorkloadConfig
from deferdump.tools.engine.steploop import LoopConfig, Mode, StepLoop

LOAD_PHASES = ("start_load_kv", "get_finished")  # where a load's store wait and KV write can happen


def load_workload(seed: int = 31) -> WorkloadConfig:
    """Prompts of up to 16 blocks, most of them opening with one of four shared documents (store hits)."""
    return WorkloadConfig(
        block_size=16, num_blocks=2048, max_running=32, max_batched_tokens=1024, prompt_tokens=(64, 256),
        output_tokens=(4, 16), shared_prefix_prob=0.7, shared_prefixes=4, abort_prob=0.0, preempt_prob=0.0,
        waiting_target=16, seed=seed,
    )


def load_shape() -> ModelShape:
    """Small blocks and no matmuls: the figures are the loads' Python and copies, not the forward's compute."""
    return ModelShape(layers=2, kv_heads=1, head_dim=16, block_size=16, dtype="float16", hidden_dim=8,
                      matmuls_per_layer=0)


def run_load_mode(load_async: bool, requests: int, *, seed: int = 31) -> dict[str, Any]:
    """One run: `requests` requests through the step loop, loads synchronous or asynchronous."""
    workload, shape = load_workload(seed), load_shape()
    timer = PhaseTimer()
    with MemoryStore(16_384) as store:
        # Warm the store with the same stream first (its dumps all end by its shutdown): every prompt then
        # hits, whatever the store threads' timing, and both modes load the same blocks.
        warm = StepLoop(LoopConfig(workload, shape, ConnectorConfig(block_size=workload.block_size), Mode.DEFERRED),
                        store)
        warm.run(requests=requests)
        warm.shutdown()
        connector = ConnectorConfig(block_size=workload.block_size, load_async=load_async)
        loop = StepLoop(LoopConfig(workload, shape, connector, Mode.DEFERRED), store, timer=timer)
        started = time.perf_counter()
        loop.run(requests=requests)
        wall = time.perf_counter() - started
        loop.shutdown()
        loads = sum(rank.connector.metrics.value("deferdump_loads_completed_total")
                    for rank in loop.ranks if rank.connector is not None)
    per_step = [seconds * 1e3 for seconds in timer.total(("start_load_kv",))]
    finish = [seconds * 1e3 for seconds in timer.total(LOAD_PHASES)]
    return {
        "requests": loop.scheduler.admitted_total,
        "steps": loop.steps,
        "wall_s": round(wall, 3),
        "loads_completed": int(loads),
        "parked": loop.scheduler.async_loads_total,
        "start_load_kv_ms_per_step_mean": round(statistics.fmean(per_step), 4) if per_step else None,
        "start_load_kv_ms_per_step_max": round(max(per_step), 4) if per_step else None,
        "load_phases_ms_per_step_mean": round(statistics.fmean(finish), 4) if finish else None,
    }


def measure_load_modes(requests: int = 200, *, seed: int = 31) -> dict[str, Any]:
    """`load_modes`: {"sync": ..., "async": ...} over the same request stream."""
    return {"load_modes": {"sync": run_load_mode(False, requests, seed=seed),
                           "async": run_load_mode(True, requests, seed=seed)}}
