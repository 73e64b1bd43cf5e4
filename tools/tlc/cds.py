"""A class-data-sharing (CDS) archive of TLC's classes, shared by every TLC JVM deferdump starts.

Each TLC run is one JVM, and a small model's run spends most of its CPU time before the search, a fair
part of it loading and verifying ``tla2tools.jar``'s classes. Java >= 13 dumps the classes a run loaded
into a dynamic archive at exit (``-XX:ArchiveClassesAtExit``) and maps it at start
(``-XX:SharedArchiveFile``). CDS changes class loading only, never TLC's results.

The archive lives in a per-user cache directory, its name keyed by everything that invalidates it (the
java executable's real path and version text, the jar's path, size, mtime and SHA-256). The first run
without one writes it under a unique temporary name, and :meth:`CdsPlan.finish` renames it into place
only after a clean TLC run, so concurrent runs never map a half-written file. ``-Xshare:auto`` falls back
to plain class loading when an archive is stale or foreign, and ``-Xlog:cds*=off`` keeps the JVM's CDS
warnings (e.g. "Pre JDK 6 class not supported by CDS", "Unable to use shared archive") off the output
the bridge parses. Anything that goes wrong here runs TLC without CDS instead of failing the run.
"""
from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deferdump.tools.tlc.java import TlcInstall, jar_sha256

log = logging.getLogger(__name__)

CDS_ENV = "DEFERDUMP_TLC_CDS"
"""``0`` (or ``false``/``no``/``off``) runs every TLC JVM without the archive."""
CACHE_ENV = "DEFERDUMP_CACHE_DIR"
"""Where the archive lives; default ``$XDG_CACHE_HOME/deferdump``, else ``~/.cache/deferdump``."""
MIN_CDS_JAVA = 13
"""Dynamic archives (``-XX:ArchiveClassesAtExit``) exist from JDK 13 on."""
SILENT = ("-Xshare:auto", "-Xlog:cds*=off")
"""Share when the archive is usable, else load classes normally; print nothing about it either way."""
STALE_LOCK_S = 600.0
"""A creator's lock or temporary file older than this is left over from a killed run."""
KEEP_ARCHIVES = 8
"""Archives kept per cache directory (most recently used first): each is about 10 MB, and every new jar
path (another virtual environment, a test's copy of the jar) or Java build gets its own."""
_OFF_VALUES = frozenset({"0", "false", "no", "off"})
_CALLER_CDS_FLAGS = ("-Xshare", "-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit")

_refused: set[str] = set()
"""Real paths of java executables that refused to start with CDS flags in this process."""


class Mode(str, enum.Enum):
    """What one run does with the archive."""

    OFF = "off"
    USE = "use"
    CREATE = "create"


@dataclass
class CdsPlan:
    """The CDS flags for one TLC run and the archive bookkeeping after it."""

    mode: Mode
    args: tuple[str, ...] = ()
    archive: Path | None = None
    java: str = ""  # real path of the java executable
    writing: Path | None = None  # CREATE: the temporary file the JVM writes at exit
    lock: Path | None = None  # CREATE: this run's creator lock

    def finish(self, completed: bool) -> None:
        """After the JVM exited: keep the written archive if ``completed`` (TLC ran its search), else drop it."""
        if self.mode is not Mode.CREATE or self.writing is None or self.archive is None:
            return
        try:
            if completed and self.writing.is_file() and self.writing.stat().st_size > 0:
                os.replace(self.writing, self.archive)
                log.debug("wrote the TLC class-data-sharing archive %s", self.archive)
                prune(self.archive.parent)
            else:
                if completed:  # a clean run wrote nothing: this JVM cannot dump, do not try again
                    _refused.add(self.java)
                    log.debug("%s wrote no CDS archive; TLC runs without one from now on", self.java)
                self.writing.unlink(missing_ok=True)
        except OSError as error:
            log.debug("cannot keep the CDS archive %s: %s", self.archive, error)
            _unlink_quietly(self.writing)
        finally:
            self._release()

    def abandon(self) -> None:
        """The JVM died before TLC started while CDS flags were on: never let these flags fail a run again."""
        if self.mode is Mode.USE and self.archive is not None:
            log.debug("the JVM failed to start with the CDS archive %s: removing it", self.archive)
            _unlink_quietly(self.archive)  # e.g. a truncated archive makes the JVM die of SIGBUS
        elif self.mode is Mode.CREATE:
            log.debug("%s refused the CDS flags; TLC runs without CDS from now on", self.java)
            _refused.add(self.java)
            if self.writing is not None:
                _unlink_quietly(self.writing)
            self._release()

    def _release(self) -> None:
        if self.lock is not None:
            _unlink_quietly(self.lock)
            self.lock = None


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        log.debug("cannot remove %s: %s", path, error)


