"""Reproducible randomness in the suite: Hypothesis profiles and database, and the seed of seeded tests.

Every random failure must say how to replay it, in one line (the policy: README "Randomness in tests",
details in docs/testing.md):

- Hypothesis tests print ``@reproduce_failure(...)`` (``print_blob``) and save the failing example in the
  example database (``$DEFERDUMP_HYPOTHESIS_DB``, default ``.hypothesis/examples`` in the checkout; the
  Makefile exports it, so ``make test`` and ``make verify`` in one CI run share it). The directory database
  writes each example to its own file, so the xdist workers of one run share it safely.
- Profiles: ``dev`` (the default) and ``ci`` (``CI`` set to a true value, or ``HYPOTHESIS_PROFILE=ci``) both draw new
  examples on every run, replay the database's failures first, and have no deadline and no too-slow check
  (timing on a shared machine is not a property). ``fixed`` (``HYPOTHESIS_PROFILE=fixed``) derandomizes: the
  same examples on every run, for bisecting (Hypothesis then uses no database).
- A test whose randomness is not Hypothesis asks for the ``seed`` fixture (its default seed in
  ``@pytest.mark.seed(N)``; ``DEFERDUMP_TEST_SEED=N`` replaces it, ``DEFERDUMP_TEST_SEED=random`` draws one) and
  a failure prints ``replay: DEFERDUMP_TEST_SEED=N pytest '<test id>'``.
"""
from __future__ import annotations

import os
import random
import shlex
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

DB_VARIABLE = "DEFERDUMP_HYPOTHESIS_DB"
SEED_VARIABLE = "DEFERDUMP_TEST_SEED"
PROFILE_VARIABLE = "HYPOTHESIS_PROFILE"
CHECKOUT = Path(__file__).resolve().parents[2]
DEFAULT_DB = CHECKOUT / ".hypothesis" / "examples"
PROFILES = ("dev", "ci", "fixed")
_SEED = pytest.StashKey[int]()
_TRUE = {"1", "true", "yes", "on"}


def database_path() -> Path:
    """Where the example database lives (one directory for every process of a run)."""
    return Path(os.environ.get(DB_VARIABLE) or DEFAULT_DB)


def profile_name() -> str:
    """``$HYPOTHESIS_PROFILE``, else ``ci`` under CI (``CI=true``), else ``dev``."""
    chosen = os.environ.get(PROFILE_VARIABLE)
    if chosen:
        return chosen
    return "ci" if os.environ.get("CI", "").strip().lower() in _TRUE else "dev"


def load_hypothesis_profile() -> str:
    """Register the suite's profiles and load the chosen one; before any test module is imported, so the
    tests' own ``@settings(...)`` inherit it. Returns the profile's name."""
    common = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
    database = DirectoryBasedExampleDatabase(database_path())
    settings.register_profile("dev", derandomize=False, database=database, **common)
    settings.register_profile("ci", derandomize=False, database=database, **common)
    settings.register_profile("fixed", derandomize=True, **common)
    name = profile_name()
    if name not in PROFILES:
        raise pytest.UsageError(f"{PROFILE_VARIABLE}={name!r}: not one of the suite's profiles {', '.join(PROFILES)}")
    settings.load_profile(name)
    return name


def _default_seed(request: pytest.FixtureRequest) -> int:
    marker = request.node.get_closest_marker("seed")
    if marker is None or len(marker.args) != 1 or type(marker.args[0]) is not int:
        raise pytest.UsageError(f"{request.node.nodeid}: the seed fixture needs @pytest.mark.seed(<int>)")
    return marker.args[0]


def chosen_seed(request: pytest.FixtureRequest) -> int:
    """The test's seed: ``$DEFERDUMP_TEST_SEED`` (a number, or ``random``), else the marker's default."""
    text = os.environ.get(SEED_VARIABLE, "").strip()
    if not text:
        return _default_seed(request)
    if text == "random":
        return random.SystemRandom().randrange(2**32)
    try:
        return int(text)
    except ValueError:
        raise pytest.UsageError(f"{SEED_VARIABLE}={text!r}: expected an integer or 'random'") from None


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """The seed of a test's own randomness; a failure prints the one-line command that replays it."""
    value = chosen_seed(request)
    request.node.stash[_SEED] = value
    return value


def replay_line(item: pytest.Item) -> str | None:
    """``replay: DEFERDUMP_TEST_SEED=N pytest '<id>'`` for a test that used the seed fixture, else None."""
    value = item.stash.get(_SEED, None)
    if value is None:
        return None
    return f"replay: {SEED_VARIABLE}={value} pytest -p no:cacheprovider {shlex.quote(item.nodeid)}"


def add_replay_section(item: pytest.Item, report: pytest.TestReport) -> None:
    """Put the replay line under a failed seeded test's report (printed with its traceback)."""
    line = replay_line(item) if report.failed else None
    if line is not None:
        report.sections.append(("replay (seeded test)", line))
