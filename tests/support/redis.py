"""Real Redis servers for the Redis store's tests: a fresh `redis-server` per test (free port, no
persistence, killed at the end), a shared 3-master Redis Cluster per module, and stores on a fresh
namespace. Test modules register the fixtures they use by importing them."""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from deferdump.reference.stores.redis import RedisStore
from deferdump.reference.testing.redis_server import LocalRedis, LocalRedisCluster


@pytest.fixture
def redis_server() -> Iterator[LocalRedis]:
    """A private redis-server on 127.0.0.1 (no maxmemory), stopped after the test."""
    with LocalRedis() as server:
        yield server


@pytest.fixture
def small_redis() -> Iterator[LocalRedis]:
    """A redis-server limited to 4 MiB with `allkeys-lru`: dumps beyond that evict older blocks silently."""
    with LocalRedis(maxmemory="4mb", policy="allkeys-lru") as server:
        yield server


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """A local Redis Cluster of 3 masters (`redis-cli --cluster create ... --cluster-replicas 0`)."""
    with LocalRedisCluster(3) as cluster:
        yield cluster


@pytest.fixture
def open_store() -> Iterator[Callable[..., RedisStore]]:
    """`open_store(url, **options)`: a RedisStore on a namespace of its own, closed after the test."""
    opened: list[RedisStore] = []

    def factory(url: str, **options: object) -> RedisStore:
        options.setdefault("namespace", f"test-{uuid.uuid4().hex[:12]}")
        store = RedisStore(url, **options)  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()
