"""Soak: many requests through the step loop under store faults, checking the spec's invariants every step.

Each (store, variant) *cell* runs its share of the requests in its own step loop, with a `FaultyStore`
(refused submits, failing checks and waits, slow tasks) around a real `MemoryStore` or `FileStore`, real
CPU KV tensors, `verify_dumps` on, and `InvariantWatch` at every step. At the end the loop drains, the
connectors shut down, and the cell reports what a leak would leave behind: pending tasks, live event
handles, blocks not back in the pool, ids still tracked, a store whose files/bytes disagree with its
index, and resident memory growth between the first and last tenth of the cell's steps.

With `sliding_window` set, each store also gets a "hybrid" cell: the Direct connector (TP=2) on a hybrid
model, a full-attention KV-cache group plus a sliding-window group of that many tokens, whose blocks
leave the window and are freed while their request runs (docs/engine.md). Each cell counts its violations
per check (`violation_counts`): under two KV-cache groups vLLM 0.32 raises on any block-level load error,
which the connector reports for a failed or missed load (an injected fault, a key evicted from a bounded
store), so a hybrid cell can fail on `HybridLoadErrors` alone while its fence holds.

With `load_async` the direct and hybrid cells load asynchronously (docs/async-loads.md): hits wait in
WAITING_FOR_REMOTE_KVS while the store runs the load, and a failed load comes back as block errors (one
group) or a failed receive (hybrid, where vLLM 0.32 takes it instead of raising): `HybridLoadErrors` cannot
occur there. `async_loads` counts the parked requests per cell.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from deferdump.reference.config import HYBRID_FENCES, ConnectorConfig
from deferdump.reference.stores.faults import FaultConfig, FaultyStore
from deferdump.reference.stores.file import TMP_SUFFIX, FileStore
from deferdump.reference.stores.memory import MemoryStore
from deferdump.reference.stores.base import KVStore
from deferdump.reference.stores.redis import RedisStore, RedisUnavailable, check_redis_url
from deferdump.reference.testing.late_copy import LateCopyDevice

from deferdump.reference.errors import UserError
from deferdump.tools.engine.forward import ModelShape
from deferdump.tools.engine.phase_timer import PhaseTimer
from deferdump.tools.engine.scheduler import WorkloadConfig
from deferdump.tools.engine.steploop import LoopConfig, Mode, StepLoop

STORES = ("memory", "file")  # the default cells
KNOWN_STORES = (*STORES, "redis")  # "redis" needs a server: `--store redis --redis-url URL`
VARIANTS = ("direct", "layerwise", "cp")
HYBRID = "hybrid"  # the cell of a hybrid model (variant direct), added per store by `sliding_window`
WORLD_SIZES = {"direct": 2, "layerwise": 1, "cp": 2, HYBRID: 2}  # direct runs as TP=2: per-rank keys, aggregated reports
RSS_TOLERANCE = 0.05


class SoakConfigError(UserError):
    """A soak parameter is out of range (the message names it)."""


@dataclasses.dataclass(frozen=True)
class SoakConfig:
    requests: int = 100_000
    fault_rate: float = 0.01  # probability per submit, check and wait
    slow_task_s: float = 0.002  # each task is slowed by up to this much
    seed: int = 0
    stores: tuple[str, ...] = STORES
    redis_url: str | None = None  # the server of "redis" cells (each cell uses a namespace of its own)
    variants: tuple[str, ...] = VARIANTS
    store_root: Path | None = None  # where FileStore temp dirs go (default: /dev/shm when usable)
    capacity_blocks: int = 96
    copy_lag_s: float = 0.001  # each device copy reads its blocks up to this late (LateCopyDevice)
    workload: WorkloadConfig = WorkloadConfig(
        block_size=4, num_blocks=96, max_running=8, max_batched_tokens=48, prompt_tokens=(4, 48),
        output_tokens=(1, 8), shared_prefix_prob=0.3, shared_prefixes=4, abort_prob=0.01, preempt_prob=0.05,
    )
    shape: ModelShape = ModelShape(
        layers=2, kv_heads=1, head_dim=8, block_size=4, dtype="float32", hidden_dim=16, matmuls_per_layer=1
    )
    sliding_window: int | None = None  # tokens: add a "hybrid" cell per store (full attention + sliding window)
    hybrid_fence: str = "freed"  # the hybrid cells' connector fence ("none": UCM #989 as merged, unsafe)
    load_async: bool = False  # the direct and hybrid cells load asynchronously (layerwise and cp stay synchronous)

    def __post_init__(self) -> None:
        if isinstance(self.requests, bool) or not isinstance(self.requests, int) or self.requests < 1:
            raise SoakConfigError(f"requests must be a positive integer, got {self.requests!r}")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise SoakConfigError(f"faults must be a probability in [0, 1], got {self.fault_rate}")
        if self.slow_task_s < 0 or self.copy_lag_s < 0:
            raise SoakConfigError(f"slow_task_s and copy_lag_s must be >= 0, got {self.slow_task_s}, {self.copy_lag_s}")
        if self.seed < 0:
            raise SoakConfigError(f"seed must be >= 0, got {self.seed}")
        for name, chosen, known in (("store", self.stores, KNOWN_STORES), ("variant", self.variants, VARIANTS)):
            unknown = [value for value in chosen if value not in known]
            if unknown or not chosen:
                raise SoakConfigError(f"unknown or no {name}(s) {unknown} (known: {', '.join(known)})")
        if "redis" in self.stores:
            if self.redis_url is None:
                raise SoakConfigError("store redis needs --redis-url (e.g. redis://127.0.0.1:6379/0)")
            try:
                check_redis_url(self.redis_url)
            except ValueError as exc:
                raise SoakConfigError(f"--redis-url: {exc}") from None
        self._check_hybrid()
        if self.requests < len(self.cells()):
            raise SoakConfigError(f"requests ({self.requests}) must be at least one per cell ({len(self.cells())})")

    def _check_hybrid(self) -> None:
        window = self.sliding_window
        if self.hybrid_fence not in HYBRID_FENCES:
            raise SoakConfigError(f"hybrid-fence must be one of {', '.join(HYBRID_FENCES)}, got {self.hybrid_fence!r}")
        if window is None:
            if self.hybrid_fence != "freed":
                raise SoakConfigError("hybrid-fence applies only with --sliding-window (the hybrid cells)")
            return
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise SoakConfigError(f"sliding-window must be a positive number of tokens, got {window!r}")
        workload = self.workload
        longest = workload.prompt_tokens[1] + workload.output_tokens[1]
        if window > longest - workload.block_size:  # skipped blocks need computed - window + 1 >= block_size
            raise SoakConfigError(
                f"sliding-window {window} never frees a block: requests have at most {longest} tokens and blocks "
                f"{workload.block_size} (use at most {longest - workload.block_size})"
            )
        try:
            self.hybrid_workload()
        except ValueError as exc:
            raise SoakConfigError(f"sliding-window {window}: {exc}") from None

    def cells(self) -> list[tuple[str, str]]:
        """(store, variant) of every cell, the hybrid cells last."""
        cells = [(store, variant) for store in self.stores for variant in self.variants]
        if self.sliding_window is not None:
            cells += [(store, HYBRID) for store in self.stores]
        return cells

    def hybrid_workload(self) -> WorkloadConfig:
        """The hybrid cells' workload: the other cells' with the sliding window."""
        return dataclasses.replace(self.workload, sliding_window=self.sliding_window)


@dataclasses.dataclass
class CellResult:
    """One (store, variant) run."""

    store: str
    variant: str
    world_size: int
    requests: int
    steps: int
    seconds: float
    violations: int
    violation_messages: list[str]
    violation_counts: dict[str, int]  # per check name (the messages are capped, the counts are not)
    pending_tasks: int
    live_event_handles: int
    leaked_event_handles: int
    leaked_blocks: int
    held_requests: int
    tracked_left: int
    verify_mismatches: int
    store_pending: int
    store_consistent: bool
    store_detail: str
    rss_growth: float
    rss_first_mib: float
    rss_last_mib: float
    preemptions: int
    aborts: int
    window_frees: int  # hybrid: sliding-window blocks freed while their request ran or at its finish
    submit_failures: int
    wait_failures: int
    store_errors: int  # failures the store itself reported (failed dumps/loads, unreachable lookups), not injected
    faults_injected: dict[str, int]
    async_loads: int = 0  # requests parked for an asynchronous load (WAITING_FOR_REMOTE_KVS)

    @property
    def ok(self) -> bool:
        return (
            self.violations == 0 and self.pending_tasks == 0 and self.live_event_handles == 0
            and self.leaked_event_handles == 0 and self.leaked_blocks == 0 and self.held_requests == 0
            and self.tracked_left == 0 and self.verify_mismatches == 0 and self.store_pending == 0
            and self.store_consistent and abs(self.rss_growth) <= RSS_TOLERANCE
        )


@dataclasses.dataclass
class SoakReport:
    config: SoakConfig
    cells: list[CellResult]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(cell.ok for cell in self.cells)

    def to_json(self) -> dict[str, Any]:
        """The object `deferdump soak --json` prints: totals first, then one entry per cell."""
        cells = self.cells
        worst_rss = max((cell.rss_growth for cell in cells), key=abs, default=0.0)
        return {
            "ok": self.ok,
            "requests": sum(cell.requests for cell in cells),
            "violations": sum(cell.violations for cell in cells),
            "pending_tasks": sum(cell.pending_tasks for cell in cells),
            "live_event_handles": sum(cell.live_event_handles for cell in cells),
            "leaked_blocks": sum(cell.leaked_blocks for cell in cells),
            "rss_growth": worst_rss,
            "seconds": round(self.seconds, 3),
            "steps": sum(cell.steps for cell in cells),
            "verify_mismatches": sum(cell.verify_mismatches for cell in cells),
            "store_consistent": all(cell.store_consistent for cell in cells),
            "fault_rate": self.config.fault_rate,
            "slow_task_s": self.config.slow_task_s,
            "seed": self.config.seed,
            "store_errors": sum(cell.store_errors for cell in cells),
            "sliding_window": self.config.sliding_window,
            "hybrid_fence": self.config.hybrid_fence,
            "load_async": self.config.load_async,
            "async_loads": sum(cell.async_loads for cell in cells),
            "window_frees": sum(cell.window_frees for cell in cells),
            "violation_counts": _sum_counts(cell.violation_counts for cell in cells),
            "faults_injected": _sum_counts(cell.faults_injected for cell in cells),
            "cells": [dataclasses.asdict(cell) | {"ok": cell.ok} for cell in cells],
        }


def _sum_counts(counts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for count in counts:
        for key, value in count.items():
            total[key] = total.get(key, 0) + value
    return dict(sorted(total.items()))


def default_store_root() -> Path | None:
    """A tmpfs for FileStore cells when there is one: fsync on a disk costs ~10 ms per block here."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


