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
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deferdump.reference.errors import DeferDumpError
from deferdump.tools.mro.run.store import NULL_BLOCK, RecordingStore, StoreCallUnmodelled
from deferdump.tools.mro.run.stubs import StubMissing, stub_modules

__all__ = ["ReplayOutcome", "replay_counterexample"]

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


def _block(name: object) -> int:
    text = str(name)
    if not text.startswith("b") or not text[1:].isdigit():
        raise _Stop(ReplayOutcome("not_runnable", f"a block named {text!r} in the trace"))
    return int(text[1:])


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


def forget_modules(paths: Sequence[str]) -> None:
    """Drop the modules :func:`import_class` imported (and anything imported from their folders)."""
    folders = {str(Path(raw).resolve().parent) for raw in paths}
    for module_name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and str(Path(origin).parent) in folders:
            del sys.modules[module_name]


class _Replay:
    def __init__(self, cls: type, path: str, case: str, store: RecordingStore, stubs: Any, layers: int = 1) -> None:
        self.cls = cls
        self.path = path  # "hma", "non_hma" or "multi"
        self.hybrid = case == "hybrid"
        self.store = store
        self.stubs = stubs
        self.calls: list[str] = []
        self.fa: dict[str, list[int]] = {}
        self.sw: dict[str, list[int]] = {}
        self.seen: set[str] = set()
        self.resumed: set[str] = set()
        self.delayed: set[str] = set()  # requests the class delayed and has not reported yet
        self.handed_finished: set[str] = set()  # ids build_connector_meta was told finished, since last scheduled new
        self.meta: Any = None
        self.step = 0
        config = stubs.VllmConfig()
        # The case's KV-cache layout, given to both roles as vLLM 0.32 does (scheduler.py ~176-180,
        # kv_transfer_state.py ~88-92): one full-attention group; on a hybrid model a full and a sliding-window
        # group on the HMA path, the sliding-window group alone off it (every layer sliding-window)
        groups = ["full"] if not self.hybrid else (["full", "sliding"] if path == "hma" else ["sliding"])
        self.layout = stubs.kv_cache_config(groups, layers, num_blocks=_NUM_BLOCKS)
        self.layer_names = [name for group in self.layout.kv_cache_groups for name in group.layer_names]
        try:  # vLLM builds one instance per role (factory.py); a class that cannot be built is not run
            self.sched = self._call("scheduler", "__init__",
                                    lambda: cls(config, stubs.KVConnectorRole.SCHEDULER, self.layout))
            self.worker = self._call("worker", "__init__", lambda: cls(config, stubs.KVConnectorRole.WORKER, self.layout))
        except _Stop as stop:
            stop.outcome.status = "not_runnable"
            raise

    # -- plumbing ------------------------------------------------------------------------------------------
    def _call(self, role: str, method: str, thunk: Any, shown: str = "") -> Any:
        self.store.current_caller = role
        self.calls.append(f"step {self.step}: {role}.{method}({shown})")
        try:
            return thunk()
        except (StubMissing, StoreCallUnmodelled) as error:
            raise _Stop(ReplayOutcome("not_runnable", f"{role}.{method}: {error}", step=self.step)) from None
        except _Stop:
            raise
        except Exception as error:  # the class itself raised: a crash is not the hazard the trace shows
            where = traceback.extract_tb(error.__traceback__)[-1]
            raise _Stop(ReplayOutcome(
                "diverged", f"{role}.{method} raised {type(error).__name__}: {error} "
                f"({Path(where.filename).name}:{where.lineno})", step=self.step)) from None

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
        for freed in phase.get("sw_freed", ()):
            block = _block(freed)
            for table in self.sw.values():
                table[:] = [NULL_BLOCK if b == block else b for b in table]
        record = next((c for c in phase.get("calls", ()) if c.get("name") == "build_connector_meta"), {})
        new: list[Any] = []
        cached: list[str] = []
        for alloc in sorted(phase.get("allocated", ()), key=lambda a: (str(a["req"]), a["idx"])):
            if alloc.get("hit"):
                raise _Stop(ReplayOutcome("not_runnable", "the trace loads a store hit: the replay drives no loads",
                                          step=self.step))
            req = str(alloc["req"])
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
                new_block_ids=[self._ids(r) if r in self.resumed else tuple([t[-1:]] for t in self._ids(r)) for r in cached],
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

    def _matched(self, req: str) -> None:
        if not self._overrides("get_num_new_matched_tokens"):
            return
        found = self._call("scheduler", "get_num_new_matched_tokens",
                           lambda: self.sched.get_num_new_matched_tokens(self._request(req), 0), req)
        if isinstance(found, tuple) and found and found[0]:
            raise _Stop(ReplayOutcome("not_runnable", f"the class reports {found[0]} tokens to load for {req}: "
                                      "the replay drives no loads", step=self.step))

    def execute_model(self, phase: Mapping[str, Any]) -> None:
        ranks = phase.get("ranks", {})
        if len(ranks) != 1:
            raise _Stop(ReplayOutcome("not_runnable", f"{len(ranks)} ranks: the replay drives one worker",
                                      step=self.step))
        if self.meta is None:
            raise self._diverged("a forward before any schedule")
        bound = started = False

        def start_loads() -> None:
            # The replay drives no loads, so no step has sync KV loads and vLLM 0.32 calls start_load_kv after
            # the forward, before wait_for_save (kv_connector_model_runner_mixin.py ~79-91: `start_after_forward
            # = not scheduler_output.has_sync_kv_loads`): a wait there comes after the forward's writes.
            nonlocal started
            if bound and not started:
                started = True
                self._call("worker", "start_load_kv", lambda: self.worker.start_load_kv(None))

        for record in next(iter(ranks.values())):
            name = record.get("name")
            if name == "handle_preemptions":
                self._call("worker", "handle_preemptions", lambda: self.worker.handle_preemptions(self.meta))
            elif name in ("start_load_kv", "forward", "save_kv_layer", "wait_for_save", "get_finished") and not bound:
                self._call("worker", "bind_connector_metadata", lambda: self.worker.bind_connector_metadata(self.meta))
                bound = True
            if name in ("wait_for_save", "get_finished"):
                start_loads()
            if name == "forward":
                for write in (*record.get("writes", ()), *record.get("sw_writes", ())):
                    self._write(_block(write[0]), str(write[1]))
                if self._overrides("save_kv_layer") and not any(
                        r.get("name") == "save_kv_layer" for r in next(iter(ranks.values()))):
                    for layer_name in self.layer_names:  # the forward saves every attention layer in order
                        self._call("worker", "save_kv_layer",
                                   lambda n=layer_name: self.worker.save_kv_layer(n, None, None), layer_name)
            elif name == "save_kv_layer":
                layer_name = f"layer.{max(0, int(record.get('layer', 1)) - 1)}"  # the model counts layers from 1
                self._call("worker", "save_kv_layer",
                           lambda n=layer_name: self.worker.save_kv_layer(n, None, None), layer_name)
            elif name == "wait_for_save":
                self._call("worker", "wait_for_save", lambda: self.worker.wait_for_save())
            elif name == "get_finished":
                self._get_finished(record)
        start_loads()
        if bound:
            self._call("worker", "clear_connector_metadata", lambda: self.worker.clear_connector_metadata())

    def _write(self, block: int, req: str) -> None:
        readers = self.store.running_readers(block)
        if readers:
            raise _Stop(ReplayOutcome(
                "reproduced",
                f"the forward writes block {block} (for {req}) while store task {readers[0].ordinal} (submitted by "
                f"the {readers[0].submitter}, reading blocks {sorted(readers[0].blocks)}) still reads it",
                hazard="NoOverwriteWhileDumpingInv", step=self.step))

    def _get_finished(self, record: Mapping[str, Any]) -> None:
        finished = set(record.get("finished_req_ids", ()))
        # vLLM's runners call get_transfer_results (kv_connector_model_runner_mixin.py:94); the base's wraps
        # get_finished, a class may override it
        answer = self._call("worker", "get_finished",
                            lambda: self.worker.get_transfer_results(set(finished)), sorted(finished))
        if not isinstance(getattr(answer, "finished_sending", None), (set, frozenset, list, tuple, type(None))):
            raise self._diverged(f"get_transfer_results returned {answer!r}, not the transfer results")
        sending = set(answer.finished_sending or ())
        unexpected = sorted(sending - self.delayed)
        if unexpected:
            raise _Stop(ReplayOutcome(
                "reproduced", f"get_finished reports {unexpected} as sent, which request_finished never delayed "
                "(vLLM asserts on it)", hazard="NoUnexpectedReportInv", step=self.step))
        expected = set(record.get("ucm_sending", record.get("finished_sending", ())))
        if sending != expected:
            raise self._diverged(f"get_finished reported {sorted(sending)} as sent; the counterexample needs "
                                 f"{sorted(expected)}")
        self.delayed -= sending

    def update_from_output(self, phase: Mapping[str, Any]) -> None:
        for record in phase.get("calls", ()):
            if record.get("name") == "request_finished":  # requests that ended by themselves this step
                self._request_finished(record, self.stubs.RequestStatus.FINISHED_STOPPED)
            elif record.get("name") == "_update_from_kv_xfer_finished" and self._overrides("update_connector_output"):
                # vLLM hands the step's aggregated output to the scheduler-side connector first (scheduler.py
                # ~3209-3219, _update_from_kv_xfer_finished)
                sent = set(record.get("finished_sending", ()))
                output = self.stubs.KVConnectorOutput(finished_sending=sent or None, finished_recving=None)
                self._call("scheduler", "update_connector_output", lambda: self.sched.update_connector_output(output),
                           f"finished_sending={sorted(sent)}")

    def _request_finished(self, record: Mapping[str, Any], status: Any) -> None:
        expected_delayed = set(record.get("ucm_delayed", record.get("delayed", ())))
        for req in sorted(record.get("reqs", ())):
            ids = self._ids(req)
            request = self._request(req)
            request.status = status
            if self.path == "hma":
                answer = self._call("scheduler", "request_finished_all_groups",
                                    lambda: self.sched.request_finished_all_groups(request, ids), f"{req}, {ids}")
            else:
                answer = self._call("scheduler", "request_finished",
                                    lambda: self.sched.request_finished(request, ids[0]), f"{req}, {ids[0]}")
            if not (isinstance(answer, tuple) and len(answer) == 2):
                raise self._diverged(f"request_finished returned {answer!r}, not (delay, params)")
            if bool(answer[0]) != (req in expected_delayed):
                raise self._diverged(f"request_finished({req}) answered {bool(answer[0])}; the counterexample needs "
                                     f"{req in expected_delayed}")
            if answer[0]:
                self.delayed.add(req)
            self.fa.pop(req, None)
            self.sw.pop(req, None)

    def task_complete(self, action: Mapping[str, Any]) -> None:
        tasks = action.get("tasks")
        ids = [i for group in tasks.values() for i in group] if isinstance(tasks, Mapping) else [action.get("task")]
        for task in ids:
            if isinstance(task, int):
                self.store.complete(task)

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
                self._call("worker", "shutdown", lambda: self.worker.shutdown())
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


def replay_counterexample(paths: Sequence[str], cls_name: str, path: str, case: str,
                          trace: Sequence[Mapping[str, Any]], store_modules: Sequence[str]) -> ReplayOutcome:
    """Import the class under stub vLLM (and the named store modules) and replay ``trace`` against it."""
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
            replay = _Replay(cls, path, case, store, stubs, layers=_layers(trace))
            outcome = replay.run(trace)
        except _Stop as stop:
            outcome = stop.outcome
        finally:
            forget_modules(paths)
        if replay is not None:
            outcome.calls = replay.calls
        return outcome
