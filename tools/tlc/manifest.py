"""The model manifest (``spec/manifest.json``) and checking models against their expectations.

Every model names a module and a config in the spec directory, a tier (``ci`` runs in CI, ``deep`` on
demand, ``sim`` only by ``deferdump check --simulate``: beyond exhaustive reach, no state count), the
connector variant, what TLC must find (``"pass"`` or ``{"violation": "<Property>"}``),
and the distinct-state count it had when it was last reviewed. A changed count fails the check: the
spec's meaning changed, and someone must look before the number is updated. A mutant that reproduces
a bug reported in the field names its thread and its row (``"reproduces": "owner/repo#number"``,
``"row": "P8"``).
"""
from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deferdump.reference.errors import UserError
from deferdump.tools.tlc.specfiles import spec_dir
from deferdump.tools.tlc.values import to_itf
from deferdump.tools.tlc.bridge import Kind, Progress, Status, TlcResult, run_tlc
from deferdump.tools.tlc.scale import scaled_config
from deferdump.tools.tlc.simulate import SimulationPlan, SimulationStats, simulate

TIERS = ("ci", "deep", "sim")
SIMULATED_ONLY = "sim"
"""The tier of models too big to check exhaustively: simulated only, their ``distinct_states`` null."""
VARIANTS = ("Direct", "LayerWise", "CP", "Contract")  # Contract: spec/ConnectorContract.tla and DeferDump against it
DEADLOCK = "Deadlock"
"""``{"violation": "Deadlock"}`` expects TLC's deadlock check to fail (deadlocks have no property name)."""

_REQUIRED = ("name", "module", "config", "tier", "variant", "expect", "distinct_states", "mutant", "conformance")
_OPTIONAL = ("workers", "timeout", "description", "reproduces", "row", "sim_batch")
_REPRODUCES = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*#[1-9][0-9]*")
"""``"reproduces"``: the public thread of the field bug a model reproduces, ``owner/repo#number``."""
_ROW = re.compile(r"[PN][1-9][0-9]*")
"""``"row"``: the bug's row in ``docs/real-bugs.md`` (P: in the protocol's scope, N: next to it)."""


class ManifestError(UserError):
    """The manifest is missing, not JSON, or breaks the schema; the message names the model and key."""


class UnknownModel(ManifestError):
    """A model name that the manifest does not list."""


@dataclass(frozen=True)
class Expectation:
    """What TLC must report for a model: a pass, or a violation of one named property."""

    violation: str | None = None  # None: the model must pass

    @property
    def passes(self) -> bool:
        return self.violation is None

    def describe(self) -> str:
        return "pass" if self.violation is None else f"violation of {self.violation}"

    def to_json(self) -> Any:
        return "pass" if self.violation is None else {"violation": self.violation}


@dataclass(frozen=True)
class ModelEntry:
    """One model of the manifest, its files resolved against the spec directory."""

    name: str
    module: str  # TLA+ module name (file ``<module>.tla`` in the spec directory)
    config: str  # cfg file name in the spec directory
    tier: str
    variant: str
    expect: Expectation
    distinct_states: int | None
    mutant: bool
    conformance: bool
    spec_dir: Path
    workers: int = 1
    timeout: float | None = None
    description: str | None = None
    reproduces: str | None = None  # the field bug's thread, owner/repo#number
    row: str | None = None  # its row id in docs/real-bugs.md, e.g. "P1"
    sim_batch: int | None = None  # behaviours per simulation batch when ``--batch`` is not given (slow models)

    @property
    def module_path(self) -> Path:
        return self.spec_dir / f"{self.module}.tla"

    @property
    def config_path(self) -> Path:
        return self.spec_dir / self.config


@dataclass(frozen=True)
class Manifest:
    """The loaded manifest: models in file order."""

    path: Path
    models: tuple[ModelEntry, ...]

    def get(self, name: str) -> ModelEntry:
        for entry in self.models:
            if entry.name == name:
                return entry
        known = ", ".join(entry.name for entry in self.models) or "none"
        raise UnknownModel(f"unknown model {name!r} (the manifest {self.path} lists: {known})")

    def select(self, names: Sequence[str] = (), tier: str | None = None) -> list[ModelEntry]:
        """Models by name (in the order given) or all models, optionally only those of one tier."""
        if tier is not None and tier not in TIERS:
            raise ManifestError(f"unknown tier {tier!r} (expected one of {', '.join(TIERS)})")
        if names:
            chosen = [self.get(name) for name in dict.fromkeys(names)]
            wrong_tier = [entry.name for entry in chosen if tier is not None and entry.tier != tier]
            if wrong_tier:
                raise ManifestError(f"models not in tier {tier}: {', '.join(wrong_tier)}")
            return chosen
        return [entry for entry in self.models if tier is None or entry.tier == tier]


