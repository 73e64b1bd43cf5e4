"""The Toy fixture model (tests/fixtures/conformance/Toy.tla) and a tiny implementation of it with a driver.

The generic machinery (state graph, edge cover, ITF files, replay, diffs, shrinking, coverage) is tested
on this model, independently of the DeferDump model that the spec helper is still growing.
"""
from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from support import FIXTURES as ALL_FIXTURES
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from deferdump.conformance.driver import StepMismatch
from deferdump.conformance.itfload import DecodedLoader as PreDecodedLoader, TraceLoader
from deferdump.conformance.tracegen import GeneratedTraces
from deferdump.tools.tlc.parallel import default_jobs
from deferdump.conformance.tracecache import cached_cover, cached_decoded
from deferdump.conformance.verify import conformance_entries
from deferdump.tools.tlc.manifest import Expectation, Manifest, ModelEntry, load_manifest
from deferdump.tools.tlc.specfiles import spec_dir
from deferdump.tools.tlc.values import ItfTrace, Record, Tup, Value

FIXTURES = ALL_FIXTURES / "conformance"


def toy_manifest() -> Manifest:
    return load_manifest(FIXTURES / "manifest.json")


class ToyCounters:
    """The 'implementation': two counters and a reset."""

    def __init__(self) -> None:
        self.slots = [0, 0]

    def inc(self, slot: int) -> None:
        self.slots[slot] += 1

    def reset(self) -> None:
        self.slots = [0, 0]


class ToyDriver:
    observed = ("slots",)
    actions = frozenset({"init", "inc", "reset"})

    def __init__(self) -> None:
        self.impl = ToyCounters()
        self.resets = 0

    def reset(self, initial: Mapping[str, Value]) -> None:
        self.impl = ToyCounters()
        self.resets += 1

    def step(self, before: Mapping[str, Value], after: Mapping[str, Value]) -> None:
        action = after["action"]
        if action["name"] == "inc":
            self.impl.inc(int(action["slot"]) - 1)
        elif action["name"] == "reset":
            self.impl.reset()
        else:
            raise StepMismatch(f"unexpected action {action['name']}")

    def abstract_state(self) -> dict[str, Value]:
        return {"slots": Tup(self.impl.slots)}

    def model_view(self, state: Mapping[str, Value]) -> dict[str, Value]:
        return {"slots": state["slots"]}

    def close(self) -> None:
        pass


class RecordingFactory:
    """Builds ToyDrivers and remembers them (to prove that nothing was replayed)."""

    def __init__(self) -> None:
        self.drivers: list[ToyDriver] = []

    def __call__(self, trace: ItfTrace) -> ToyDriver:
        driver = ToyDriver()
        self.drivers.append(driver)
        return driver

    @property
    def replayed(self) -> int:
        return sum(driver.resets for driver in self.drivers)


# ------------------------------------------------------------------------------------------ DeferDump

DEFERDUMP_FIXTURES = FIXTURES / "deferdump"

class DecodedLoader(PreDecodedLoader):
    """Answers the trace files of the given models from the trace cache's decoded copy
    (deferdump.conformance.tracecache.cached_decoded), and decodes any other file itself."""

    def __init__(self, names: Iterable[str]) -> None:
        super().__init__(trace for name in names for trace in decoded_traces(name))


def counting_json_decodes(monkeypatch: Any) -> list[Path]:
    """Every file decoded from JSON from now on (`TraceLoader.load`; a DecodedLoader calls it only for the
    files it was not given decoded), through ``monkeypatch`` (pytest's fixture)."""
    decoded: list[Path] = []
    original = TraceLoader.load

    def load(self: TraceLoader, path: Path | str) -> ItfTrace:
        decoded.append(Path(path))
        return original(self, path)
    monkeypatch.setattr(TraceLoader, "load", load)
    return decoded


COVER_FIXTURES = ("ConfLayerWise", "ConfMulti")
"""Small DeferDump configs (tests/fixtures/conformance/deferdump) replayed with their full edge cover: what
the shipped conformance models leave out (the HMA path and fused engine steps with two layers,
MultiConnector). MLA and preemption are shipped models (MLAConformance, PreemptConformance); the ConfMLA
fixture stays for the CLI tests' small fixture manifest."""


def conformance_entry(name: str) -> ModelEntry:
    shipped = {e.name: e for e in manifest_conformance_entries()}
    return shipped.get(name) or fixture_entry(name)