def prune(directory: Path, keep: int = KEEP_ARCHIVES) -> None:
    """Remove all but the ``keep`` most recently used archives, and temporary files of killed creators.

    A run mapping an archive that is removed meanwhile keeps its mapping; one that starts just after finds
    no file, and ``-Xshare:auto`` runs it without sharing.
    """
    now = time.time()
    archives: list[tuple[float, Path]] = []
    try:
        paths = list(directory.glob("tlc-java*.jsa*"))
    except OSError as error:
        log.debug("cannot prune the CDS cache %s: %s", directory, error)
        return
    for path in paths:
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue  # removed meanwhile by another run
        if path.suffix == ".jsa":
            archives.append((mtime, path))
        elif path.suffix == ".tmp" and now - mtime > STALE_LOCK_S:
            _unlink_quietly(path)
    for _, path in sorted(archives, reverse=True)[keep:]:
        log.debug("removing the least recently used CDS archive %s", path)
        _unlink_quietly(path)


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when ``DEFERDUMP_TLC_CDS`` turns the archive off."""
    env = os.environ if environ is None else environ
    return env.get(CDS_ENV, "1").strip().lower() not in _OFF_VALUES


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$DEFERDUMP_CACHE_DIR``, else ``$XDG_CACHE_HOME/deferdump``, else ``~/.cache/deferdump``."""
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "deferdump"
    return Path.home() / ".cache" / "deferdump"


def archive_name(install: TlcInstall) -> str:
    """File name keyed by the java executable (real path, version text) and the jar (path, size, mtime, SHA-256).

    The JVM itself rejects an archive whose jar changed size or mtime, or that another JVM build wrote;
    a new name for each such change lets the next run write a fresh archive instead of never sharing.
    """
    java = os.path.realpath(install.java)
    jar = Path(os.path.realpath(install.jar))
    stat = jar.stat()
    key = json.dumps({
        "java": java, "java_version": install.java_version, "jar": str(jar), "jar_size": stat.st_size,
        "jar_mtime_ns": stat.st_mtime_ns, "jar_sha256": jar_sha256(jar),
    }, sort_keys=True)
    return f"tlc-java{install.java_major}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.jsa"


def _take_lock(lock: Path) -> bool:
    """Create ``lock`` exclusively (taking over one older than :data:`STALE_LOCK_S`); never wait for it."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:
                continue  # the creator just finished
            if age < STALE_LOCK_S:
                return False
            log.debug("taking over the stale CDS lock %s (%.0f s old)", lock, age)
            _unlink_quietly(lock)
            continue
        with os.fdopen(fd, "w") as stream:
            stream.write(f"{os.getpid()}\n")
        return True
    return False


def plan(install: TlcInstall, jvm_args: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> CdsPlan:
    """The CDS flags for the next TLC run: use the archive, write it, or (if anything is amiss) none."""
    if not enabled(environ):
        return CdsPlan(Mode.OFF)
    if install.java_major < MIN_CDS_JAVA:
        log.debug("Java %d has no dynamic CDS archives: TLC runs without one", install.java_major)
        return CdsPlan(Mode.OFF)
    if any(arg.startswith(_CALLER_CDS_FLAGS) for arg in jvm_args):
        return CdsPlan(Mode.OFF)  # the caller chose its own sharing flags
    java = os.path.realpath(install.java)
    if java in _refused:
        return CdsPlan(Mode.OFF)
    try:
        directory = cache_dir(environ)
        archive = directory / archive_name(install)
        if archive.is_file():
            try:
                os.utime(archive)  # most recently used: the last one :func:`prune` removes
            except OSError as error:  # e.g. another user's archive in a shared cache directory
                log.debug("cannot mark %s as used: %s", archive, error)
            return CdsPlan(Mode.USE, (*SILENT, f"-XX:SharedArchiveFile={archive}"), archive, java)
        directory.mkdir(parents=True, exist_ok=True)
        lock = archive.with_name(archive.name + ".lock")
        if not _take_lock(lock):
            log.debug("another run is writing %s: this one runs without CDS", archive)
            return CdsPlan(Mode.OFF)
    except OSError as error:
        log.debug("no CDS archive (cache directory unusable: %s)", error)
        return CdsPlan(Mode.OFF)
    writing = archive.with_name(f"{archive.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    return CdsPlan(Mode.CREATE, (*SILENT, f"-XX:ArchiveClassesAtExit={writing}"), archive, java, writing, lock)