@contextlib.contextmanager
def _open_store(
    kind: str, config: SoakConfig, seed: int
) -> Iterator[tuple[KVStore, Callable[[], tuple[bool, str]], Callable[[], int]]]:
    """The cell's store (wrapped in a FaultyStore), a function auditing its files/bytes against its index, and
    one counting the failures the store reported itself."""
    faults = FaultConfig(
        submit_fail=config.fault_rate, check_fail=config.fault_rate, wait_fail=config.fault_rate,
        delay_s=config.slow_task_s, seed=seed,
    )
    with contextlib.ExitStack() as stack:
        inner: MemoryStore | FileStore | RedisStore
        if kind == "redis":
            assert config.redis_url is not None
            redis_store = _open_redis(config.redis_url, patience_s=REDIS_REOPEN_PATIENCE_S)
            inner = redis_store
            stack.callback(_clear_quietly, redis_store)

            def audit() -> tuple[bool, str]:
                deadline = time.monotonic() + REDIS_REOPEN_PATIENCE_S  # a server restarting now comes back
                while True:
                    try:
                        records, nbytes, bad = redis_store.audit()
                    except Exception as exc:  # noqa: BLE001 - still down at the deadline: cannot vouch for anything
                        if time.monotonic() < deadline:
                            time.sleep(0.2)
                            continue
                        return False, f"audit failed: {exc}"
                    return bad == 0, f"{records} records / {nbytes} B in Redis, {bad} failing verification"
        elif kind == "memory":
            inner = MemoryStore(config.capacity_blocks)

            def audit() -> tuple[bool, str]:
                stats, resident = inner.stats(), inner.resident_bytes()
                ok = stats.bytes == resident and stats.blocks <= config.capacity_blocks
                return ok, f"index {stats.blocks} blocks / {stats.bytes} B, resident {resident} B"
        else:
            root = config.store_root or default_store_root()
            try:
                directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="deferdump-soak-", dir=root)))
            except OSError as error:
                raise SoakConfigError(f"store dir {root}: cannot create a temp directory there ({error.strerror})") from error
            inner = FileStore(directory / "store", capacity_blocks=config.capacity_blocks)

            def audit() -> tuple[bool, str]:
                stats = inner.stats()
                files, nbytes = inner.disk_usage()
                leftovers = sum(1 for p in (directory / "store").rglob(f"*{TMP_SUFFIX}"))
                ok = (files, nbytes) == (stats.blocks, stats.bytes) and leftovers == 0
                return ok, f"index {stats.blocks} blocks / {stats.bytes} B, disk {files} files / {nbytes} B, {leftovers} tmp"
        stack.callback(inner.close)
        store: KVStore = FaultyStore(inner, faults) if faults.active else inner

        def errors() -> int:
            stats = inner.stats()
            return stats.dumps_failed + stats.loads_failed + (inner.lookup_failures if isinstance(inner, RedisStore) else 0)

        yield store, audit, errors