def fixture_entry(name: str) -> ModelEntry:
    """A DeferDump model on the shipped spec modules with a fixture cfg (not in the shipped manifest)."""
    config = os.path.relpath(DEFERDUMP_FIXTURES / f"{name}.cfg", spec_dir())
    return ModelEntry(name=name, module="MCReal", config=config, tier="ci", variant="Direct",
                      expect=Expectation(), distinct_states=None, mutant=False, conformance=True,
                      spec_dir=spec_dir(), timeout=300)


def manifest_conformance_entries() -> list[ModelEntry]:
    """The shipped manifest's CI conformance models (passing, not mutants)."""
    return conformance_entries(load_manifest())


def conformance_manifest() -> Manifest:
    """The shipped manifest's models plus the fixture models (for coverage against their graphs)."""
    shipped = load_manifest()
    extra = tuple(fixture_entry(name) for name in COVER_FIXTURES)
    return replace(shipped, models=shipped.models + extra)


def deferdump_traces(name: str) -> tuple[Path, ...]:
    """Trace files of one conformance model (from the on-disk trace cache; generated at most once)."""
    return tuple(generated(name).files)


@functools.lru_cache(maxsize=None)
def _cover(name: str) -> tuple[GeneratedTraces, dict[str, Any]]:
    return cached_cover(conformance_entry(name))


def generated(name: str) -> GeneratedTraces:
    """What generating one conformance model's edge cover produced (deferdump.conformance.tracecache keeps it on disk)."""
    return _cover(name)[0]


def graph_summary(name: str) -> dict[str, Any]:
    """The model's full state graph at generation: ``edges``, ``states``, ``action_labels``."""
    return _cover(name)[1]


def prefetch_covers(names: list[str], jobs: int | None = None) -> None:
    """Fill the trace cache for ``names``, ``jobs`` TLC runs at once (a cold cache's generation is TLC-bound)."""
    with ThreadPoolExecutor(max_workers=jobs or default_jobs()) as pool:
        for _ in pool.map(_cover, names):
            pass


@functools.lru_cache(maxsize=None)
def decoded_traces(name: str) -> tuple[ItfTrace, ...]:
    """One model's traces decoded, in file order (unpickled from the trace cache once they were decoded)."""
    return cached_decoded(conformance_entry(name))


@functools.lru_cache(maxsize=None)
def loaded_traces(name: str) -> tuple[ItfTrace, ...]:
    """One model's traces decoded and validated for the default drivers, once per session (replays build
    fresh drivers, so every test may replay them)."""
    from deferdump.conformance.drivers import default_driver_factory
    from deferdump.conformance.replay import load_traces

    loaded = load_traces(deferdump_traces(name), default_driver_factory, DecodedLoader([name]))
    for _, driver in loaded:
        driver.close()
    return tuple(trace for trace, _ in loaded)


def shipped_loaded_traces() -> list[ItfTrace]:
    """:func:`loaded_traces` of the shipped CI conformance models, in manifest order (what CI replays)."""
    return [trace for entry in manifest_conformance_entries() for trace in loaded_traces(entry.name)]


def conformance_model_names() -> list[str]:
    """The fixtures (small, each showing what the shipped models leave out) first, then the shipped ones."""
    shipped = [e.name for e in manifest_conformance_entries()]
    return [n for n in COVER_FIXTURES if n not in shipped] + shipped


def all_deferdump_traces() -> list[Path]:
    return [path for name in conformance_model_names() for path in deferdump_traces(name)]


def shipped_deferdump_traces() -> list[Path]:
    """The edge-cover traces of the shipped manifest's CI conformance models only (what CI replays)."""
    return [path for entry in manifest_conformance_entries() for path in deferdump_traces(entry.name)]


def steps_of(action: Record) -> Iterator[Record]:
    """The phase records of an action: ``engine_step`` holds three; the others are their own phase."""
    if action["name"] == "engine_step":
        yield from action["phases"]
    else:
        yield action


def rank_calls(phase: Record, name: str) -> Iterator[tuple[int, Record]]:
    """(rank, call record) of every call named ``name`` in an ``execute_model`` phase."""
    if phase["name"] == "execute_model":
        for rank, calls in phase["ranks"].items():
            for call in calls:
                if call["name"] == name:
                    yield rank, call


def first_step(trace: ItfTrace, predicate: Callable[[Record], bool]) -> int | None:
    """Index of the first state whose action has a phase satisfying ``predicate``."""
    for index, state in enumerate(trace.states):
        if index and any(predicate(phase) for phase in steps_of(state["action"])):
            return index
    return None