def _problem(path: Path, where: str, text: str) -> ManifestError:
    return ManifestError(f"{path}: {where}: {text}")


def _entry(raw: Any, index: int, path: Path, root: Path) -> ModelEntry:
    where = f"models[{index}]"
    if not isinstance(raw, dict):
        raise _problem(path, where, "each model must be a JSON object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise _problem(path, where, "'name' must be a non-empty string")
    where = f"model {name!r}"
    missing = [key for key in _REQUIRED if key not in raw]
    if missing:
        raise _problem(path, where, f"missing keys: {', '.join(missing)}")
    unknown = sorted(set(raw) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise _problem(path, where, f"unknown keys: {', '.join(unknown)} (allowed: "
                                    f"{', '.join(_REQUIRED + _OPTIONAL)})")

    module = raw["module"]
    if not isinstance(module, str) or not module:
        raise _problem(path, where, "'module' must be a module name")
    module = module[:-4] if module.endswith(".tla") else module
    config = raw["config"]
    if not isinstance(config, str) or not config:
        raise _problem(path, where, "'config' must be a .cfg file name")
    config = config if config.endswith(".cfg") else f"{config}.cfg"
    if raw["tier"] not in TIERS:
        raise _problem(path, where, f"'tier' must be one of {', '.join(TIERS)}, not {raw['tier']!r}")
    if raw["variant"] not in VARIANTS:
        raise _problem(path, where, f"'variant' must be one of {', '.join(VARIANTS)}, not {raw['variant']!r}")
    expect = raw["expect"]
    if expect == "pass":
        expectation = Expectation()
    elif (isinstance(expect, dict) and set(expect) == {"violation"} and isinstance(expect["violation"], str)
          and expect["violation"]):
        expectation = Expectation(violation=expect["violation"])
    else:
        raise _problem(path, where, f"'expect' must be \"pass\" or {{\"violation\": \"<Property>\"}}, not {expect!r}")
    distinct = raw["distinct_states"]
    if distinct is not None and (type(distinct) is not int or distinct < 1):
        raise _problem(path, where, f"'distinct_states' must be a positive integer or null, not {distinct!r}")
    if raw["tier"] == SIMULATED_ONLY and distinct is not None:
        raise _problem(path, where, "'distinct_states' must be null in tier sim (a simulation counts none)")
    for key in ("mutant", "conformance"):
        if not isinstance(raw[key], bool):
            raise _problem(path, where, f"'{key}' must be true or false, not {raw[key]!r}")
    workers = raw.get("workers", 1)
    if type(workers) is not int or workers < 1:
        raise _problem(path, where, f"'workers' must be a positive integer, not {workers!r}")
    timeout = raw.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise _problem(path, where, f"'timeout' must be a positive number of seconds, not {timeout!r}")
    sim_batch = raw.get("sim_batch")
    if sim_batch is not None and (type(sim_batch) is not int or sim_batch < 1):
        raise _problem(path, where, f"'sim_batch' must be a positive integer, not {sim_batch!r}")
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        raise _problem(path, where, "'description' must be a string")
    reproduces, row = _reproduces(raw, expectation, path, where)

    entry = ModelEntry(
        name=name, module=module, config=config, tier=raw["tier"], variant=raw["variant"], expect=expectation,
        distinct_states=distinct, mutant=raw["mutant"], conformance=raw["conformance"], spec_dir=root,
        workers=workers, timeout=None if timeout is None else float(timeout), description=description,
        reproduces=reproduces, row=row, sim_batch=sim_batch,
    )
    if not entry.module_path.is_file():
        raise _problem(path, where, f"module file {entry.module_path} does not exist")
    if not entry.config_path.is_file():
        raise _problem(path, where, f"config file {entry.config_path} does not exist")
    return entry


def _reproduces(raw: dict[str, Any], expectation: Expectation, path: Path,
                where: str) -> tuple[str | None, str | None]:
    """The ``reproduces`` and ``row`` keys, together or neither, on a model that expects a violation (a
    model reproduces a bug by breaking the property the bug broke)."""
    reproduces, row = raw.get("reproduces"), raw.get("row")
    if reproduces is not None and not (isinstance(reproduces, str) and _REPRODUCES.fullmatch(reproduces)):
        raise _problem(path, where, f"'reproduces' must be a thread \"owner/repo#number\", not {reproduces!r}")
    if row is not None and not (isinstance(row, str) and _ROW.fullmatch(row)):
        raise _problem(path, where, f"'row' must be a bug row id like \"P1\" or \"N3\", not {row!r}")
    if (reproduces is None) != (row is None):
        raise _problem(path, where, "'reproduces' and 'row' go together: name the thread and its row")
    if reproduces is not None and expectation.passes:
        raise _problem(path, where, "a model that 'reproduces' a bug must expect the violation the bug causes")
    return reproduces, row


def load_manifest(path: Path | None = None) -> Manifest:
    """Load and validate the manifest (default: the shipped ``spec/manifest.json``)."""
    if path is None:
        try:
            path = spec_dir() / "manifest.json"
        except FileNotFoundError as error:
            raise ManifestError(str(error)) from None
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"manifest not found: {path}") from None
    except OSError as error:  # a directory, no permission...
        raise ManifestError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ManifestError(f"{path}: not UTF-8 text (byte {error.start}): not a JSON manifest") from None
    except json.JSONDecodeError as error:
        raise ManifestError(f"{path}: bad JSON at line {error.lineno}, column {error.colno}: {error.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise ManifestError(f"{path}: expected an object with a \"models\" list")
    entries = [_entry(raw, index, path, path.parent) for index, raw in enumerate(data["models"])]
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise ManifestError(f"{path}: model {entry.name!r} is listed twice")
        seen.add(entry.name)
    return Manifest(path=path, models=tuple(entries))


# --------------------------------------------------------------------------------------------
# Checking
# --------------------------------------------------------------------------------------------


@dataclass
class CheckOutcome:
    """A TLC result judged against what was expected of it."""

    model: str
    result: TlcResult
    expected_ok: bool
    mismatches: tuple[str, ...] = ()
    entry: ModelEntry | None = None
    expectation: Expectation = field(default_factory=Expectation)
    simulation: SimulationStats | None = None  # set for a ``--simulate`` run

    @property
    def summary(self) -> str:
        """One line: what went wrong, or TLC's own message."""
        parts = list(self.mismatches)
        if self.result.message:
            parts.append(self.result.message)
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The object ``deferdump check --json`` prints for this model (schema in README.md)."""
        result = self.result
        return {
            "model": self.model,
            "status": result.status.value,
            "kind": None if result.kind is None else result.kind.value,
            "property": result.property,
            "distinct_states": result.distinct_states,
            "generated_states": result.generated_states,
            "depth": result.depth,
            "seconds": round(result.seconds, 3),
            "trace": trace_json(result),
            "loop_index": result.loop_index,
            "message": (self.summary or None) if self.entry is not None and not self.expected_ok else result.message,
            "expected_ok": self.expected_ok,
            **({} if self.simulation is None else self.simulation.to_json()),
        }


def trace_json(result: TlcResult) -> list[dict[str, Any]]:
    """A TLC trace as ``deferdump check --json`` prints it: per state, TLC's action name and the values (ITF)."""
    return [{"action": state.action, "state": {name: to_itf(value) for name, value in state.values.items()}}
            for state in result.trace]


def _describe(result: TlcResult) -> str:
    if result.status is Status.PASS:
        return "pass"
    if result.status is Status.VIOLATION:
        what = result.property or (DEADLOCK if result.kind is Kind.DEADLOCK else None)
        kind = result.kind.value if result.kind else "unknown"
        return f"violation of {what} ({kind})" if what else f"{kind} violation with no property name"
    return f"error ({result.kind.value if result.kind else 'unknown'})"


def compare(expectation: Expectation, expected_distinct: int | None, result: TlcResult) -> list[str]:
    """Why ``result`` does not meet the expectation (empty: it does)."""
    mismatches: list[str] = []
    if expectation.passes:
        if result.status is not Status.PASS:
            mismatches.append(f"expected pass, got {_describe(result)}")
    else:
        violated = result.property or (DEADLOCK if result.kind is Kind.DEADLOCK else None)
        if result.status is not Status.VIOLATION or violated != expectation.violation:
            hint = ""
            if result.kind is Kind.LIVENESS and result.property is None:
                hint = " (TLC 2.15 names no temporal property: list exactly one PROPERTY in the cfg)"
            mismatches.append(f"expected {expectation.describe()}, got {_describe(result)}{hint}")
    if (expected_distinct is not None and result.status is not Status.ERROR
            and result.distinct_states != expected_distinct):
        mismatches.append(f"distinct states {result.distinct_states}, manifest says {expected_distinct} "
                          "(the model changed: review, then update the manifest)")
    return mismatches


def check_model(entry: ModelEntry, *, workers: int | None = None, timeout: float | None = None,
                progress: Callable[[Progress], None] | None = None,
                cancel: threading.Event | None = None) -> CheckOutcome:
    """Run TLC on a manifest model and compare with its expectations (``workers``/``timeout`` override)."""
    result = run_tlc(entry.module_path, entry.config_path, workers=workers or entry.workers,
                     timeout=timeout if timeout is not None else entry.timeout, progress=progress, cancel=cancel,
                     expected_states=entry.distinct_states)
    mismatches = compare(entry.expect, entry.distinct_states, result)
    return CheckOutcome(model=entry.name, result=result, expected_ok=not mismatches,
                        mismatches=tuple(mismatches), entry=entry, expectation=entry.expect)


def check_spec(spec: Path, config: Path | None = None, *, workers: int = 1, timeout: float | None = None,
               progress: Callable[[Progress], None] | None = None,
               cancel: threading.Event | None = None) -> CheckOutcome:
    """Run TLC on any spec; it is as expected when it passes."""
    result = run_tlc(spec, config, workers=workers, timeout=timeout, progress=progress, cancel=cancel)
    mismatches = compare(Expectation(), None, result)
    return CheckOutcome(model=Path(spec).stem, result=result, expected_ok=not mismatches,
                        mismatches=tuple(mismatches))


def simulate_model(entry: ModelEntry, plan: SimulationPlan, *, config: Path | str | None = None,
                   extra_modules: dict[str, str] | None = None, requests: int | None = None,
                   progress: Callable[[Progress], None] | None = None,
                   cancel: threading.Event | None = None) -> CheckOutcome:
    """Simulate a manifest model (``config``: another cfg for its module, e.g. bigger bounds; ``requests``: its
    own cfg grown to that many requests, :func:`~deferdump.tools.tlc.scale.scaled_config`) and judge the
    verdict as :func:`check_model` does; simulations count no distinct states, so none is compared."""
    modules = dict(extra_modules or {})
    if requests is not None:
        if config is not None:
            raise ManifestError("give a cfg or a number of requests to simulate, not both")
        config = f"{Path(entry.config).stem}_{requests}req.cfg"
        modules[config] = scaled_config(entry.config_path.read_text(encoding="utf-8"), requests)
    result, stats = simulate(entry.module_path, config if config is not None else entry.config_path, plan,
                             extra_modules=modules, progress=progress, cancel=cancel)
    if requests is not None:
        stats = dataclasses.replace(stats, requests=requests)
    mismatches = compare(entry.expect, None, result)
    return CheckOutcome(model=entry.name, result=result, expected_ok=not mismatches, mismatches=tuple(mismatches),
                        entry=entry, expectation=entry.expect, simulation=stats)


def simulate_spec(spec: Path, config: Path | None, plan: SimulationPlan, *,
                  progress: Callable[[Progress], None] | None = None,
                  cancel: threading.Event | None = None) -> CheckOutcome:
    """Simulate any spec; it is as expected when no violation turns up."""
    result, stats = simulate(spec, config, plan, progress=progress, cancel=cancel)
    mismatches = compare(Expectation(), None, result)
    return CheckOutcome(model=Path(spec).stem, result=result, expected_ok=not mismatches,
                        mismatches=tuple(mismatches), simulation=stats)


def outcomes_json(outcomes: Iterable[CheckOutcome]) -> list[dict[str, Any]]:
    """The JSON value ``deferdump check --json`` prints."""
    return [outcome.to_json() for outcome in outcomes]

