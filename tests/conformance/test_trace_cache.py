"""The on-disk trace cache (support.tracecache) on the Toy model: real TLC, real files.

A hit runs no TLC; a changed spec or cfg is a miss; a damaged entry (a file edited, a file gone, the
entry's record garbled) is regenerated, never trusted; sessions racing on one entry both get a sound one.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import support.tracecache as tracecache
from support.conformance import FIXTURES, toy_manifest
from deferdump.tools.tlc.manifest import ModelEntry

REPO_TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelEntry:
    """The Toy model on a private copy of its files, with a private cache."""
    spec = tmp_path / "spec"
    shutil.copytree(FIXTURES, spec, ignore=shutil.ignore_patterns("deferdump"))
    monkeypatch.setenv(tracecache.CACHE_ENV, str(tmp_path / "cache"))
    return replace(toy_manifest().get("Toy"), spec_dir=spec)


def _no_tlc(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cache was expected to answer without TLC")
    monkeypatch.setattr(tracecache, "generate_traces", refuse)


def _entries(toy: ModelEntry) -> list[Path]:
    return sorted(tracecache.cache_root().iterdir())


def test_second_call_is_a_hit_without_tlc(toy: ModelEntry, monkeypatch: pytest.MonkeyPatch) -> None:
    first, graph = tracecache.cached_cover(toy)
    assert first.traces > 0 and first.covered_edges == first.edges == graph["edges"]
    assert {"inc", "reset"} <= set(graph["action_labels"])
    _no_tlc(monkeypatch)
    again, graph_again = tracecache.cached_cover(toy)
    assert again.files == first.files and again.lengths == first.lengths and graph_again == graph
    assert json.loads(first.files[0].read_text())["#meta"]["model"] == "Toy"
    assert [p.name.startswith("Toy-") for p in _entries(toy)] == [True]


def test_a_changed_spec_or_cfg_misses(toy: ModelEntry) -> None:
    key = tracecache.entry_key(toy)
    cfg = toy.config_path
    cfg.write_text(cfg.read_text() + "\n\\* a comment changes the key\n")
    assert tracecache.entry_key(toy) != key
    key = tracecache.entry_key(toy)
    module = toy.module_path
    module.write_text(module.read_text() + "\n\\* after the module end\n")
    assert tracecache.entry_key(toy) != key
    assert tracecache.entry_key(toy, max_len=5) != tracecache.entry_key(toy)


@pytest.mark.parametrize("damage", ["edit", "remove", "garble-record"])
def test_a_damaged_entry_is_regenerated(toy: ModelEntry, damage: str) -> None:
    first, _ = tracecache.cached_cover(toy)
    victim = first.files[len(first.files) // 2]
    original = victim.read_bytes()
    [entry] = _entries(toy)
    if damage == "edit":
        victim.write_bytes(original.replace(b'"Toy"', b'"Toz"', 1))
    elif damage == "remove":
        victim.unlink()
    else:
        (entry / "entry.json").write_text("{not json")
    again, _ = tracecache.cached_cover(toy)
    assert [p.name for p in again.files] == [p.name for p in first.files]
    assert victim.read_bytes() == original
    assert _entries(toy) == [entry]  # the bad entry is gone, nothing left aside


def test_racing_sessions_both_get_a_sound_entry(toy: ModelEntry, tmp_path: Path) -> None:
    script = (
        "import sys; from dataclasses import replace; from pathlib import Path\n"
        f"sys.path.insert(0, {str(REPO_TESTS)!r})\n"
        "import support.tracecache as tc\n"
        "from support.conformance import toy_manifest\n"
        f"entry = replace(toy_manifest().get('Toy'), spec_dir=Path({str(toy.spec_dir)!r}))\n"
        "traces, graph = tc.cached_cover(entry)\n"
        "print(len(traces.files), graph['edges'])\n"
    )
    env = {"DEFERDUMP_TRACE_CACHE": str(tracecache.cache_root()), "PATH": "/usr/bin:/bin"}
    runs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env) for _ in range(2)]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert outputs[0][0] == outputs[1][0]
    [entry] = _entries(toy)  # one entry; the loser's scratch directory is gone
    traces, _ = tracecache.cached_cover(toy)
    assert traces.files[0].parent.parent == entry
