"""[redis] Two vLLM engines in two processes share one Redis (and then one 3-master Redis Cluster): the
second finds every full prompt block the first dumped as an external hit, loads it, and produces the
same greedy tokens — which it can only do if the bytes it loaded are the ones the first engine dumped."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: the Redis fixtures live in tests/support/redis.py
from support.redis import redis_cluster, redis_server  # noqa: E402,F401 - fixtures

from deferdump.reference.testing.redis_server import LocalRedis, LocalRedisCluster  # noqa: E402

PROMPTS, FULL_BLOCKS_PER_PROMPT, BLOCK_SIZE = 3, 3, 32
NODE_TIMEOUT_S = 300
pytestmark = pytest.mark.slow  # long file: tests/conftest.py hands it to a worker first


def run_node(model: Path, url: str, namespace: str, workdir: Path, name: str) -> dict:
    """One engine in its own Python process; its result JSON."""
    result = workdir / f"{name}.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(HERE / "redis_node_driver.py"), str(model), url, namespace, str(result)],
        env=env, capture_output=True, text=True, timeout=NODE_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(result.read_text())


def assert_shared(first: dict, second: dict) -> None:
    full_tokens = FULL_BLOCKS_PER_PROMPT * BLOCK_SIZE
    assert first["cached"] == [0] * PROMPTS and first["counters"]["external_hit_tokens_total"] == 0
    assert first["counters"]["dumps_completed_total"] == first["counters"]["dumps_submitted_total"] > 0
    assert second["cached"] == [full_tokens] * PROMPTS  # every full prompt block came from Redis
    assert second["counters"]["external_hit_tokens_total"] == PROMPTS * full_tokens
    assert second["counters"]["loads_completed_total"] == PROMPTS
    assert second["outputs"] == first["outputs"], "greedy outputs differ after loading the first engine's KV"
    for result in (first, second):
        counters = result["counters"]
        assert counters["load_error_blocks_total"] == 0 and counters["verify_mismatches_total"] == 0
        assert counters["pending_dump_tasks"] == 0 and counters["live_event_handles"] == 0


def test_two_engines_share_prefix_blocks_through_one_redis(
    tiny_model: Path, store_dir: Path, redis_server: LocalRedis
) -> None:
    namespace = f"vllm-{uuid.uuid4().hex[:8]}"
    first = run_node(tiny_model, redis_server.url, namespace, store_dir, "first")
    keys = int(redis_server.cli("dbsize"))
    assert keys == PROMPTS * FULL_BLOCKS_PER_PROMPT, keys
    second = run_node(tiny_model, redis_server.url, namespace, store_dir, "second")
    assert_shared(first, second)


def test_two_engines_share_prefix_blocks_through_a_redis_cluster(
    tiny_model: Path, store_dir: Path, redis_cluster: LocalRedisCluster
) -> None:
    namespace = f"vllm-{uuid.uuid4().hex[:8]}"
    first = run_node(tiny_model, redis_cluster.url, namespace, store_dir, "first")
    per_node = [int(node.cli("dbsize")) for node in redis_cluster.nodes]
    assert sum(per_node) == PROMPTS * FULL_BLOCKS_PER_PROMPT and sum(1 for n in per_node if n) >= 2, per_node
    second = run_node(tiny_model, redis_cluster.url, namespace, store_dir, "second")
    assert_shared(first, second)


def test_an_engine_whose_redis_refuses_connections_fails_at_start_naming_the_url(
    tiny_model: Path, store_dir: Path
) -> None:
    from deferdump.reference.testing.redis_server import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(AssertionError) as caught:
        run_node(tiny_model, url, "refused", store_dir, "refused")
    assert f"Redis at {url} is not usable: ConnectionError" in str(caught.value)
