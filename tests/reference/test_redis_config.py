"""The Redis keys of `kv_connector_extra_config`: validated with errors naming the key, and `make_store`
opening a RedisStore on a real server, or failing with one line naming the URL when nothing listens."""
from __future__ import annotations

from typing import Any

import pytest

from deferdump.reference.config import ConnectorConfig, make_store
from deferdump.reference.errors import ConfigError
from deferdump.reference.stores.redis import RedisStore, RedisUnavailable
from deferdump.reference.stores.base import ReadyPayload
from deferdump.reference.testing.redis_server import LocalRedis, free_port
from support.redis import redis_server  # noqa: F401 - fixture
from support.stores import rows


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ({"store": "redis"}, "redis_url", "required"),
        ({"store": "redis", "redis_url": 6379}, "redis_url", "URL string"),
        ({"store": "redis", "redis_url": "http://localhost:6379"}, "redis_url", "unknown scheme"),
        ({"store": "redis", "redis_url": "redis://:6379"}, "redis_url", "no host"),
        ({"store": "redis", "redis_url": "redis://h:99999"}, "redis_url", "out of range"),
        ({"store": "redis", "redis_url": "redis+cluster:///"}, "redis_url", "no host"),
        ({"store": "redis", "redis_url": "redis://h", "redis_namespace": ""}, "redis_namespace", "non-empty"),
        ({"store": "redis", "redis_url": "redis://h", "redis_namespace": "a b"}, "redis_namespace", "spaces"),
        ({"store": "redis", "redis_url": "redis://h", "redis_ttl_s": 0}, "redis_ttl_s", "positive"),
        ({"store": "redis", "redis_url": "redis://h", "redis_ttl_s": "60"}, "redis_ttl_s", "positive"),
        ({"store": "redis", "redis_url": "redis://h", "redis_ttl_s": True}, "redis_ttl_s", "positive"),
        ({"store": "redis", "redis_url": "redis://h", "capacity_blocks": 8}, "capacity_blocks", "maxmemory"),
        ({"store": "redis", "redis_url": "redis://h", "store_path": "/tmp/x"}, "store_path", "redis_url"),
        ({"store": "memory", "redis_url": "redis://h"}, "redis_url", "store is 'memory'"),
        ({"store": "file", "store_path": "/tmp/x", "redis_ttl_s": 5}, "redis_ttl_s", "store is 'file'"),
        ({"redis_namespace": "x"}, "redis_namespace", "store is 'memory'"),
        ({"store": "redis", "redis_uri": "redis://h"}, "redis_uri", "unknown config key"),
    ],
)
def test_bad_redis_keys_are_rejected_naming_the_key(extra: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as caught:
        ConnectorConfig.from_extra_config(extra)
    assert caught.value.key == key


def test_good_redis_keys_are_accepted() -> None:
    config = ConnectorConfig.from_extra_config(
        {"store": "redis", "redis_url": "redis+cluster://10.0.0.1:7000", "redis_namespace": "llama3", "redis_ttl_s": 3600}
    )
    assert (config.redis_url, config.redis_namespace, config.redis_ttl_s) == ("redis+cluster://10.0.0.1:7000", "llama3", 3600)
    assert ConnectorConfig.from_extra_config({"store": "redis", "redis_url": "unix:///run/redis.sock"}).redis_ttl_s is None


def test_make_store_opens_a_redis_store_with_its_namespace_and_ttl(redis_server: LocalRedis) -> None:
    config = ConnectorConfig(store="redis", redis_url=redis_server.url, redis_namespace="cfg", redis_ttl_s=30)
    store = make_store(config)
    try:
        assert isinstance(store, RedisStore) and store.namespace == "cfg"
        store.wait(store.dump([b"k"], ReadyPayload(rows(1))))
        ttl_ms = int(redis_server.cli("pttl", "cfg:6b"))
        assert 25_000 < ttl_ms <= 30_000
    finally:
        store.close()


def test_make_store_with_nothing_listening_fails_with_one_line_naming_the_url() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(RedisUnavailable) as caught:
        make_store(ConnectorConfig(store="redis", redis_url=url))
    assert str(caught.value).startswith(f"Redis at {url} is not usable: ") and "\n" not in str(caught.value)
