"""Edge-cover traces of conformance models, generated once and kept on disk between runs.

`deferdump verify` and the test suite share it: whichever runs first generates a model's edge cover, the
other reuses it (`make test` then `make verify` in CI generate each model's traces once).

An entry is keyed by everything its traces depend on: the text of every module in the model's spec
directory, its cfg, the manifest entry's fields, the generator's parameters and the generator's own
source. A changed spec therefore never reuses old traces, and an unchanged one skips TLC entirely.

Safe against concurrent sessions and damage: an entry is written under a private temporary directory and
renamed into place whole (the rename is atomic; a session that loses the race keeps the winner's entry).
A session that finds an entry missing takes that entry's lock file (``.locks/``) first, so concurrent
sessions wait for one generation instead of each running TLC. Every file is checked against the SHA-256
recorded at generation before it is used; an entry that fails the check is moved aside and regenerated,
never trusted.

An entry also keeps its traces decoded (``decoded.pickle``, written by :func:`cached_decoded` the first time
they are decoded): unpickling 16,653 traces takes a fifth of the CPU of parsing and decoding their JSON. The
file records the SHA-256 of the entry's record (which holds every trace file's hash), of the decoder's
source and of its own pickled bytes; anything that does not match is decoded from the ITF files again and
the file rewritten (atomically, by rename), never trusted. The pickle is only ever read from a file this
module wrote in the cache; whoever can write there can rewrite the traces themselves.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import pickle
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import deferdump.conformance.cover as cover_module
import deferdump.conformance.itfload as itfload_module
import deferdump.conformance.stategraph as stategraph_module
import deferdump.conformance.tracegen as tracegen_module
import deferdump.tools.tlc.cfg as cfg_module
import deferdump.tools.tlc.values as values_module
from deferdump.conformance.tracegen import GeneratedTraces, generate_traces, model_graph
from deferdump.conformance.itfload import TraceLoader
from deferdump.tools.tlc.cds import cache_dir as deferdump_cache_dir
from deferdump.tools.tlc.manifest import ModelEntry
from deferdump.tools.tlc.values import ItfTrace

log = logging.getLogger(__name__)

CACHE_ENV = "DEFERDUMP_TRACE_CACHE"
MODE = "cover"
FORMAT = 1  # bump when the layout of an entry changes
_META = "entry.json"
_GENERATOR_SOURCES = (tracegen_module, cover_module, stategraph_module, cfg_module, values_module)
_DECODED = "decoded.pickle"
_DECODED_MAGIC = b"deferdump-decoded-traces 1\n"  # then the decoder key and the payload's SHA-256 (hex), then the payload
_DECODER_SOURCES = (itfload_module, values_module)


def cache_root() -> Path:
    """``$DEFERDUMP_TRACE_CACHE``, else ``traces`` in deferdump's cache directory (``$DEFERDUMP_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/deferdump``, else ``~/.cache/deferdump``, as for TLC's class archive). The
    repository's Makefile and tests point it at ``.cache/deferdump-traces`` in the checkout (git ignores it)."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else deferdump_cache_dir() / "traces"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def entry_key(entry: ModelEntry, max_len: int | None = None) -> str:
    """SHA-256 over what the traces depend on (see the module docstring)."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)

    add("format", str(FORMAT).encode())
    add("entry", json.dumps({"name": entry.name, "module": entry.module, "config": entry.config,
                             "variant": entry.variant, "mode": MODE, "max_len": max_len}, sort_keys=True).encode())
    add("cfg", entry.config_path.read_bytes())
    for module in sorted(Path(entry.spec_dir).glob("*.tla")):
        add(f"tla:{module.name}", module.read_bytes())
    for source in _GENERATOR_SOURCES:
        add(f"py:{source.__name__}", Path(source.__file__).read_bytes())
    return digest.hexdigest()


def _load(directory: Path) -> tuple[GeneratedTraces, dict[str, Any]] | None:
    """The entry in ``directory`` if it is whole and every file matches its recorded hash."""
    try:
        meta = json.loads((directory / _META).read_text(encoding="utf-8"))
        files = [directory / name for name, _ in meta["files"]]
        for path, (_, expected) in zip(files, meta["files"]):
            if _sha256(path) != expected:
                log.warning("trace cache: %s does not match its hash", path)
                return None
        traces = GeneratedTraces(model=meta["model"], mode=meta["mode"], states=meta["states"],
                                 edges=meta["edges"], covered_edges=meta["covered_edges"], files=files,
                                 lengths=list(meta["lengths"]), seconds=meta["seconds"])
        return traces, meta["graph"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("trace cache: unusable entry %s: %s", directory, error)
        return None


def _discard(directory: Path) -> None:
    """Move a bad entry aside (atomic) and remove it; a concurrent reader sees it whole or not at all."""
    aside = directory.with_name(f".trash-{uuid.uuid4().hex}")
    try:
        directory.rename(aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _generate(entry: ModelEntry, final: Path, max_len: int | None) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=final.parent))
    try:
        traces = generate_traces(entry, MODE, scratch / "traces", max_len=max_len)
        graph = model_graph(entry)  # cached in this process by generate_traces
        meta = {key: value for key, value in asdict(traces).items() if key != "files"}
        meta["files"] = [[f"traces/{path.name}", _sha256(path)] for path in traces.files]
        meta["graph"] = {"edges": graph.num_edges, "states": graph.num_states,
                         "action_labels": sorted(graph.action_labels())}
        (scratch / _META).write_text(json.dumps(meta), encoding="utf-8")
        try:
            scratch.rename(final)  # atomic; fails if another session put its entry there first
        except OSError:
            if not final.is_dir():
                raise
            log.info("trace cache: %s was written by another session meanwhile", final.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


LOCKS = ".locks"  # under the cache root: one lock file per entry being generated


@contextlib.contextmanager
def _generation_lock(final: Path) -> Iterator[None]:
    """Held while a process generates ``final``: another session asking for the same entry (an xdist worker,
    a `deferdump verify` beside `make test`) waits for it and reads it, instead of running the same TLC and
    edge cover again. The atomic rename in :func:`_generate` keeps entries sound without it (a platform
    without ``fcntl``, a file system that refuses locks): then racing sessions only repeat the work."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    locks = final.parent / LOCKS
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / final.name, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as error:
            log.info("trace cache: no lock for %s (%s): a concurrent session may generate it too", final.name, error)
        yield  # closing the file releases the lock


