"""Every random failure prints a one-line replay recipe, and the recipe replays it (tests/support/randomness.py).

Each test writes a deliberately failing test to tmp_path, runs pytest on it in a subprocess under the suite's
own conftest (the hooks, the `seed` fixture, the Hypothesis profiles), reads the recipe from the output, runs
it, and checks that the replay fails on the same example.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from support import randomness

TESTS = Path(__file__).resolve().parents[1]
CONFTEST = f"""
import os, runpy, sys
sys.path.insert(0, {str(TESTS)!r})
globals().update({{k: v for k, v in runpy.run_path({str(TESTS / "conftest.py")!r}).items() if not k.startswith("__")}})
if os.environ.get("REPLAY_ONLY"):  # the suite's profile, but no new examples: only what the database holds
    from hypothesis import Phase, settings
    settings.register_profile("replay-only", settings.get_profile(HYPOTHESIS_PROFILE), phases=[Phase.reuse])
    settings.load_profile("replay-only")
"""
PROPERTY = """
from hypothesis import given, strategies as st
{decorator}
@given(st.integers(min_value=0, max_value=10**9))
def test_property(n):
    assert n < 10, n  # fails on nearly every draw, so every run finds it; shrinks to 10
"""
SEEDED = """
import random
import pytest

@pytest.mark.seed(3)
def test_seeded(seed):
    drawn = random.Random(seed).randrange(10**9)
    assert drawn < 0, f"drew {drawn}"