def _clear_quietly(store: RedisStore) -> None:
    """Delete a finished cell's namespace; a server that is down keeps nothing anyway (no persistence)."""
    try:
        store.clear()
    except Exception:  # noqa: BLE001 - cleanup only
        pass


def run_cell(
    config: SoakConfig,
    store_kind: str,
    variant: str,
    requests: int,
    *,
    on_progress: Callable[[int], None] | None = None,
) -> CellResult:
    """Run `requests` requests through one (store, variant) step loop and audit everything it leaves."""
    world_size = WORLD_SIZES[variant]
    hybrid = variant == HYBRID
    cell_seed = config.seed * 1000 + KNOWN_STORES.index(store_kind) * 10 + (*VARIANTS, HYBRID).index(variant)
    workload = dataclasses.replace(config.hybrid_workload() if hybrid else config.workload, seed=cell_seed)
    connector = ConnectorConfig(
        variant="direct" if hybrid else variant, block_size=workload.block_size, verify_dumps=True, copy_threads=1,
        cp_world_size=world_size if variant == "cp" else 1, hybrid_fence=config.hybrid_fence,
        load_async=config.load_async and variant in ("direct", HYBRID),
    )
    process = psutil.Process()
    rss: list[int] = []
    started = time.perf_counter()
    with _open_store(store_kind, config, cell_seed) as (store, audit, store_errors):
        loop = StepLoop(
            LoopConfig(workload, config.shape, connector, Mode.DEFERRED, world_size=world_size, check_invariants=True),
            store,
            timer=PhaseTimer(keep_steps=False),
            device_factory=lambda rank: LateCopyDevice(config.copy_lag_s, seed=cell_seed + rank),
        )
        freed_seen = 0

        def on_step(current: StepLoop) -> None:
            nonlocal freed_seen
            rss.append(process.memory_info().rss)
            freed = current.scheduler.freed_total
            if on_progress is not None and freed != freed_seen:
                on_progress(freed - freed_seen)
            freed_seen = freed

        loop.run(requests=requests, on_step=on_step)
        shutdown = loop.shutdown()
        store_pending = store.stats().pending
        consistent, detail = audit()
        errors = store_errors()
        injected = dict(store.injected) if isinstance(store, FaultyStore) else {}
    seconds = time.perf_counter() - started
    assert loop.watch is not None
    growth, first, last = _rss_growth(rss)
    sched = loop.scheduler
    return CellResult(
        store=store_kind, variant=variant, world_size=world_size, requests=sched.admitted_total, steps=shutdown.steps,
        seconds=round(seconds, 3), violations=loop.watch.violation_count,
        violation_messages=list(loop.watch.messages), violation_counts=dict(sorted(loop.watch.counts.items())),
        pending_tasks=shutdown.pending_tasks,
        live_event_handles=shutdown.live_event_handles, leaked_event_handles=shutdown.leaked_event_handles,
        leaked_blocks=shutdown.leaked_blocks, held_requests=shutdown.held_requests, tracked_left=shutdown.tracked_left,
        verify_mismatches=shutdown.verify_mismatches, store_pending=store_pending, store_consistent=consistent,
        store_detail=detail, rss_growth=growth, rss_first_mib=first, rss_last_mib=last,
        preemptions=sched.preempted_total, aborts=sched.aborted_total,
        window_frees=sched.window_freed_total + sched.finish_window_freed_total, submit_failures=shutdown.submit_failures,
        wait_failures=shutdown.wait_failures, store_errors=errors, faults_injected=injected,
        async_loads=sched.async_loads_total,
    )