def cached_cover(entry: ModelEntry, *, max_len: int | None = None) -> tuple[GeneratedTraces, dict[str, Any]]:
    """The model's edge-cover traces and its graph's size and action labels, from the cache or TLC."""
    final = cache_root() / f"{entry.name}-{entry_key(entry, max_len)[:32]}"
    if final.is_dir():  # a hit takes no lock
        loaded = _load(final)
        if loaded is not None:
            return loaded
    with _generation_lock(final):
        for _ in range(3):
            if final.is_dir():  # a session that held the lock before us may have written it
                loaded = _load(final)
                if loaded is not None:
                    return loaded
                _discard(final)
            _generate(entry, final, max_len)
    raise RuntimeError(f"trace cache: could not produce a sound entry for {entry.name} in {final}")


# ------------------------------------------------------------------------------------------ decoded traces

def _decoder_key(directory: Path) -> str:
    """SHA-256 over what the decoded traces depend on: the entry's record (every trace file's hash), the
    decoder's source, the pickle protocol and the Python version."""
    digest = hashlib.sha256()
    digest.update((directory / _META).read_bytes())
    for source in _DECODER_SOURCES:
        digest.update(f"\0py:{source.__name__}\0".encode())
        digest.update(Path(source.__file__).read_bytes())
    digest.update(f"\0pickle:{pickle.HIGHEST_PROTOCOL}\0python:{sys.version_info[:2]}".encode())
    return digest.hexdigest()


def _read_decoded(path: Path, key: str) -> list[ItfTrace] | None:
    """The decoded traces in ``path`` if it was written for ``key`` and its payload matches its hash."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        log.warning("trace cache: cannot read %s: %s", path, error)
        return None
    header = len(_DECODED_MAGIC) + 2 * 65
    if not data.startswith(_DECODED_MAGIC) or len(data) < header:
        log.warning("trace cache: %s is not a decoded-traces file", path)
        return None
    written_key, payload_hash = data[len(_DECODED_MAGIC):header].decode("ascii", "replace").split("\n")[:2]
    payload = memoryview(data)[header:]
    if written_key != key:
        log.info("trace cache: %s was decoded by another decoder; decoding again", path)
        return None
    if hashlib.sha256(payload).hexdigest() != payload_hash:
        log.warning("trace cache: %s does not match its hash", path)
        return None
    try:
        traces = pickle.loads(payload)
    except Exception as error:  # a file that matches its hash but does not unpickle: decode again
        log.warning("trace cache: cannot unpickle %s: %s", path, error)
        return None
    if not isinstance(traces, list) or not all(isinstance(trace, ItfTrace) for trace in traces):
        log.warning("trace cache: %s does not hold a list of traces", path)
        return None
    return traces


def _write_decoded(path: Path, key: str, traces: list[ItfTrace]) -> None:
    """Write atomically (a private file renamed into place); a failure only costs the next session a decode."""
    payload = pickle.dumps(traces, protocol=pickle.HIGHEST_PROTOCOL)
    header = _DECODED_MAGIC + f"{key}\n{hashlib.sha256(payload).hexdigest()}\n".encode("ascii")
    try:
        handle, scratch = tempfile.mkstemp(prefix=".tmp-decoded-", dir=path.parent)
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(header)
                file.write(payload)
            os.replace(scratch, path)
        except BaseException:
            Path(scratch).unlink(missing_ok=True)
            raise
    except OSError as error:  # the entry was discarded meanwhile, or the disk is full
        log.warning("trace cache: could not keep the decoded traces in %s: %s", path, error)


def cached_decoded(entry: ModelEntry, *, max_len: int | None = None) -> tuple[ItfTrace, ...]:
    """The model's edge-cover traces decoded (:class:`TraceLoader`), in file order, from the entry's pickle
    or from its ITF files (then pickled for the next session). Each trace's ``path`` is its file's."""
    traces, _ = cached_cover(entry, max_len=max_len)
    directory = traces.files[0].parent.parent if traces.files else None
    if directory is None:
        return ()
    key = _decoder_key(directory)
    decoded = _read_decoded(directory / _DECODED, key)
    if decoded is not None and len(decoded) == len(traces.files):
        return tuple(dataclasses.replace(trace, path=path) for trace, path in zip(decoded, traces.files))
    loader = TraceLoader()
    decoded = [loader.load(path) for path in traces.files]
    _write_decoded(directory / _DECODED, key, decoded)
    return tuple(decoded)
