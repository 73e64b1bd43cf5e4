"""[redis] Redis failing under a running vLLM engine: nothing is lost and no output changes.

- `maxmemory` with `allkeys-lru`: blocks Redis evicted before a lookup are misses; blocks it evicts between
  the scheduler's lookup and the worker's load are reported load errors that vLLM recomputes
  (`kv_load_failure_policy: recompute`); the greedy outputs stay identical.
- The server killed during a run (SIGKILL, dumps in flight): every request finishes, the dump failures are
  counted, every delayed free still happens exactly once, no pending task or live handle remains; the
  server restarted on the same port serves the next run's dumps without restarting vLLM.
"""
from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: the Redis fixtures live in tests/support/redis.py
from support.redis import redis_server  # noqa: E402,F401 - fixture

from deferdump.reference.testing.redis_server import LocalRedis  # noqa: E402
from vllm_harness import (  # noqa: E402
    FreeGuard,
    assert_drained_worker,
    assert_shut_down,
    deferdump_connectors,
    deferdump_transfer_config,
    generate_and_drain,
    metric,
    record_request_finished,
    running_llm,
    scheduler_connector,
    token_prompts,
    worker_connector,
)

PROMPTS = token_prompts(6, 100, seed=73)  # 3 full blocks of 32 tokens each, and a partial one
FULL_BLOCKS = 3
MAX_TOKENS = 8
LRU_TICK_S = 1.5  # more than one tick of Redis's LRU clock (1 s resolution, updated every 100 ms)


def _config(url: str) -> dict[str, Any]:
    extra = {"store": "redis", "redis_url": url, "redis_namespace": f"vllm-{uuid.uuid4().hex[:8]}", "verify_dumps": True}
    return deferdump_transfer_config(extra) | {"kv_load_failure_policy": "recompute"}


def _used_memory(server: LocalRedis) -> int:
    info = server.cli("info", "memory")
    return int(next(line.split(":")[1] for line in info.splitlines() if line.startswith("used_memory:")))


def _evict_to(server: LocalRedis, limit: int) -> None:
    """Lower maxmemory (Redis evicts at once, by its allkeys-lru policy), then lift it again. Redis's LRU is
    approximate (it evicts the oldest of `maxmemory-samples` random keys); sampling 64 (its maximum, more than
    the test's keys) makes it exact up to its clock's one-second resolution, so the last prompt, dumped a
    tick after the others, survives a partial eviction and is hit."""
    server.cli("config", "set", "maxmemory-samples", "64")
    server.cli("config", "set", "maxmemory", str(limit))
    server.cli("ping")
    server.cli("config", "set", "maxmemory", "1gb")


