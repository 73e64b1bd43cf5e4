"""The tiny bench configuration the bench tests share: every figure, in seconds."""
from __future__ import annotations

import dataclasses

from deferdump.tools.bench.suite import BenchConfig
from deferdump.tools.engine.forward import ModelShape
from deferdump.tools.engine.scheduler import WorkloadConfig


def tiny_config() -> BenchConfig:
    shape = ModelShape(layers=2, kv_heads=2, head_dim=16, block_size=4, dtype="bfloat16", hidden_dim=32, matmuls_per_layer=1)
    workload = WorkloadConfig(
        block_size=4, num_blocks=64, max_running=3, max_batched_tokens=32, prompt_tokens=(8, 40), output_tokens=(1, 3),
        shared_prefix_prob=0.0, abort_prob=0.0, preempt_prob=0.0, waiting_target=3, seed=1,
    )
    python_shape = dataclasses.replace(shape, matmuls_per_layer=0)
    python_workload = dataclasses.replace(
        workload, num_blocks=4096, max_running=256, max_batched_tokens=1024, prompt_tokens=(4, 12),
        output_tokens=(40, 60), waiting_target=128,
    )
    return BenchConfig(
        shape=shape, workload=workload, store_capacity_blocks=32, rounds=2, steps_per_round=4, warmup_steps=2,
        bandwidth_blocks_per_task=4, bandwidth_tasks=2, bandwidth_repeats=2, python_shape=python_shape,
        python_workload=python_workload, python_warmup_max_steps=50, python_steps=3, tlc_timeout_s=60.0,
        model_limit=1, replay_traces=3, malloc_tuning=False,  # process-wide and permanent: tested in a subprocess below
    )
