"""The on-disk trace cache (deferdump.conformance.tracecache) on the Toy model: real TLC, real files.

A hit runs no TLC; a changed spec or cfg is a miss; a damaged entry (a file edited, a file gone, the
entry's record garbled) is regenerated, never trusted; sessions racing on one entry both get a sound one.
The decoded copy of an entry's traces equals a fresh decode, is unpickled on a hit, follows a changed spec
or decoder, and is decoded again (never trusted) when it is damaged in any way.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import deferdump.conformance.tracecache as tracecache
from support.conformance import FIXTURES, counting_json_decodes, toy_manifest
from deferdump.conformance.itfload import TraceLoader
from deferdump.tools.tlc.manifest import ModelEntry
from deferdump.tools.tlc.values import ItfTrace

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
    """The cache's entries and anything left beside them (scratch directories); its lock files aside."""
    return sorted(p for p in tracecache.cache_root().iterdir() if p.name != tracecache.LOCKS)


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


def _race(toy: ModelEntry, body: str) -> list[str]:
    """Run two processes at once, each with a private `entry` for the toy model and `tc`, the cache module,
    then `body`; both must exit 0. Their standard outputs."""
    script = (
        "import sys; from dataclasses import replace; from pathlib import Path\n"
        f"sys.path.insert(0, {str(REPO_TESTS)!r})\n"
        "import deferdump.conformance.tracecache as tc\n"
        "from support.conformance import toy_manifest\n"
        f"entry = replace(toy_manifest().get('Toy'), spec_dir=Path({str(toy.spec_dir)!r}))\n"
    ) + body
    env = {"DEFERDUMP_TRACE_CACHE": str(tracecache.cache_root()), "PATH": "/usr/bin:/bin"}
    runs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env) for _ in range(2)]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    return [out for out, _ in outputs]


def test_racing_sessions_both_get_a_sound_entry(toy: ModelEntry, tmp_path: Path) -> None:
    outputs = _race(toy, "traces, graph = tc.cached_cover(entry)\nprint(len(traces.files), graph['edges'])\n")
    assert outputs[0] == outputs[1]
    [entry] = _entries(toy)  # one entry; the loser's scratch directory is gone
    traces, _ = tracecache.cached_cover(toy)
    assert traces.files[0].parent.parent == entry


def test_racing_sessions_run_tlc_once(toy: ModelEntry) -> None:
    """Two processes start on the same missing entry: one generates it, the other waits on its lock and
    reads it (each says whether it ran the generator)."""
    outputs = _race(toy, (
        "real = tc.generate_traces\n"
        "def counted(*args, **kwargs):\n"
        "    print('generated', flush=True)\n"
        "    return real(*args, **kwargs)\n"
        "tc.generate_traces = counted\n"
        "print(len(tc.cached_cover(entry)[0].files))\n"
    ))
    lines = [out.split() for out in outputs]
    assert sum(line.count("generated") for line in lines) == 1, outputs
    assert lines[0][-1] == lines[1][-1]  # the same traces
    assert (tracecache.cache_root() / tracecache.LOCKS).is_dir() and len(_entries(toy)) == 1


# ------------------------------------------------------------------------------------------ decoded traces

def _fresh(files: list[Path]) -> list[ItfTrace]:
    loader = TraceLoader()
    return [loader.load(path) for path in files]


def test_decoded_traces_are_kept_and_equal_a_fresh_decode(toy: ModelEntry, monkeypatch: pytest.MonkeyPatch) -> None:
    first = tracecache.cached_decoded(toy)
    files = tracecache.cached_cover(toy)[0].files
    assert list(first) == _fresh(files) and [t.path for t in first] == files
    [entry] = _entries(toy)
    assert (entry / "decoded.pickle").is_file()
    decoded = counting_json_decodes(monkeypatch)
    again = tracecache.cached_decoded(toy)
    assert decoded == [] and again == first and [t.path for t in again] == files  # unpickled, not decoded


def test_decoded_traces_follow_a_changed_spec_or_decoder(toy: ModelEntry, monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    tracecache.cached_decoded(toy)
    decoded = counting_json_decodes(monkeypatch)
    toy.config_path.write_text(toy.config_path.read_text() + "\n\\* a comment changes the key\n")
    changed = tracecache.cached_decoded(toy)
    assert len(decoded) == len(changed) > 0 and len(_entries(toy)) == 2  # a new entry, decoded anew
    decoder = tmp_path / "decoder.py"
    decoder.write_text("# the decoder's source, version 1\n")
    module = SimpleNamespace(__name__="decoder", __file__=str(decoder))
    monkeypatch.setattr(tracecache, "_DECODER_SOURCES", (*tracecache._DECODER_SOURCES, module))
    decoded.clear()
    tracecache.cached_decoded(toy)
    assert len(decoded) == len(changed)  # another decoder's pickle is not used
    decoded.clear()
    assert tracecache.cached_decoded(toy) == changed and decoded == []
    decoder.write_text("# the decoder's source, version 2\n")
    assert tracecache.cached_decoded(toy) == changed and len(decoded) == len(changed)


def _rehashed(payload: bytes, key: str) -> bytes:
    """A decoded-traces file holding ``payload`` under a correct header (the hash matches)."""
    return (tracecache._DECODED_MAGIC + f"{key}\n{hashlib.sha256(payload).hexdigest()}\n".encode() + payload)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage-pickle", "not-traces", "fewer-traces"])
def test_a_damaged_decoded_file_is_decoded_again_never_trusted(toy: ModelEntry, monkeypatch: pytest.MonkeyPatch,
                                                               damage: str) -> None:
    first = tracecache.cached_decoded(toy)
    [entry] = _entries(toy)
    path = entry / "decoded.pickle"
    data = path.read_bytes()
    key = tracecache._decoder_key(entry)
    if damage == "flip":  # one byte of a pickled string: still unpickles, to a wrong value, without the hash
        at = data.rindex(b"Toy")
        path.write_bytes(data[:at] + b"Toz" + data[at + 3:])
    elif damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "garbage-pickle":
        path.write_bytes(_rehashed(b"\x80\x05not a pickle", key))
    elif damage == "not-traces":
        path.write_bytes(_rehashed(pickle.dumps({"traces": 1}), key))
    else:
        path.write_bytes(_rehashed(pickle.dumps(list(first[:-1])), key))
    decoded = counting_json_decodes(monkeypatch)
    again = tracecache.cached_decoded(toy)
    assert again == first and len(decoded) == len(first)
    decoded.clear()
    assert tracecache.cached_decoded(toy) == first and decoded == []  # the file was rewritten whole
    assert sorted(p.name for p in entry.iterdir()) == ["decoded.pickle", "entry.json", "traces"]  # no scratch left


def test_a_damaged_trace_file_discards_its_decoded_copy(toy: ModelEntry, monkeypatch: pytest.MonkeyPatch) -> None:
    first = tracecache.cached_decoded(toy)
    victim = tracecache.cached_cover(toy)[0].files[0]
    original = victim.read_bytes()
    victim.write_bytes(original.replace(b'"Toy"', b'"Toz"', 1))
    decoded = counting_json_decodes(monkeypatch)
    assert tracecache.cached_decoded(toy) == first and len(decoded) == len(first)  # regenerated, then decoded
    assert victim.read_bytes() == original