def test_blocks_redis_evicts_are_misses_or_load_errors_and_outputs_stay_identical(tiny_model: Path) -> None:
    with LocalRedis(maxmemory="1gb", policy="allkeys-lru") as server, \
            running_llm(tiny_model, _config(server.url), max_num_seqs=1) as llm:
        [scheduler] = deferdump_connectors(scheduler_connector(llm))
        [worker] = deferdump_connectors(worker_connector())
        guard = FreeGuard(llm, [worker])
        empty = _used_memory(server)
        # Redis's LRU clock counts whole seconds: blocks dumped within one second tie, and a partial eviction
        # may then keep no prompt's first block (no hit below). The last prompt is dumped a clock tick later,
        # so its blocks are strictly the newest and survive the eviction of about half.
        first = generate_and_drain(llm, PROMPTS[:-1], MAX_TOKENS)
        time.sleep(LRU_TICK_S)
        first += generate_and_drain(llm, PROMPTS[-1:], MAX_TOKENS)
        stored = int(server.cli("dbsize"))
        assert stored == len(PROMPTS) * FULL_BLOCKS
        assert metric(worker, "deferdump_dumps_completed_total") == metric(worker, "deferdump_dumps_submitted_total")

        # Half the blocks' memory over the limit: Redis evicts about half of them now (misses below).
        _evict_to(server, empty + (_used_memory(server) - empty) // 2)
        survivors = int(server.cli("dbsize"))
        assert 0 < survivors < stored, (survivors, stored)

        # And the first lookup that hits: everything is evicted before the worker loads it.
        original = scheduler.get_num_new_matched_tokens
        evicted_after_hit: list[int] = []

        def lookup_then_evict(request: Any, num_computed_tokens: int) -> Any:
            hits, is_async = original(request, num_computed_tokens)
            if hits and not evicted_after_hit:
                _evict_to(server, empty // 2)  # below the empty server's own use: every block goes
                evicted_after_hit.append(int(server.cli("dbsize")))
            return hits, is_async

        scheduler.get_num_new_matched_tokens = lookup_then_evict
        assert llm.reset_prefix_cache()
        second = generate_and_drain(llm, PROMPTS, MAX_TOKENS)

        assert second == first, "outputs changed after Redis evicted blocks"
        full = len(PROMPTS) * FULL_BLOCKS * 32
        hit_tokens = metric(scheduler, "deferdump_external_hit_tokens_total")
        assert hit_tokens < full, "evicted blocks must be misses"
        assert evicted_after_hit == [0], "a surviving block was hit and then evicted before its load"
        assert metric(worker, "deferdump_load_error_blocks_total") > 0, "an evicted hit must be a load error"
        guard.assert_each_freed_once(2 * len(PROMPTS))
        assert_drained_worker(worker)
    assert_shut_down(scheduler, worker)
    assert worker.core.events.leaked == 0


def test_a_killed_redis_fails_dumps_counted_and_every_request_finishes(tiny_model: Path, redis_server: LocalRedis) -> None:
    with running_llm(tiny_model, _config(redis_server.url), max_num_seqs=2) as llm:
        [scheduler] = deferdump_connectors(scheduler_connector(llm))
        [worker] = deferdump_connectors(worker_connector())
        guard = FreeGuard(llm, [worker])
        delayed = record_request_finished(scheduler)
        reference = generate_and_drain(llm, PROMPTS[:2], MAX_TOKENS)  # the server up: the expected tokens
        completed = metric(worker, "deferdump_dumps_completed_total")
        assert completed > 0

        original = worker.wait_for_save
        kills: list[int] = []

        def wait_for_save_then_kill() -> None:
            original()
            if worker.core._pending_dump_tasks and not kills:
                redis_server.kill()  # SIGKILL with this step's dumps in flight
                kills.append(len(worker.core._pending_dump_tasks))

        worker.wait_for_save = wait_for_save_then_kill
        assert llm.reset_prefix_cache()
        fresh = token_prompts(4, 100, seed=91)
        outputs = generate_and_drain(llm, fresh, MAX_TOKENS)
        assert kills, "the server was never killed with dumps in flight"
        assert len(outputs) == len(fresh) and all(len(tokens) == MAX_TOKENS for tokens in outputs)
        failed = sum(metric(worker, "deferdump_dumps_failed_total", {"stage": s}) for s in ("submit", "wait"))
        assert failed > 0, "dumps to a dead server must fail and be counted"
        assert metric(worker, "deferdump_finished_sending_total") == sum(delayed.values())
        assert sum(delayed.values()) >= len(PROMPTS[:2]) + len(fresh)
        guard.assert_each_freed_once(2 + len(fresh))
        assert_drained_worker(worker)

        # Restarted (empty, same port): the next run dumps again without restarting vLLM.
        worker.wait_for_save = original
        redis_server.start()
        assert llm.reset_prefix_cache()
        again = generate_and_drain(llm, PROMPTS[:2], MAX_TOKENS)
        assert again == reference
        assert metric(worker, "deferdump_dumps_completed_total") > completed
        assert int(redis_server.cli("dbsize")) == 2 * FULL_BLOCKS
        guard.assert_each_freed_once(2 + len(fresh) + 2)
        assert_drained_worker(worker)
    assert_shut_down(scheduler, worker)
    assert worker.core.events.leaked == 0