def _rss_growth(samples: list[int]) -> tuple[float, float, float]:
    """(last tenth / first tenth − 1, first MiB, last MiB) of per-step RSS samples."""
    if len(samples) < 10:
        return 0.0, 0.0, 0.0
    tenth = len(samples) // 10
    first = statistics.mean(samples[:tenth])
    last = statistics.mean(samples[-tenth:])
    return round(last / first - 1.0, 5), round(first / 2**20, 2), round(last / 2**20, 2)


REDIS_REOPEN_PATIENCE_S = 30.0  # a cell opening its store while the server restarts waits this long


def _open_redis(url: str, *, patience_s: float) -> RedisStore:
    """A RedisStore in a fresh namespace; while the server is unreachable, retry for `patience_s` (a restart
    between two cells is part of the soak), then give up with one line."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return RedisStore(url, namespace=f"deferdump-soak-{uuid.uuid4().hex[:12]}",
                              socket_timeout_s=2.0, connect_timeout_s=0.5)
        except RedisUnavailable as exc:
            if time.monotonic() >= deadline:
                raise SoakConfigError(str(exc)) from None
            time.sleep(0.2)


def _probe_redis(url: str) -> None:
    """Fail at once, with one line naming the URL, when no server answers before the soak starts."""
    _open_redis(url, patience_s=0.0).close()


def run_soak(config: SoakConfig, *, on_progress: Callable[[int], None] | None = None) -> SoakReport:
    """Split `config.requests` over every (store, variant) cell and run them one after another."""
    cells = config.cells()
    if config.redis_url is not None and "redis" in config.stores:
        _probe_redis(config.redis_url)
    share, extra = divmod(config.requests, len(cells))
    started = time.perf_counter()
    results = [
        run_cell(config, store, variant, share + (1 if index < extra else 0), on_progress=on_progress)
        for index, (store, variant) in enumerate(cells)
    ]
    return SoakReport(config, results, time.perf_counter() - started)
