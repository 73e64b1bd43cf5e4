"""Replay one `mro` counterexample against a connector class: the engine's schedule from the trace, the
class's own answers, and a watch on the blocks its store tasks read.

The trace fixes what vLLM does (allocations, sliding-window frees, preemptions, finishes, the forward's
writes); the class's answers decide which of those the engine may do. So the replay compares each answer
that moves the engine (``request_finished``'s delay, ``get_finished``'s finished sends) with the trace's
record of the class: where they differ, the trace is not a run of this class and the replay stops
(``diverged``). Store timing is free (any store may be slow), so the recording store finishes a task only
when the class waits it or the trace's ``task_complete`` names its ordinal. A hazard is then a real one:

* ``NoOverwriteWhileDumpingInv``: the forward writes a block that a running store task reads;
* ``NoUnexpectedReportInv``: ``get_finished`` reports a request the class never delayed (vLLM asserts).
"""
from __future__ import annotations

import importlib.util
import pickle
import sys
import traceback
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deferdump.reference.errors import DeferDumpError
from deferdump.tools.mro.run.store import NULL_BLOCK, BlockId, RecordingStore, StoreCallUnmodelled
from deferdump.tools.mro.run.stubs import StubMissing, stub_modules

__all__ = ["ReplayOutcome", "replay_counterexample", "run_class"]

_MAX_CALLS_SHOWN = 60
_NUM_BLOCKS = 64  # the layout's block count: more than any model's pool (block ids are the model's b1, b2, ...)


@dataclass
class ReplayOutcome:
    """``reproduced``: the class's own calls reach the hazard; ``diverged``: the class answered otherwise or
    raised, so the trace is not one of its runs; ``not_runnable``: it could not be imported, built or driven."""

    status: str
    detail: str
    hazard: str | None = None
    step: int | None = None
    calls: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"status": self.status, "detail": self.detail, "hazard": self.hazard, "step": self.step,
                "calls": self.calls[-_MAX_CALLS_SHOWN:]}


class _Stop(DeferDumpError):
    def __init__(self, outcome: ReplayOutcome) -> None:
        super().__init__(outcome.detail)
        self.outcome = outcome


def plain(value: Any) -> Any:
    """A trace value (``#set``/``#tup``/``#map``/``#bigint``, model values ``x_OF_MODEL``) as Python data."""
    if isinstance(value, dict):
        if "#set" in value:  # a list: sets of records hold dicts
            return sorted((plain(v) for v in value["#set"]), key=repr)
        if "#tup" in value:
            return tuple(plain(v) for v in value["#tup"])
        if "#bigint" in value:
            return int(value["#bigint"])
        if "#map" in value:
            return {plain(k): plain(v) for k, v in value["#map"]}
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, str) and value.endswith("_OF_MODEL"):
        return value[: -len("_OF_MODEL")]
    return value


def _block(name: object) -> BlockId:
    text = str(name)
    if not text.startswith("b") or not text[1:].isdigit():
        raise _Stop(ReplayOutcome("not_runnable", f"a block named {text!r} in the trace"))
    return BlockId(text[1:])


class _BlocksView:
    """vLLM's ``KVCacheBlocks`` as ``update_state_after_alloc`` sees it: the request's block ids per group."""

    def __init__(self, ids: tuple[list[int], ...]) -> None:
        self._ids = ids

    def get_block_ids(self, allow_none: bool = False) -> tuple[list[int], ...]:
        return self._ids

    def get_unhashed_block_ids(self) -> list[int]:
        return list(self._ids[0])