"""


def _pytest(directory: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("CI", randomness.PROFILE_VARIABLE, randomness.SEED_VARIABLE, randomness.DB_VARIABLE)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=directory,
                          env={**clean, **env}, capture_output=True, text=True, timeout=300)


def _write(directory: Path, name: str, text: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "conftest.py").write_text(CONFTEST)
    (directory / name).write_text(text)


def _falsifying(output: str) -> str:
    match = re.search(r"^E\s+AssertionError: (\d+)$", output, re.MULTILINE)  # the failing n
    assert match, output
    return match.group(1)


@pytest.mark.parametrize("profile", ["dev", "ci"])
def test_a_hypothesis_failure_prints_reproduce_failure_and_it_replays(tmp_path: Path, profile: str) -> None:
    database = tmp_path / "db"
    _write(tmp_path / "run", "test_prop.py", PROPERTY.format(decorator=""))
    first = _pytest(tmp_path / "run", {randomness.PROFILE_VARIABLE: profile, randomness.DB_VARIABLE: str(database)})
    assert first.returncode == 1, first.stdout + first.stderr
    recipes = re.findall(r"^.*@reproduce_failure\(.*\).*$", first.stdout, re.MULTILINE)
    assert len(recipes) == 1, first.stdout  # one line says how to replay it
    example = _falsifying(first.stdout)
    assert any(database.rglob("*")), "the failing example was not saved in the example database"

    # the recipe alone (a fresh, empty database): the decorator replays the same example
    decorator = re.search(r"(@reproduce_failure\(.*?\))", recipes[0]).group(1)
    _write(tmp_path / "replay", "test_prop.py", "from hypothesis import reproduce_failure\n"
           + PROPERTY.format(decorator=decorator))
    replay = _pytest(tmp_path / "replay", {randomness.PROFILE_VARIABLE: profile,
                                           randomness.DB_VARIABLE: str(tmp_path / "empty-db")})
    assert replay.returncode == 1 and _falsifying(replay.stdout) == example, replay.stdout

    # the database alone: the next step of the run (same database) replays it, even drawing nothing new
    again = _pytest(tmp_path / "run", {randomness.PROFILE_VARIABLE: profile, randomness.DB_VARIABLE: str(database),
                                       "REPLAY_ONLY": "1"})
    assert again.returncode == 1 and _falsifying(again.stdout) == example, again.stdout
    empty = _pytest(tmp_path / "run", {randomness.PROFILE_VARIABLE: profile,
                                       randomness.DB_VARIABLE: str(tmp_path / "other-db"), "REPLAY_ONLY": "1"})
    assert empty.returncode == 0, empty.stdout  # without the database there is nothing to replay


@pytest.mark.parametrize("seed_setting", ["", "random"])
def test_a_seeded_failure_prints_a_replay_line_and_it_replays(tmp_path: Path, seed_setting: str) -> None:
    _write(tmp_path, "test_seeded.py", SEEDED)
    first = _pytest(tmp_path, {randomness.SEED_VARIABLE: seed_setting})
    assert first.returncode == 1, first.stdout + first.stderr
    lines = re.findall(r"^replay: .*$", first.stdout, re.MULTILINE)
    assert len(lines) == 1, first.stdout
    drawn = re.search(r"AssertionError: drew (\d+)", first.stdout).group(1)
    words = shlex.split(lines[0].removeprefix("replay: "))
    assignment, command = words[0], words[1:]
    name, _, value = assignment.partition("=")
    assert name == randomness.SEED_VARIABLE and value.isdigit() and command[0] == "pytest"
    if not seed_setting:
        assert value == "3"  # the marker's default
    replay = _pytest(tmp_path, {name: value}, *command[1:])
    assert replay.returncode == 1 and f"drew {drawn}" in replay.stdout, replay.stdout
    assert lines[0] in replay.stdout  # and it names the same recipe


def test_a_passing_seeded_test_prints_no_recipe_and_a_seedless_test_none(tmp_path: Path) -> None:
    _write(tmp_path, "test_ok.py", "import pytest\n\n@pytest.mark.seed(1)\ndef test_ok(seed):\n    assert seed == 1\n\n"
           "def test_plain_failure():\n    assert False\n")
    result = _pytest(tmp_path, {})
    assert result.returncode == 1 and "1 failed, 1 passed" in result.stdout, result.stdout
    assert "replay:" not in result.stdout  # a test without the seed fixture has nothing to replay but its id


def test_the_seed_fixture_needs_its_default_and_a_number(tmp_path: Path) -> None:
    _write(tmp_path, "test_bad.py", "def test_no_marker(seed):\n    pass\n")
    result = _pytest(tmp_path, {})
    assert result.returncode != 0 and "needs @pytest.mark.seed(<int>)" in result.stdout + result.stderr
    _write(tmp_path, "test_bad.py", "import pytest\n\n@pytest.mark.seed(1)\ndef test_marked(seed):\n    pass\n")
    result = _pytest(tmp_path, {randomness.SEED_VARIABLE: "seven"})
    assert result.returncode != 0 and "expected an integer or 'random'" in result.stdout + result.stderr


def test_the_profile_follows_ci_and_hypothesis_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(randomness.PROFILE_VARIABLE, raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert randomness.profile_name() == "dev"
    monkeypatch.setenv("CI", "true")
    assert randomness.profile_name() == "ci"
    monkeypatch.setenv("CI", "false")
    assert randomness.profile_name() == "dev"
    monkeypatch.setenv(randomness.PROFILE_VARIABLE, "fixed")
    assert randomness.profile_name() == "fixed"


def test_an_unknown_profile_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(randomness.PROFILE_VARIABLE, "derandomised")
    with pytest.raises(pytest.UsageError, match="'derandomised': not one of the suite's profiles dev, ci, fixed"):
        randomness.load_hypothesis_profile()


def test_the_makefile_and_ci_share_one_example_database() -> None:
    checkout = TESTS.parent
    assert "export DEFERDUMP_HYPOTHESIS_DB ?= $(CURDIR)/.hypothesis/examples" in (checkout / "Makefile").read_text()
    ci = (checkout / ".ci" / "run").read_text()
    assert 'export CI="${CI:-true}"' in ci and "export DEFERDUMP_HYPOTHESIS_DB=" in ci
    assert randomness.DEFAULT_DB == checkout / ".hypothesis" / "examples"
