"""RedisStore against real redis-servers (and a real 3-master Redis Cluster): round trips, UCM's task
semantics, one-round-trip lookups, TTL, and the faults — a value overwritten with garbage, a foreign or
torn record, LRU eviction under maxmemory, `noeviction` OOM, the server killed during dumps and
restarted, and a refused connection at start."""
from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
import torch

from deferdump.reference.stores.file import encode_block
from deferdump.reference.stores.redis import RedisStore, RedisUnavailable
from deferdump.reference.stores.base import LoadError, ReadyPayload, StoreError, TaskNotFound
from deferdump.reference.testing.redis_server import LocalRedis, LocalRedisCluster, free_port
from support.redis import open_store, redis_cluster, redis_server, small_redis  # noqa: F401 - fixtures
from support.stores import GatedPayload, rows

Opener = Callable[..., RedisStore]


def hashes(n: int, tag: bytes = b"h") -> list[bytes]:
    return [tag + i.to_bytes(4, "big") for i in range(n)]


def dump_and_wait(store: RedisStore, keys: list[bytes], data: torch.Tensor) -> None:
    assert store.wait(store.dump(keys, ReadyPayload(data))) is None


def test_round_trip_and_prefix_lookup(redis_server: LocalRedis, open_store: Opener) -> None:
    store = open_store(redis_server.url)
    keys, data = hashes(6), rows(6, nbytes=4096, seed=1)
    assert store.lookup_prefix(keys) == 0
    dump_and_wait(store, keys[:4], data[:4])
    assert store.lookup_prefix(keys) == 4 and store.lookup_prefix(keys[1:3]) == 2 and store.lookup_prefix([]) == 0
    loaded = store.wait(store.load(keys[:4]))
    assert torch.equal(loaded, data[:4])
    stats = store.stats()
    assert (stats.dumps_completed, stats.loads_completed, stats.pending) == (1, 1, 0)
    assert store.audit() == (4, 4 * len(encode_block(keys[0], bytes(4096))), 0)


def test_a_second_store_instance_finds_and_loads_the_blocks(redis_server: LocalRedis, open_store: Opener) -> None:
    """Two connector processes share blocks through the server, not through any local index."""
    writer = open_store(redis_server.url, namespace="shared")
    reader = open_store(redis_server.url, namespace="shared")
    other = open_store(redis_server.url, namespace="elsewhere")
    keys, data = hashes(3), rows(3, nbytes=512, seed=2)
    dump_and_wait(writer, keys, data)
    assert reader.lookup_prefix(keys) == 3 and other.lookup_prefix(keys) == 0
    assert torch.equal(reader.wait(reader.load(keys)), data)


def test_lookup_prefix_is_one_round_trip(redis_server: LocalRedis, open_store: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(redis_server.url)
    keys = hashes(64)
    dump_and_wait(store, keys[:40], rows(40, nbytes=64))
    sends: list[int] = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self: object, command: object, check_health: bool = True) -> None:
        sends.append(1)
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    assert store.lookup_prefix(keys) == 40
    assert len(sends) == 1


def test_check_never_consumes_and_wait_returns_after_the_transfer(redis_server: LocalRedis, open_store: Opener) -> None:
    store = open_store(redis_server.url)
    keys, data = hashes(3), rows(3, nbytes=256)
    payload = GatedPayload(data)
    task = store.dump(keys, payload)  # returns at once: the device copy has not even finished
    assert store.check(task) is False and store.check(task) is False
    assert store.lookup_prefix(keys) == 0
    payload.open()
    deadline = time.monotonic() + 10
    while not store.check(task):
        assert time.monotonic() < deadline
        time.sleep(0.002)
    assert store.check(task) is True  # still there: check never consumes
    assert store.wait(task) is None
    assert store.lookup_prefix(keys) == 3  # the transfer really ended before wait returned
    with pytest.raises(TaskNotFound):
        store.wait(task)
    with pytest.raises(TaskNotFound):
        store.check(task)


def test_ttl_expires_blocks_into_misses(redis_server: LocalRedis, open_store: Opener) -> None:
    # A TTL long enough that no loaded machine reaches it mid-test (0.4 s did: the keys could expire before
    # the first lookup); expiry itself is then brought forward by Redis, not waited out.
    store = open_store(redis_server.url, ttl_s=600)
    keys = hashes(2)
    dump_and_wait(store, keys, rows(2))
    client = redis.Redis(port=redis_server.port)
    assert all(0 < client.pttl(store.key_of(key)) <= 600_000 for key in keys)  # the store set the TTL
    assert store.lookup_prefix(keys) == 2
    for key in keys:
        client.pexpire(store.key_of(key), 1)
    deadline = time.monotonic() + 60
    while client.exists(*(store.key_of(key) for key in keys)):
        assert time.monotonic() < deadline, "Redis never expired the keys"
        time.sleep(0.01)
    assert store.lookup_prefix(keys) == 0
    with pytest.raises(LoadError, match="not stored"):
        store.wait(store.load(keys))


