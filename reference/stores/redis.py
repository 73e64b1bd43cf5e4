"""A block store shared through Redis (or a Redis Cluster): several vLLM instances find each other's blocks.

One key per block, `<namespace>:<block hash hex>`, holding the FileStore record (magic, version, the block
hash, payload length, XXH3-128 digest, then the bytes; format-1 records with blake2b-256 still read): a value that was torn, written by someone else under
our key, or corrupted is detected by `load` and reported as a `LoadError`, never returned as data (and is
deleted, if it is still the value that failed, so the next lookup misses). A key evicted by Redis's
`maxmemory` policy or expired by the optional TTL is simply a miss; capacity is Redis's business, so this
store keeps no local index and no capacity of its own (`stats().blocks/bytes` stay 0).

Round trips: `lookup_prefix` is one pipelined batch of EXISTS; a dump or load task sends its blocks as
pipelined SETs / GETs in batches of at most `batch_bytes`, checking between batches whether a timed-out
`wait` asked it to stop. The task semantics (submit returns at once, `check` never consumes, `wait`
returns only after the transfer stopped) are `ThreadedStore`'s.

Failures: a lost connection, a refused write (`noeviction` OOM) or a timeout fails the task with a
`StoreError` naming the URL; the pool reconnects on the next command, so a restarted server serves the
next task without reopening the store. A lookup that cannot reach Redis raises `StoreError` (the
connector treats a failed lookup as a miss) and is counted in `lookup_failures`.

URLs: `redis://`, `rediss://`, `unix://` as redis-py reads them; `redis+cluster://host:port` (or
`rediss+cluster://`) for a Redis Cluster through redis-py's `RedisCluster` (any node as the seed).
"""
from __future__ import annotations

import hashlib
import logging
import threading
import urllib.parse
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from deferdump.reference.stores.file import decode_block_view, encode_block
from deferdump.reference.stores.base import BlockPayload, LoadError, StoreError, StoreTask
from deferdump.reference.stores.threaded import BadBlock, CancelFlag, ThreadedStore, _Cancelled

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "deferdump"
DEFAULT_SOCKET_TIMEOUT_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 2.0
DEFAULT_BATCH_BYTES = 8 << 20  # per pipeline: bounds its memory; a timed-out wait stops a task between batches
PLAIN_SCHEMES = ("redis", "rediss", "unix")
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# Delete a key only while it still holds the value that failed to verify (by SHA-1, so the bad value is not
# sent back): a good record another instance wrote meanwhile stays.
_DELETE_IF_UNCHANGED = """
local value = redis.call('GET', KEYS[1])
if value and redis.sha1hex(value) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisUnavailable(StoreError):
    """Redis cannot be reached or used at the URL (raised when the store opens)."""


def check_redis_url(url: object) -> tuple[str, bool]:
    """(the URL redis-py connects to, whether it names a cluster); `ValueError` saying what is wrong."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"must be a redis:// or redis+cluster:// URL string, got {url!r}")
    parsed = urllib.parse.urlsplit(url)
    scheme = parsed.scheme.lower()
    if scheme in CLUSTER_SCHEMES:
        if not parsed.hostname:
            raise ValueError(f"{url!r} names no host")
        return urllib.parse.urlunsplit(parsed._replace(scheme=CLUSTER_SCHEMES[scheme])), True
    if scheme not in PLAIN_SCHEMES:
        known = ", ".join(f"{name}://" for name in (*PLAIN_SCHEMES, *CLUSTER_SCHEMES))
        raise ValueError(f"{url!r}: unknown scheme {parsed.scheme!r} (expected {known})")
    if scheme != "unix" and not parsed.hostname:
        raise ValueError(f"{url!r} names no host")
    try:
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"{url!r}: {exc}") from None
    return url, False


def _redis() -> Any:
    try:
        import redis  # noqa: PLC0415 - optional dependency, imported only when a Redis store is opened
    except ImportError as exc:
        raise RedisUnavailable("the Redis store needs redis-py: pip install 'deferdump[redis]'") from exc
    return redis


