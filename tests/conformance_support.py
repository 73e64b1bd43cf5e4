"""The Toy fixture model (tests/fixtures/conformance/Toy.tla) and a tiny implementation of it with a driver.

The generic machinery (state graph, edge cover, ITF files, replay, diffs, shrinking, coverage) is tested
on this model, independently of the DeferDump model that the spec helper is still growing.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from deferdump.conformance.driver import StepMismatch
from deferdump.tools.manifest import Manifest, load_manifest
from deferdump.tools.tlavalue import ItfTrace, Tup, Value

FIXTURES = Path(__file__).parent / "fixtures" / "conformance"


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