def import_class(paths: Sequence[str], name: str) -> type:
    """Import ``paths`` afresh as modules named by their stems (their folders first on ``sys.path``, so they
    import each other) and return the class ``name``. Fresh: a module binds its store client at import, and
    each replay has its own recording store (:func:`forget_modules` drops them after the replay)."""
    found: type | None = None
    for raw in paths:
        path = Path(raw).resolve()
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        module_name = path.stem
        module = sys.modules.get(module_name)
        if module is None or getattr(module, "__file__", None) != str(path):  # imported by a sibling: kept
            spec = importlib.util.spec_from_file_location(module_name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        candidate = getattr(module, name, None)
        if isinstance(candidate, type):
            found = candidate
    if found is None:
        raise _Stop(ReplayOutcome("not_runnable", f"no class {name} in {', '.join(paths)}"))
    return found


def reimport_class(paths: Sequence[str], name: str) -> type:
    """``name`` from a fresh import of ``paths``: a copy of the class with module state of its own."""
    forget_modules(paths)
    return import_class(paths, name)


@dataclass(frozen=True)
class Reimport:
    """How to load another copy of the judged class (another process's)."""

    paths: Sequence[str]
    name: str

    def __call__(self) -> type:
        return reimport_class(self.paths, self.name)


def _modules_from(paths: Sequence[str]) -> dict[str, types.ModuleType]:
    """The modules imported from ``paths``' folders now (one process's copy of the connector's code)."""
    folders = {str(Path(raw).resolve().parent) for raw in paths}
    return {name: module for name, module in list(sys.modules.items())
            if getattr(module, "__file__", None) and str(Path(module.__file__).parent) in folders}


@contextmanager
def _as_process(modules: Mapping[str, types.ModuleType]) -> Iterator[None]:
    """Within the block, ``sys.modules`` names ``modules`` (one process's copy), so pickle finds its classes."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def forget_modules(paths: Sequence[str]) -> None:
    """Drop the modules :func:`import_class` imported (and anything imported from their folders)."""
    folders = {str(Path(raw).resolve().parent) for raw in paths}
    for module_name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and str(Path(origin).parent) in folders:
            del sys.modules[module_name]


class _Replay:
    """The engine around one class: one scheduler-side instance and a worker per rank (two on an MLA case).

    With ``follow`` the class's answers are not compared with a trace's: a driver that chooses vLLM's moves
    from those answers (:mod:`.explore`) reads them back (``delayed``, ``step_emitted``)."""

    def __init__(self, cls: type, path: str, case: str, store: RecordingStore, stubs: Any, layers: int = 1,
                 follow: bool = False, reimport: "Reimport | None" = None) -> None:
        self.cls = cls
        self.path = path  # "hma", "non_hma" or "multi"
        self.hybrid = case == "hybrid"
        self.follow = follow
        self.ranks = [0, 1] if case == "mla" else [0]
        self.store = store
        self.stubs = stubs
        self.calls: list[str] = []
        self.fa: dict[str, list[int]] = {}
        self.sw: dict[str, list[int]] = {}
        self.seen: set[str] = set()
        self.resumed: set[str] = set()
        self.delayed: set[str] = set()  # requests the class delayed that vLLM has not freed yet
        # block ids each request had when the class delayed it (vLLM holds them while it is in ``delayed``)
        self.delayed_ids: dict[str, tuple[list[int], ...]] = {}
        self.remaining: dict[str, int] = {}  # KVOutputAggregator's count of reports still needed, per request
        self.step_emitted: set[str] = set()  # the ids the aggregator passed to the scheduler this step
        self.handed_finished: set[str] = set()  # ids build_connector_meta was told finished, since last scheduled new
        self.meta: Any = None
        self.step = 0
        self.block_pool: Any = None  # the scheduler's GPU block pool (block_pool.BlockPool), bound after __init__
        self.worker_meta: Any = None  # this step's worker metadata, aggregated over the ranks as vLLM does
        self.worker_stats: Any = None  # this step's get_kv_connector_stats, aggregated likewise
        self.worker_events: Any = None  # this step's get_kv_connector_kv_cache_events, combined likewise
        # Followed as a MultiConnector child (path "multi"), the engine plays the parent and a sibling that delays
        # every request (the model's multi case): the parent's request_finished delays every finish, its
        # get_transfer_results passes a report on only once no extra async save of the id is pending
        self.sibling_plays = follow and path == "multi"
        self.multi_extra: dict[str, int] = {}  # MultiConnector._extra_async_saves as the worker holds it
        self.sibling_owed: set[str] = set()  # finished ids the sibling has not reported yet
        world = len(self.ranks)
        # The case's KV-cache layout, given to both roles as vLLM 0.32 does (scheduler.py ~176-180,
        # kv_transfer_state.py ~88-92): one full-attention group (an MLA one on an MLA model); on a hybrid model
        # a full and a sliding-window group on the HMA path, the sliding-window group alone off it (every layer
        # sliding-window)
        groups = (["mla"] if case == "mla" else ["full"]) if not self.hybrid else (
            ["full", "sliding"] if path == "hma" else ["sliding"])
        self.layout = stubs.kv_cache_config(groups, layers, num_blocks=_NUM_BLOCKS)
        self.layer_names = [name for group in self.layout.kv_cache_groups for name in group.layer_names]
        self.workers: dict[int, Any] = {}
        self.processes: dict[int | str, dict[str, types.ModuleType]] = {}  # each process's copy of the modules
        try:  # vLLM builds one instance per role and rank (factory.py); a class that cannot be built is not run
            window = stubs.BLOCK_SIZE if self.hybrid else None
            hidden = len(self.layer_names)  # one hidden layer per attention layer of the layout
            self.sched = self._call("scheduler", "__init__", lambda: cls(
                stubs.vllm_config(0, world, window, hidden), stubs.KVConnectorRole.SCHEDULER, self.layout))
            # vLLM binds its KV-cache manager (and so the GPU block pool) once both are built (scheduler.py
            # ~358-360); a class that pins blocks there keeps them from being handed out (block_pool.py)
            manager = stubs.kv_cache_manager(_NUM_BLOCKS, self._held_ids)
            self.block_pool = manager.block_pool
            if self._overrides("bind_kv_cache_manager") or self._overrides("bind_gpu_block_pool"):
                self._call("scheduler", "bind_kv_cache_manager", lambda: self.sched.bind_kv_cache_manager(manager))
            else:
                self.sched.bind_kv_cache_manager(manager)  # the base's: it keeps the manager, nothing else
            for rank in self.ranks:
                # With two ranks each worker is a process of its own (vLLM's multiprocessing executor), apart
                # from the engine core's scheduler: its module state (class attributes, module globals) is its
                # own, so each rank's class comes from a fresh import (``reimport``)
                if world > 1 and reimport is not None:
                    self.processes.setdefault("scheduler", _modules_from(reimport.paths))
                    own = reimport()
                    self.processes[rank] = _modules_from(reimport.paths)
                else:
                    own = cls
                self.workers[rank] = self._call("worker", "__init__", lambda rank=rank, own=own: own(
                    stubs.vllm_config(rank, world, window, hidden), stubs.KVConnectorRole.WORKER, self.layout), rank=rank)
            # vLLM's executor builds its KVOutputAggregator from the scheduler-side connector
            # (executor/abstract.py ~331-335, kv_connector/utils.py ~76-77): `get_finished_count() or world_size`
            count = self._call("scheduler", "get_finished_count", self.sched.get_finished_count) \
                if self._overrides("get_finished_count") else None
        except _Stop as stop:
            stop.outcome.status = "not_runnable"
            raise
        if count is not None and not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
            raise _Stop(ReplayOutcome("not_runnable", f"get_finished_count returned {count!r}, not a count"))
        # MultiConnector.get_finished_count (multi_connector.py ~395-400) is None when a child's is, and the
        # sibling's is the base's None: the aggregator waits world_size reports there
        self.finished_count = world if path == "multi" else (count or world)

    # -- plumbing ------------------------------------------------------------------------------------------
    def _call(self, role: str, method: str, thunk: Any, shown: str = "", rank: int = 0) -> Any:
        if len(self.ranks) > 1 and role == "worker":
            role = f"worker {rank}"
        self.store.current_caller = role
        self.store.current_rank = rank
        self.stubs.TENSOR_PARALLEL.update(rank=rank, world_size=len(self.ranks))
        self.calls.append(f"step {self.step}: {role}.{method}({shown})")
        try:
            result = thunk()
        except (StubMissing, StoreCallUnmodelled) as error:
            raise _Stop(ReplayOutcome("not_runnable", f"{role}.{method}: {error}", step=self.step)) from None
        except _Stop:
            raise
        except Exception as error:  # the class itself raised: a crash is not the hazard the trace shows
            where = traceback.extract_tb(error.__traceback__)[-1]
            raise _Stop(ReplayOutcome(
                "diverged", f"{role}.{method} raised {type(error).__name__}: {error} "
                f"({Path(where.filename).name}:{where.lineno})", step=self.step)) from None
        if self.block_pool is not None and self.block_pool.log:
            self.calls[-1] += "".join(f" [block pool: {entry}]" for entry in self.block_pool.log)
            self.block_pool.log.clear()
        return result

    def _overrides(self, method: str) -> bool:
        base = self.stubs.KVConnectorBase_V1
        return getattr(self.cls, method, None) is not getattr(base, method, None)

    def _ids(self, req: str) -> tuple[list[int], ...]:
        """The request's block ids per KV-cache group, as vLLM gives them to the class. Off the HMA path a
        sliding-window model is one whose every layer is sliding-window: its one group is the model's
        sliding-window group (out-of-window positions are the null block), the full group a modelling aid."""
        fa, sw = list(self.fa.get(req, [])), list(self.sw.get(req, []))
        if not self.hybrid:
            return (fa,)
        return (fa, sw) if self.path == "hma" else (sw,)

    def scheduler_asks(self, method: str) -> bool:
        """A scheduler-side yes/no vLLM asks each step, where the class answers it (the base says False):
        ``has_pending_block_frees`` (scheduler.py ~787-791: short of blocks, vLLM stops scheduling running requests
        instead of preempting one) and ``has_pending_push_work`` (~2833: the engine keeps stepping)."""
        if not self._overrides(method):
            return False
        return bool(self._call("scheduler", method, getattr(self.sched, method)))

    def _held_ids(self, req: str) -> tuple[list[int], ...]:
        """KVCacheManager.get_block_ids: a running request's blocks, a delayed one's until vLLM frees them, else
        an empty list per group (single_type_kv_cache_manager.py: ``req_to_blocks`` is emptied by the free)."""
        if req in self.fa or req not in self.delayed:
            return self._ids(req)
        return tuple(list(ids) for ids in self.delayed_ids.get(req, self._ids(req)))

    def _request(self, req: str) -> Any:
        tokens = list(range(16 * max(1, len(self.fa.get(req, [])))))
        return self.stubs.Request(request_id=req, prompt_token_ids=tokens)

    def _diverged(self, detail: str) -> _Stop:
        return _Stop(ReplayOutcome("diverged", detail, step=self.step))

    # -- phases --------------------------------------------------------------------------------------------
    def schedule(self, phase: Mapping[str, Any]) -> None:
        for req in phase.get("preempted", ()):
            self.fa.pop(req, None)
            self.sw.pop(req, None)
            self.resumed.add(req)
        self.null_out([_block(freed) for freed in phase.get("sw_freed", ())])
        record = next((c for c in phase.get("calls", ()) if c.get("name") == "build_connector_meta"), {})
        new: list[Any] = []
        cached: list[str] = []
        for alloc in sorted(phase.get("allocated", ()), key=lambda a: (str(a["req"]), a["idx"])):
            if alloc.get("hit"):
                raise _Stop(ReplayOutcome("not_runnable", "the trace loads a store hit: the replay drives no loads",
                                          step=self.step))
            req = str(alloc["req"])
            for held in (alloc["block"], alloc.get("sw")):
                if held is not None and self.block_pool is not None and self.block_pool.pinned(_block(held)):
                    raise self._diverged(f"the schedule allocates {held} to {req}, which the class holds a reference "
                                         "on (BlockPool.touch): vLLM does not hand such a block out")
            fresh = req not in self.fa
            self.fa.setdefault(req, []).append(_block(alloc["block"]))
            if self.hybrid and alloc.get("sw") is not None:
                self.sw.setdefault(req, []).append(_block(alloc["sw"]))
            if fresh and req not in self.seen:
                self.seen.add(req)
                self._matched(req)
                new.append(req)
            elif req in cached or req in new:
                continue
            else:
                cached.append(req)
        for req in new + [r for r in cached if r in self.resumed]:
            ids = self._ids(req)
            self._call("scheduler", "update_state_after_alloc",
                       lambda req=req, ids=ids: self.sched.update_state_after_alloc(self._request(req), _BlocksView(ids), 0),
                       req)
        output = self.stubs.SchedulerOutput(
            scheduled_new_reqs=[self.stubs.NewRequestData(req_id=r, prompt_token_ids=self._request(r).prompt_token_ids,
                                                          block_ids=self._ids(r), num_computed_tokens=0) for r in new],
            scheduled_cached_reqs=self.stubs.CachedRequestData(
                req_ids=cached, resumed_req_ids={r for r in cached if r in self.resumed},
                new_token_ids=[[] for _ in cached], all_token_ids={r: self._request(r).prompt_token_ids for r in cached},
                new_block_ids=[self._ids(r) if r in self.resumed else tuple(t[-1:] for t in self._ids(r)) for r in cached],
                num_computed_tokens=[16 * (len(self.fa[r]) - 1) for r in cached], num_output_tokens=[0 for _ in cached]),
            num_scheduled_tokens={r: 16 for r in new + cached},
            total_num_scheduled_tokens=16 * len(new + cached),
            finished_req_ids=set(record.get("finished_req_ids", ())),
            preempted_req_ids=set(record.get("preempted_req_ids", ())) or set(phase.get("preempted", ())),
            kv_connector_block_state=self.stubs.KVConnectorBlockState(
                req_ids=set(new + cached), resolve_block_ids=self._ids),
        )
        self.resumed -= set(cached)
        # vLLM 0.32 hands a finished id to the connector once (Scheduler.schedule moves finished_req_ids into the
        # output and clears it); a schedule repeating one, with no new request of that id between, is not a run
        # vLLM makes, and a class reporting what it is handed would report it twice. The model never does; sampled
        # behaviours did through Idle's stutter copies, which search.py now drops; this stays as the boundary check
        repeated = sorted(output.finished_req_ids & self.handed_finished)
        if repeated:
            raise self._diverged(f"the schedule hands {repeated} to build_connector_meta as finished a second time, "
                                 "which vLLM never does")
        self.handed_finished = (self.handed_finished - set(new)) | output.finished_req_ids
        self.meta = self._call("scheduler", "build_connector_meta", lambda: self.sched.build_connector_meta(output),
                               f"new={new}, cached={cached}, finished={sorted(output.finished_req_ids)}")
        output.kv_connector_metadata = self.meta

    def null_out(self, blocks: Sequence[int]) -> None:
        """Sliding-window blocks freed out of the window: the null block at their places in the tables."""
        for block in blocks:
            for table in self.sw.values():
                table[:] = [NULL_BLOCK if b == block else b for b in table]

    def _matched(self, req: str) -> None:
        if not self._overrides("get_num_new_matched_tokens"):
            return
        found = self._call("scheduler", "get_num_new_matched_tokens",
                           lambda: self.sched.get_num_new_matched_tokens(self._request(req), 0), req)
        if isinstance(found, tuple) and found and found[0]:
            raise _Stop(ReplayOutcome("not_runnable", f"the class reports {found[0]} tokens to load for {req}: "
                                      "the replay drives no loads", step=self.step))

    def execute_model(self, phase: Mapping[str, Any]) -> None:
        ranks = {int(rank): records for rank, records in phase.get("ranks", {}).items()}
        if sorted(ranks) != self.ranks:
            raise _Stop(ReplayOutcome("not_runnable", f"ranks {sorted(ranks)} in the trace: the replay drives "
                                      f"{self.ranks}", step=self.step))
        if self.meta is None:
            raise self._diverged("a forward before any schedule")
        self.step_emitted = set()
        self.worker_meta = self.worker_stats = self.worker_events = None
        delayed_before = set(self.delayed)
        for rank in self.ranks:
            self._execute_rank(rank, ranks[rank], delayed_before)
        self.delayed -= self.step_emitted

    def _metadata_for(self, rank: int) -> Any:
        """The step's metadata as ``rank``'s worker gets it: the scheduler's object with one worker in the
        process; with a process per rank, a copy sent through pickle (vLLM serialises the scheduler output to
        its workers), unpickled into the rank's own classes."""
        if rank not in self.processes:
            return self.meta
        try:
            with _as_process(self.processes["scheduler"]):
                sent = pickle.dumps(self.meta)
            with _as_process(self.processes[rank]):
                return pickle.loads(sent)
        except Exception as error:
            raise _Stop(ReplayOutcome("not_runnable", f"the metadata does not pickle ({type(error).__name__}: "
                                      f"{error}); vLLM sends it to each rank's process", step=self.step)) from None

    def _execute_rank(self, rank: int, records: Sequence[Mapping[str, Any]], delayed_before: set[str]) -> None:
        worker = self.workers[rank]
        meta = self._metadata_for(rank)
        bound = started = False

        def call(method: str, thunk: Any, shown: str = "") -> Any:
            return self._call("worker", method, thunk, shown, rank=rank)

        def start_loads() -> None:
            # The replay drives no loads, so no step has sync KV loads and vLLM 0.32 calls start_load_kv after
            # the forward, before wait_for_save (kv_connector_model_runner_mixin.py ~79-91: `start_after_forward
            # = not scheduler_output.has_sync_kv_loads`): a wait there comes after the forward's writes.
            nonlocal started
            if bound and not started:
                started = True
                call("start_load_kv", lambda: worker.start_load_kv(None))

        for record in records:
            name = record.get("name")
            if name == "handle_preemptions":
                call("handle_preemptions", lambda: worker.handle_preemptions(meta))
            elif name in ("start_load_kv", "forward", "save_kv_layer", "wait_for_save", "get_finished") and not bound:
                call("bind_connector_metadata", lambda: worker.bind_connector_metadata(meta))
                bound = True
            if name in ("wait_for_save", "get_finished"):
                start_loads()
            if name == "forward":
                # Off the HMA path a sliding-window model's one group is the model's sliding-window group (_ids): the
                # model's full-attention blocks are a modelling aid no real layer writes, and the class never sees
                # them handed out (ReuseFencedOffloader, twelfth blind round: a flush of the jobs on newly allocated
                # blocks was "overwritten" through a full-attention block it could not see)
                full = () if self.hybrid and self.path != "hma" else record.get("writes", ())
                for write in (*full, *record.get("sw_writes", ())):
                    self._write(_block(write[0]), str(write[1]), rank)
                if self._overrides("save_kv_layer") and not any(r.get("name") == "save_kv_layer" for r in records):
                    for layer_name in self.layer_names:  # the forward saves every attention layer in order
                        call("save_kv_layer", lambda n=layer_name: worker.save_kv_layer(n, None, None), layer_name)
            elif name == "save_kv_layer":
                layer_name = f"layer.{max(0, int(record.get('layer', 1)) - 1)}"  # the model counts layers from 1
                call("save_kv_layer", lambda n=layer_name: worker.save_kv_layer(n, None, None), layer_name)
            elif name == "wait_for_save":
                call("wait_for_save", lambda: worker.wait_for_save())
            elif name == "get_finished":
                self._get_finished(record, rank, delayed_before)
        start_loads()
        if bound:
            call("clear_connector_metadata", lambda: worker.clear_connector_metadata())

    def _write(self, block: int, req: str, rank: int = 0) -> None:
        readers = self.store.running_readers(block, rank)
        if readers:
            where = f" of rank {rank}" if len(self.ranks) > 1 else ""
            raise _Stop(ReplayOutcome(
                "reproduced",
                f"the forward writes block {block}{where} (for {req}) while store task {readers[0].ordinal} "
                f"(submitted by the {readers[0].submitter}, reading blocks {sorted(readers[0].blocks)}) still reads it",
                hazard="NoOverwriteWhileDumpingInv", step=self.step))

    def _get_finished(self, record: Mapping[str, Any], rank: int, delayed_before: set[str]) -> None:
        finished = set(record.get("finished_req_ids", ()))
        worker = self.workers[rank]
        # vLLM's runners call get_transfer_results (kv_connector_model_runner_mixin.py:94); the base's wraps
        # get_finished, a class may override it
        answer = self._call("worker", "get_finished",
                            lambda: worker.get_transfer_results(set(finished)), sorted(finished), rank=rank)
        if not isinstance(getattr(answer, "finished_sending", None), (set, frozenset, list, tuple, type(None))):
            raise self._diverged(f"get_transfer_results returned {answer!r}, not the transfer results")
        sending = set(answer.finished_sending or ())
        self.calls[-1] += f" -> sent {sorted(sending)}" if sending else ""
        self._worker_outputs(rank)
        if self.sibling_plays:
            sending = self._multi_sending(sending, set(record.get("sibling_sending", ())))
        # KVOutputAggregator.aggregate (kv_connector/utils.py ~87-99): a request passes to the scheduler once
        # `finished_count` reports of it arrived; the scheduler asserts it holds the request and frees its blocks
        # (scheduler.py ~3232-3235): a request the class never delayed (or that vLLM freed already) is a hazard
        emitted = set()
        for req in sorted(sending):
            self.remaining[req] = self.remaining.get(req, self.finished_count) - 1
            if self.remaining[req] == 0:
                emitted.add(req)
                del self.remaining[req]
        self.step_emitted |= emitted
        unexpected = sorted(emitted - delayed_before)
        if unexpected:
            who = f"rank {rank}'s " if len(self.ranks) > 1 else ""
            raise _Stop(ReplayOutcome(
                "reproduced", f"{who}get_finished reports {unexpected} as sent, which request_finished never delayed "
                "(vLLM asserts on it)", hazard="NoUnexpectedReportInv", step=self.step))
        expected = set(record.get("ucm_sending", record.get("finished_sending", ())))
        if not self.follow and sending != expected:
            raise self._diverged(f"get_finished reported {sorted(sending)} as sent; the counterexample needs "
                                 f"{sorted(expected)}")

    def _worker_outputs(self, rank: int) -> None:
        """What vLLM asks the rank's worker after its transfer results, in order (kv_connector_model_runner_mixin.py
        ~100-104): ``get_block_ids_with_load_errors``, ``get_kv_connector_stats``, ``get_kv_connector_kv_cache_events``
        and ``build_connector_worker_meta``, each only where the class overrides the base's (which answer nothing
        and touch nothing). A class may poll, wait or drop store tasks in any of them. The answers reach the engine
        core (pickled, with a process per rank) and are aggregated over the ranks as KVOutputAggregator does
        (kv_connector/utils.py ~130-170): the first rank's stats and metadata accumulate the others' through
        ``aggregate``, the first rank's events take the others' through ``add_events`` / ``increment_workers``."""
        worker = self.workers[rank]
        if self._overrides("get_block_ids_with_load_errors"):
            invalid = self._call("worker", "get_block_ids_with_load_errors", worker.get_block_ids_with_load_errors,
                                 rank=rank)
            if invalid:
                # vLLM would reschedule the requests holding them (scheduler.py ~2062); the replay drives no loads
                raise self._diverged(f"get_block_ids_with_load_errors answered {sorted(invalid)}; the replay drives "
                                     "no loads")
        if self._overrides("get_kv_connector_stats"):
            stats = self._to_engine_core(rank, self._call("worker", "get_kv_connector_stats",
                                                          worker.get_kv_connector_stats, rank=rank), "stats")
            self.worker_stats = self._accumulated(self.worker_stats, stats, "stats", rank)
        if self._overrides("get_kv_connector_kv_cache_events"):
            events = self._to_engine_core(rank, self._call("worker", "get_kv_connector_kv_cache_events",
                                                           worker.get_kv_connector_kv_cache_events, rank=rank),
                                          "KV cache events")
            if self.worker_events is None:
                self.worker_events = events
            elif events:
                combined = self.worker_events

                def merge() -> None:
                    combined.add_events(events.get_all_events())
                    combined.increment_workers(1)
                self._call("scheduler", "add_events", merge, "KV cache events", rank=rank)
        if self._overrides("build_connector_worker_meta"):
            own = self._to_engine_core(rank, self._call("worker", "build_connector_worker_meta",
                                                        worker.build_connector_worker_meta, rank=rank),
                                       "worker metadata")
            self.worker_meta = self._accumulated(self.worker_meta, own, "worker metadata", rank)

    def _accumulated(self, held: Any, new: Any, what: str, rank: int) -> Any:
        """KVOutputAggregator's rule for the ranks' stats and worker metadata (kv_connector/utils.py ~130-152): the
        first object (None or not) is the accumulator, a later non-empty one is folded in through ``aggregate``."""
        if held is None:
            return new
        if not new:
            return held
        return self._call("scheduler", "aggregate", lambda: held.aggregate(new), what, rank=rank)

    def _to_engine_core(self, rank: int, value: Any, what: str) -> Any:
        """A worker's answer as the engine core gets it: with a process per rank, a pickled copy in the
        scheduler process's classes (vLLM sends the model runner's output there)."""
        if rank not in self.processes:
            return value
        try:
            with _as_process(self.processes[rank]):
                sent = pickle.dumps(value)
            with _as_process(self.processes["scheduler"]):
                return pickle.loads(sent)
        except Exception as error:
            raise _Stop(ReplayOutcome("not_runnable", f"the worker's {what} do not pickle ({type(error).__name__}: "
                                      f"{error}); vLLM sends them to the engine core", step=self.step)) from None

    def _multi_sending(self, own: set[str], sibling: set[str]) -> set[str]:
        """MultiConnector.get_transfer_results (multi_connector.py ~357-376) over the class's reports and the
        sibling's: a report passes on unless an extra async save of the id is pending, which it consumes."""
        self.sibling_owed -= sibling
        if sibling:
            self.calls.append(f"step {self.step}: sibling.get_finished -> sent {sorted(sibling)}")
        passed = set()
        for req in [*sorted(own), *sorted(sibling)]:
            extra = self.multi_extra.get(req)
            if extra is None:
                passed.add(req)
            elif extra == 1:
                del self.multi_extra[req]
            else:
                self.multi_extra[req] = extra - 1
        return passed

    def update_from_output(self, phase: Mapping[str, Any]) -> None:
        for record in phase.get("calls", ()):
            if record.get("name") == "request_finished":  # requests that ended by themselves this step
                self._request_finished(record, self.stubs.RequestStatus.FINISHED_STOPPED)
            elif record.get("name") == "_update_from_kv_xfer_finished":
                sent = set(record.get("finished_sending", ()))
                if not self.follow and self.path != "multi" and sent != self.step_emitted:
                    # the class's reports freed other requests than the trace's (its get_finished_count differs
                    # from the model's count of ranks): the trace's later allocations are not this run's
                    raise self._diverged(f"vLLM frees {sorted(self.step_emitted)} on the class's reports; the "
                                         f"counterexample frees {sorted(sent)}")
                if self._overrides("update_connector_output"):
                    # vLLM hands the step's aggregated output to the scheduler-side connector first (scheduler.py
                    # ~3209-3219, _update_from_kv_xfer_finished)
                    sent = self.step_emitted if self.follow else sent
                    output = self.stubs.KVConnectorOutput(
                        finished_sending=set(sent) or None, finished_recving=None,
                        kv_connector_stats=self.worker_stats, kv_cache_events=self.worker_events,
                        kv_connector_worker_meta=self.worker_meta or None)
                    self._call("scheduler", "update_connector_output",
                               lambda: self.sched.update_connector_output(output), f"finished_sending={sorted(sent)}")
                    self._frees_after_update(output, set(sent))
                self._scheduler_outputs()

    def _scheduler_outputs(self) -> None:
        """What vLLM asks the scheduler-side instance after the frees, each step (scheduler.py ~2340-2380): its
        own ``get_kv_connector_stats`` (aggregated into the workers' when not ``is_empty()``), then ``take_events``.
        Only where the class overrides them; a class may poll or drop store tasks there too."""
        if self._overrides("get_kv_connector_stats"):
            stats = self._call("scheduler", "get_kv_connector_stats", self.sched.get_kv_connector_stats)
            if stats is not None and not self._call("scheduler", "is_empty", stats.is_empty, "stats"):
                if self.worker_stats is not None:
                    workers = self.worker_stats
                    self._call("scheduler", "aggregate", lambda: workers.aggregate(stats), "stats")
        if self._overrides("take_events"):
            events = self._call("scheduler", "take_events", self.sched.take_events)
            if events:
                self._call("scheduler", "take_events", lambda: list(events), "consumed")

    def _frees_after_update(self, output: Any, sent: set[str]) -> None:
        """vLLM frees the ids ``finished_sending`` holds *after* the scheduler-side ``update_connector_output``
        (scheduler.py ~3218-3235): a class that takes ids out (holding a request until its workers' metadata
        says every job ended) or puts ids in changes what is freed. An id freed that is not delayed (never, or
        freed already) is the scheduler's assertion."""
        try:
            freed = set(output.finished_sending or ())
        except TypeError:
            raise self._diverged(f"update_connector_output left finished_sending {output.finished_sending!r}, "
                                 "not a set of ids") from None
        if freed == sent:
            return
        self.calls[-1] += f" -> vLLM frees {sorted(freed)}"
        if not self.follow:
            raise self._diverged(f"update_connector_output changed the ids vLLM frees to {sorted(freed)}; the "
                                 f"counterexample frees {sorted(sent)}")
        held = self.delayed | (sent & self.step_emitted)  # execute_model already dropped the reported ids
        unexpected = sorted(freed - held)
        if unexpected:
            raise _Stop(ReplayOutcome(
                "reproduced", f"update_connector_output passes {unexpected} to vLLM as sent, which request_finished "
                "never delayed (vLLM asserts on it)", hazard="NoUnexpectedReportInv", step=self.step))
        self.delayed = held - freed
        self.step_emitted = freed

    def _request_finished(self, record: Mapping[str, Any], status: Any) -> None:
        expected_delayed = set(record.get("ucm_delayed", record.get("delayed", ())))
        for req in sorted(record.get("reqs", ())):
            ids = self._ids(req)
            request = self._request(req)
            request.status = status
            aborted = ", aborted" if status == self.stubs.RequestStatus.FINISHED_ABORTED else ""
            if self.path == "hma":
                answer = self._call("scheduler", "request_finished_all_groups",
                                    lambda: self.sched.request_finished_all_groups(request, ids), f"{req}, {ids}{aborted}")
            else:
                answer = self._call("scheduler", "request_finished",
                                    lambda: self.sched.request_finished(request, ids[0]), f"{req}, {ids[0]}{aborted}")
            if not (isinstance(answer, tuple) and len(answer) == 2):
                raise self._diverged(f"request_finished returned {answer!r}, not (delay, params)")
            self.calls[-1] += " -> delay" if answer[0] else " -> free now"
            if not self.follow and bool(answer[0]) != (req in expected_delayed):
                raise self._diverged(f"request_finished({req}) answered {bool(answer[0])}; the counterexample needs "
                                     f"{req in expected_delayed}")
            if answer[0] or self.sibling_plays:
                self.delayed.add(req)
                self.delayed_ids[req] = ids
            if self.sibling_plays:
                # MultiConnector._aggregate_request_finished (multi_connector.py ~549-567): the sibling's True and
                # the class's make two async saves, one extra; vLLM sends it to the workers with the next
                # metadata, bound before any get_finished that could report the id
                self.sibling_owed.add(req)
                if answer[0]:
                    self.multi_extra[req] = 1
            self.fa.pop(req, None)
            self.sw.pop(req, None)

    def task_complete(self, action: Mapping[str, Any]) -> None:
        tasks = action.get("tasks")
        ranked = ([(int(rank), i) for rank, group in tasks.items() for i in group] if isinstance(tasks, Mapping)
                  else [(int(action.get("rank", 0) or 0), action.get("task"))])
        for rank, task in ranked:
            if isinstance(task, int):
                self.store.complete(task, rank)

    def run(self, trace: Sequence[Mapping[str, Any]]) -> ReplayOutcome:
        for index, entry in enumerate(trace):
            self.step = index
            action = plain(entry.get("state", {}).get("action") or entry.get("action") or {})
            name = action.get("name")
            if name in (None, "init"):
                continue
            if name == "engine_step":
                for phase in action.get("phases", ()):
                    self._phase(phase)
            elif name in ("schedule", "execute_model", "update_from_output"):
                self._phase(action)
            elif name == "task_complete":
                self.task_complete(action)
            elif name == "finish_requests":
                for record in action.get("calls", ()):
                    if record.get("name") == "request_finished":  # an abort (Scheduler.finish_requests)
                        self._request_finished(record, self.stubs.RequestStatus.FINISHED_ABORTED)
                self.fa.pop(str(action.get("req")), None)
                self.sw.pop(str(action.get("req")), None)
            elif name == "shutdown":
                for rank in self.ranks:
                    self._call("worker", "shutdown", lambda rank=rank: self.workers[rank].shutdown(), rank=rank)
            else:
                raise _Stop(ReplayOutcome("not_runnable", f"the trace's step {name!r} is not replayed", step=index))
        return ReplayOutcome("diverged", "the class followed the whole counterexample without the hazard: its "
                             "store tasks had ended (or were waited) before their blocks were rewritten",
                             step=len(trace) - 1)

    def _phase(self, phase: Mapping[str, Any]) -> None:
        getattr(self, str(phase.get("name")))(phase)


def _layers(trace: Sequence[Mapping[str, Any]]) -> int:
    """Attention layers per KV-cache group: the most a trace's ``save_kv_layer`` records name (1 if none)."""
    found = 1
    for entry in trace:
        action = plain(entry.get("state", {}).get("action") or entry.get("action") or {})
        phases = action.get("phases", ()) if action.get("name") == "engine_step" else (action,)
        for phase in phases:
            if phase.get("name") != "execute_model" or not isinstance(phase.get("ranks"), Mapping):
                continue
            for records in phase["ranks"].values():
                for record in records:
                    if record.get("name") == "save_kv_layer":
                        found = max(found, int(record.get("layer", 1)))
    return found


def run_class(paths: Sequence[str], cls_name: str, path: str, case: str, store_modules: Sequence[str],
              drive: Callable[[_Replay], ReplayOutcome], *, layers: int = 1, follow: bool = False) -> ReplayOutcome:
    """Import the class under stub vLLM (and the named store modules) afresh, build its engine (:class:`_Replay`)
    and let ``drive`` run it; the outcome carries the calls the class was made."""
    store = RecordingStore()
    replay: _Replay | None = None
    with stub_modules(store_modules, store):
        from deferdump.tools.mro.run import stubs

        try:
            try:
                cls = import_class(paths, cls_name)
            except _Stop:
                raise
            except (StubMissing, StoreCallUnmodelled) as error:
                raise _Stop(ReplayOutcome("not_runnable", f"importing {cls_name}: {error}")) from None
            except Exception as error:
                raise _Stop(ReplayOutcome("not_runnable", f"importing {cls_name}: {type(error).__name__}: "
                                          f"{error}")) from None
            replay = _Replay(cls, path, case, store, stubs, layers=layers, follow=follow,
                             reimport=Reimport(paths, cls_name))
            outcome = drive(replay)
        except _Stop as stop:
            outcome = stop.outcome
        finally:
            forget_modules(paths)
        if replay is not None:
            outcome.calls = replay.calls
        return outcome


def replay_counterexample(paths: Sequence[str], cls_name: str, path: str, case: str,
                          trace: Sequence[Mapping[str, Any]], store_modules: Sequence[str]) -> ReplayOutcome:
    """Import the class under stub vLLM (and the named store modules) and replay ``trace`` against it."""
    return run_class(paths, cls_name, path, case, store_modules, lambda replay: replay.run(trace),
                     layers=_layers(trace))