class RedisStore(ThreadedStore):
    """Blocks as Redis values under `<namespace>:<hash hex>`, shared by every store on the same server."""

    def __init__(
        self,
        url: str,
        namespace: str = DEFAULT_NAMESPACE,
        ttl_s: float | None = None,
        *,
        workers: int = 2,
        socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        connect_url, cluster = check_redis_url(url)
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"namespace must be a non-empty string, got {namespace!r}")
        if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not ttl_s >= 0.001):
            raise ValueError(f"ttl_s must be a positive number of seconds (>= 0.001) or None, got {ttl_s!r}")
        if batch_bytes < 1:
            raise ValueError(f"batch_bytes must be >= 1, got {batch_bytes}")
        super().__init__(None, workers=workers, name="redis-store")
        self.url = url
        self.namespace = namespace
        self.cluster = cluster
        self._ttl_ms = None if ttl_s is None else max(1, round(ttl_s * 1000))
        self._batch_bytes = batch_bytes
        self._prefix = f"{namespace}:".encode()
        self._counter_lock = threading.Lock()
        self._lookup_failures = 0
        self._corrupt_deleted = 0
        try:
            self._client = self._connect(connect_url, workers, socket_timeout_s, connect_timeout_s)
        except BaseException:
            super().close()
            raise
        logger.info("RedisStore %s (namespace %r, ttl %s): connected", url, namespace, ttl_s)

    def _connect(self, connect_url: str, workers: int, socket_timeout_s: float, connect_timeout_s: float) -> Any:
        """A pooled client (one connection per worker and for lookups), checked with a PING."""
        redis = _redis()
        from redis.backoff import NoBackoff  # noqa: PLC0415
        from redis.retry import Retry  # noqa: PLC0415

        # One immediate retry: a pooled connection broken by a server restart is replaced on the retry;
        # a server that is down fails the task after one reconnect attempt instead of minutes of back-off.
        options: dict[str, Any] = {
            "socket_timeout": socket_timeout_s, "socket_connect_timeout": connect_timeout_s,
            "retry": Retry(NoBackoff(), 1), "health_check_interval": 0,
        }
        try:
            if self.cluster:
                client = redis.RedisCluster.from_url(connect_url, max_connections=workers + 2, **options)
            else:
                client = redis.Redis.from_url(connect_url, max_connections=workers + 2, **options)
            client.ping()
        except redis.RedisError as exc:
            raise RedisUnavailable(f"Redis at {self.url} is not usable: {_describe(exc)}") from None
        return client

    # ------------------------------------------------------------------ keys
    def key_of(self, block_hash: bytes) -> bytes:
        """The Redis key of a block (tests overwrite values through it)."""
        return self._prefix + block_hash.hex().encode()

    def _pipeline(self) -> Any:
        return self._client.pipeline() if self.cluster else self._client.pipeline(transaction=False)

    def _failure(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"{what}: Redis at {self.url}: {_describe(exc)}")

    # --------------------------------------------------------------- KVStore
    def lookup_prefix(self, block_hashes: Sequence[bytes]) -> int:
        """Leading hashes whose keys exist, in one pipelined round trip (per cluster node)."""
        hashes = list(block_hashes)
        if not hashes:
            return 0
        redis = _redis()
        pipe = self._pipeline()
        for block_hash in hashes:
            pipe.exists(self.key_of(block_hash))
        try:
            found = pipe.execute()
        except redis.RedisError as exc:
            with self._counter_lock:
                self._lookup_failures += 1
            raise self._failure(f"lookup of {len(hashes)} block(s)", exc) from None
        hits = 0
        for present in found:
            if not present:
                break
            hits += 1
        return hits

    def _dump_rows(self, task: StoreTask, payload: BlockPayload, cancel: CancelFlag) -> None:
        rows = self._payload_rows(task, payload)
        redis = _redis()
        hashes = task.block_hashes
        for batch in self._batches(len(hashes), rows[0].numel() if rows else None):
            if cancel.is_set():
                raise _Cancelled(f"dump task {task.task_id} stopped after a timed-out wait ({batch.start} block(s) written)")
            pipe = self._pipeline()
            for index in batch:
                row = rows[index].contiguous().numpy()
                pipe.set(self.key_of(hashes[index]), encode_block(hashes[index], row.data), px=self._ttl_ms)
            try:
                pipe.execute()
            except redis.RedisError as exc:
                raise self._failure(f"dump task {task.task_id} (blocks {batch.start}-{batch.stop - 1} of {len(hashes)})", exc) from None
        return None

    def _run_load(self, task: StoreTask, cancel: CancelFlag) -> torch.Tensor:
        redis = _redis()
        hashes = task.block_hashes
        values: list[bytes | None] = []
        for batch in self._batches(len(hashes), None):
            if cancel.is_set():
                raise _Cancelled(f"load task {task.task_id} stopped after a timed-out wait")
            pipe = self._pipeline()
            for index in batch:
                pipe.get(self.key_of(hashes[index]))
            try:
                values.extend(pipe.execute())
            except redis.RedisError as exc:
                raise LoadError(f"load task {task.task_id}: Redis at {self.url}: {_describe(exc)}", hashes) from None
        payloads: list[memoryview] = []
        bad: dict[bytes, str] = {}
        for block_hash, raw in zip(hashes, values):
            if raw is None:
                bad[block_hash] = "not stored (never dumped, evicted or expired)"
                continue
            try:
                payloads.append(decode_block_view(block_hash, raw))
            except BadBlock as exc:
                bad[block_hash] = str(exc)
                self._delete_if_unchanged(block_hash, raw, str(exc))
        if not bad and len({view.nbytes for view in payloads}) > 1:
            bad = {h: "block sizes differ within one load" for h in hashes}
        if bad:
            detail = "; ".join(f"{h.hex()}: {reason}" for h, reason in bad.items())
            raise LoadError(f"load task {task.task_id}: {len(bad)} bad block(s): {detail}", list(bad))
        if not payloads:
            return torch.empty((0, 0), dtype=torch.uint8)
        out = torch.empty((len(payloads), payloads[0].nbytes), dtype=torch.uint8)
        target = out.numpy()
        for index, view in enumerate(payloads):
            target[index] = np.frombuffer(view, dtype=np.uint8)  # one copy, from the reply into the result
        return out

    def _delete_if_unchanged(self, block_hash: bytes, raw: bytes, reason: str) -> None:
        redis = _redis()
        try:
            deleted = self._client.eval(_DELETE_IF_UNCHANGED, 1, self.key_of(block_hash), hashlib.sha1(raw).hexdigest())
        except redis.RedisError as exc:
            logger.warning("Redis block %s is bad (%s) and could not be deleted: %s", block_hash.hex(), reason, exc)
            return
        if deleted:
            with self._counter_lock:
                self._corrupt_deleted += 1
            logger.warning("Redis block %s is bad (%s): deleted", block_hash.hex(), reason)

    def _batches(self, count: int, row_nbytes: int | None) -> list[range]:
        """Index ranges of at most `batch_bytes` each (loads, whose sizes are unknown, go in one batch)."""
        if not count:
            return []
        per_batch = count if not row_nbytes else max(1, self._batch_bytes // row_nbytes)
        return [range(start, min(count, start + per_batch)) for start in range(0, count, per_batch)]

    # ------------------------------------------------- ThreadedStore hooks
    # The generic per-block paths are replaced by the pipelined `_run_dump`/`_run_load` above.
    def _write_block(self, block_hash: bytes, row: torch.Tensor) -> int:
        raise NotImplementedError("RedisStore writes whole batches in _run_dump")

    def _read_block(self, block_hash: bytes) -> torch.Tensor:
        raise NotImplementedError("RedisStore reads whole batches in _run_load")

    def _drop_block(self, block_hash: bytes) -> None:
        """Never called: with no capacity of its own the ledger evicts nothing (Redis's maxmemory does)."""

    # ---------------------------------------------------------------- audit
    @property
    def lookup_failures(self) -> int:
        """Lookups that could not reach Redis (each raised `StoreError`)."""
        with self._counter_lock:
            return self._lookup_failures

    @property
    def corrupt_deleted(self) -> int:
        """Values that failed to verify on load and were deleted."""
        with self._counter_lock:
            return self._corrupt_deleted

    def scan_keys(self) -> list[bytes]:
        """Every key of this namespace (SCAN, all cluster nodes): audits and tests, not the hot path."""
        return list(self._client.scan_iter(match=self._prefix + b"*", count=1000))

    def audit(self) -> tuple[int, int, int]:
        """(records, their bytes, records that do not verify) in this namespace now."""
        records = nbytes = bad = 0
        for key in self.scan_keys():
            raw = self._client.get(key)
            if raw is None:
                continue  # evicted or expired between SCAN and GET
            records += 1
            nbytes += len(raw)
            try:
                decode_block_view(bytes.fromhex(key[len(self._prefix):].decode()), raw)
            except (BadBlock, ValueError):
                bad += 1
        return records, nbytes, bad

    def clear(self) -> int:
        """Delete every key of this namespace; returns how many (tests and soak cells clean up with it)."""
        deleted = 0
        for key in self.scan_keys():
            deleted += int(self._client.delete(key))
        return deleted

    def close(self) -> None:
        """Drain the tasks, then close every pooled connection."""
        super().close()
        client = getattr(self, "_client", None)
        if client is not None:
            client.close()

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, namespace={self.namespace!r})"


def _describe(exc: BaseException) -> str:
    """One line: the exception's class and Redis's reason (redis-py quotes a failed pipeline command's
    arguments, i.e. kilobytes of block bytes; they are cut)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    marker = "of pipeline caused error: "
    if marker in text:
        text = text.split(marker, 1)[1]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