@pytest.mark.parametrize("damage", ["garbage", "foreign", "torn", "bitflip"])
def test_a_damaged_value_is_a_load_error_never_data(redis_server: LocalRedis, open_store: Opener, damage: str) -> None:
    store = open_store(redis_server.url)
    keys, data = hashes(3), rows(3, nbytes=1024, seed=3)
    dump_and_wait(store, keys, data)
    client = redis.Redis(port=redis_server.port)
    key = store.key_of(keys[1])
    good = client.get(key)
    assert good is not None
    bad = {
        "garbage": b"\x00garbage written by someone else",
        "foreign": encode_block(b"another-hash", bytes(1024)),  # a valid record of a different block
        "torn": good[: len(good) // 2],
        "bitflip": good[:-1] + bytes([good[-1] ^ 1]),
    }[damage]
    client.set(key, bad)
    task = store.load(keys)
    with pytest.raises(LoadError) as caught:
        store.wait(task)
    assert caught.value.bad_hashes == (keys[1],)
    assert client.get(key) is None and store.corrupt_deleted == 1  # the bad value is gone: the next lookup misses
    assert store.lookup_prefix(keys) == 1
    assert store.stats().loads_failed == 1


def test_lru_eviction_under_maxmemory_gives_misses_or_load_errors_never_wrong_bytes(
    small_redis: LocalRedis, open_store: Opener
) -> None:
    store = open_store(small_redis.url)
    block_nbytes, count = 64 << 10, 160  # 10 MiB into a 4 MiB server
    keys, data = hashes(count), rows(count, nbytes=block_nbytes, seed=4)
    for start in range(0, count, 16):
        dump_and_wait(store, keys[start : start + 16], data[start : start + 16])
    client = redis.Redis(port=small_redis.port)
    assert int(client.info("stats")["evicted_keys"]) > 0
    present = [index for index in range(count) if client.exists(store.key_of(keys[index]))]
    assert 0 < len(present) < count
    assert store.lookup_prefix(keys) < count
    loaded_ok = errors = 0
    for index in range(count):
        try:
            row = store.wait(store.load([keys[index]]))
        except LoadError as exc:
            assert exc.bad_hashes == (keys[index],) and "not stored" in str(exc)
            errors += 1
        else:
            assert torch.equal(row[0], data[index])
            loaded_ok += 1
    assert loaded_ok >= 1 and errors >= count - len(present)


def test_noeviction_oom_fails_the_dump_and_counts_it(open_store: Opener) -> None:
    with LocalRedis(maxmemory="2mb", policy="noeviction") as server:
        store = open_store(server.url)
        keys, data = hashes(64), rows(64, nbytes=64 << 10)
        failed = 0
        for start in range(0, 64, 8):
            try:
                dump_and_wait(store, keys[start : start + 8], data[start : start + 8])
            except StoreError as exc:
                assert server.url in str(exc) and "OutOfMemoryError" in str(exc) and "maxmemory" in str(exc)
                assert "\n" not in str(exc) and len(str(exc)) < 300  # no block bytes quoted
                failed += 1
        assert failed >= 1 and store.stats().dumps_failed == failed and store.stats().pending == 0
        stored = store.lookup_prefix(keys)
        assert stored >= 1 and torch.equal(store.wait(store.load(keys[:stored])), data[:stored])  # reads still work


def test_server_killed_during_dumps_then_restarted(redis_server: LocalRedis, open_store: Opener) -> None:
    store = open_store(redis_server.url, socket_timeout_s=2.0, connect_timeout_s=1.0)
    dump_and_wait(store, hashes(2, b"before"), rows(2))
    payloads = [GatedPayload(rows(4, nbytes=4096, seed=i)) for i in range(4)]
    tasks = [store.dump(hashes(4, bytes([65 + i])), payload) for i, payload in enumerate(payloads)]
    redis_server.kill()
    for payload in payloads:
        payload.open()
    for task in tasks:
        with pytest.raises(StoreError, match=redis_server.url):
            store.wait(task)
    with pytest.raises(StoreError, match="lookup"):
        store.lookup_prefix(hashes(2, b"before"))
    stats = store.stats()
    assert stats.dumps_failed == 4 and stats.pending == 0 and store.lookup_failures == 1
    redis_server.start()  # same port, empty: no persistence
    assert store.lookup_prefix(hashes(2, b"before")) == 0
    keys, data = hashes(3, b"after"), rows(3, seed=9)
    dump_and_wait(store, keys, data)  # the same store instance: the pool reconnected by itself
    assert torch.equal(store.wait(store.load(keys)), data)
    assert store.stats().dumps_completed == 2


def test_connection_refused_at_start_is_one_clear_error_naming_the_url() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(RedisUnavailable) as caught:
        RedisStore(url, connect_timeout_s=1.0)
    message = str(caught.value)
    assert url in message and "\n" not in message and "refused" in message.lower()


def test_cluster_round_trip_spreads_keys_over_the_masters(redis_cluster: LocalRedisCluster, open_store: Opener) -> None:
    store = open_store(redis_cluster.url)
    peer = open_store(redis_cluster.url, namespace=store.namespace)
    keys, data = hashes(48), rows(48, nbytes=2048, seed=5)
    dump_and_wait(store, keys[:40], data[:40])
    assert peer.lookup_prefix(keys) == 40
    assert torch.equal(peer.wait(peer.load(keys[:40])), data[:40])
    per_node = [int(node.cli("dbsize")) for node in redis_cluster.nodes]
    assert sum(1 for count in per_node if count) >= 2, per_node
    assert store.audit() == (40, 40 * len(encode_block(keys[0], bytes(2048))), 0)
    client = redis.RedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port)
    client.set(store.key_of(keys[7]), b"junk")
    with pytest.raises(LoadError) as caught:
        peer.wait(peer.load(keys[:10]))
    assert caught.value.bad_hashes == (keys[7],)
    assert store.clear() == 39 and store.lookup_prefix(keys) == 0
    client.close()
