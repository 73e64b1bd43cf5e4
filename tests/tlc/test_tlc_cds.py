"""The class-data-sharing archive of TLC's classes: written by the first run, used by the next, never a failure.

Every test runs real TLC JVMs on a fixture model with a private cache directory (``DEFERDUMP_CACHE_DIR``).
"""
from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from deferdump.tools.tlc import cds
from deferdump.tools.tlc.bridge import Status, TlcResult, run_tlc
from deferdump.tools.tlc.java import locate_tlc
from support import FIXTURES as ALL_FIXTURES

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

FIXTURES = ALL_FIXTURES / "tla"
COUNTER = FIXTURES / "Counter.tla"  # 9 distinct states, 14 generated, depth 5


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache directory, CDS switched on, and no JVM remembered as refusing CDS."""
    directory = tmp_path / "cache"
    monkeypatch.setenv(cds.CACHE_ENV, str(directory))
    monkeypatch.delenv(cds.CDS_ENV, raising=False)
    monkeypatch.setattr(cds, "_refused", set())
    return directory


def archive_path(cache: Path) -> Path:
    return cache / cds.archive_name(locate_tlc())


def sharing_flags(result: TlcResult) -> list[str]:
    return [arg for arg in result.command if "Archive" in arg or arg.startswith(("-Xshare", "-Xlog:cds"))]


def assert_counter_passed(result: TlcResult) -> None:
    """Counter's verdict and counts, and no JVM log line (``[0.1s][warning][cds] ...``) in the parsed output."""
    assert (result.status, result.distinct_states, result.generated_states, result.depth) == (Status.PASS, 9, 14, 5)
    assert result.exit_code == 0
    assert not [line for line in result.output.splitlines() if line.startswith("[")]


def test_first_run_writes_the_archive_and_the_second_maps_tlc_classes_from_it(cache: Path, tmp_path: Path) -> None:
    archive = archive_path(cache)
    first = run_tlc(COUNTER)
    assert_counter_passed(first)
    assert any(arg.startswith("-XX:ArchiveClassesAtExit=") for arg in first.command)
    assert archive.is_file() and archive.stat().st_size > 0
    assert sorted(path.name for path in cache.iterdir()) == [archive.name]  # no temp file, no lock left

    load_log = tmp_path / "class-load.log"
    second = run_tlc(COUNTER, jvm_args=[f"-Xlog:class+load=info:file={load_log}"])
    assert_counter_passed(second)
    assert f"-XX:SharedArchiveFile={archive}" in second.command
    assert "tlc2.TLC source: shared objects file (top)" in load_log.read_text()


def test_a_violation_run_writes_the_archive_without_changing_its_verdict(cache: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    deadlock = FIXTURES / "Deadlock.tla"
    monkeypatch.setenv(cds.CDS_ENV, "0")
    plain = run_tlc(deadlock)
    monkeypatch.delenv(cds.CDS_ENV)
    writing = run_tlc(deadlock)
    assert any(arg.startswith("-XX:ArchiveClassesAtExit=") for arg in writing.command)
    assert archive_path(cache).is_file()
    using = run_tlc(deadlock)
    assert any(arg.startswith("-XX:SharedArchiveFile=") for arg in using.command)
    for result in (writing, using):
        assert (result.status, result.kind, result.exit_code, result.distinct_states, len(result.trace)) == (
            plain.status, plain.kind, plain.exit_code, plain.distinct_states, len(plain.trace))


def test_garbage_at_the_archive_path_still_gives_the_right_result(cache: Path) -> None:
    archive = archive_path(cache)
    cache.mkdir(parents=True)
    archive.write_bytes(os.urandom(5000))
    result = run_tlc(COUNTER)
    assert f"-XX:SharedArchiveFile={archive}" in result.command  # -Xshare:auto ignores it, silently
    assert_counter_passed(result)


def test_a_truncated_archive_crashes_the_jvm_so_the_run_is_repeated_without_it(cache: Path, tmp_path: Path) -> None:
    archive = archive_path(cache)
    run_tlc(COUNTER)
    whole = archive.read_bytes()
    archive.chmod(0o644)
    archive.write_bytes(whole[:100_000])  # the JVM maps regions past the end of the file: SIGBUS at start

    kept = tmp_path / "run"
    result = run_tlc(COUNTER, keep_dir=kept)
    assert_counter_passed(result)
    assert sharing_flags(result) == []  # the repeated run, without CDS
    assert not archive.exists()  # the damaged archive is gone...
    assert not list(kept.glob("hs_err_pid*.log"))  # ...and so is the JVM's crash report

    again = run_tlc(COUNTER)  # ...and the next run writes a good one
    assert any(arg.startswith("-XX:ArchiveClassesAtExit=") for arg in again.command)
    assert_counter_passed(again)
    assert archive.stat().st_size > 100_000  # whole again (its exact size varies from run to run)


def test_a_jvm_failing_for_another_reason_keeps_the_archive(cache: Path) -> None:
    archive = archive_path(cache)
    run_tlc(COUNTER)
    result = run_tlc(COUNTER, jvm_args=["-XX:+NoSuchDeferdumpOption"])  # fails with and without CDS
    assert result.status is Status.ERROR and result.exit_code not in (None, 0) and not result.messages
    assert "NoSuchDeferdumpOption" in result.output and sharing_flags(result) == []  # the run without CDS
    assert archive.is_file()  # not CDS's fault: the archive stays
    assert_counter_passed(run_tlc(COUNTER))


def test_concurrent_first_runs_leave_one_whole_archive(cache: Path) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: run_tlc(COUNTER), range(2)))
    for result in results:
        assert_counter_passed(result)
    writers = [r for r in results if any(arg.startswith("-XX:ArchiveClassesAtExit=") for arg in r.command)]
    assert len(writers) == 1  # the other run found the creator's lock and ran without CDS
    assert sorted(path.name for path in cache.iterdir()) == [archive_path(cache).name]


def test_a_new_archive_evicts_the_least_recently_used_ones_and_killed_creators_files(cache: Path) -> None:
    cache.mkdir(parents=True)
    long_ago = time.time() - cds.STALE_LOCK_S - 3600
    others = []
    for index in range(cds.KEEP_ARCHIVES):  # other jars' archives, index 0 used longest ago
        other = cache / f"tlc-java17-{index:024x}.jsa"
        other.write_bytes(b"another jar's archive")
        os.utime(other, (long_ago + index, long_ago + index))
        others.append(other)
    stale_tmp = cache / "tlc-java17-dead.jsa.999.0000.tmp"
    fresh_tmp = cache / "tlc-java17-busy.jsa.998.0000.tmp"  # a creator still running
    for tmp in (stale_tmp, fresh_tmp):
        tmp.write_bytes(b"half written")
    os.utime(stale_tmp, (long_ago, long_ago))

    assert_counter_passed(run_tlc(COUNTER))
    archive = archive_path(cache)
    assert archive.is_file() and not others[0].exists() and all(other.exists() for other in others[1:])
    assert not stale_tmp.exists() and fresh_tmp.exists()

    os.utime(archive, (long_ago - 60, long_ago - 60))
    assert_counter_passed(run_tlc(COUNTER))
    assert archive.stat().st_mtime > time.time() - 3600  # using it marks it recently used


def test_an_unusable_cache_directory_runs_without_cds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(cds.CACHE_ENV, str(blocker / "cache"))  # mkdir fails, even for root
    result = run_tlc(COUNTER)
    assert_counter_passed(result)
    assert sharing_flags(result) == []


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_the_environment_switch_turns_cds_off(cache: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(cds.CDS_ENV, value)
    result = run_tlc(COUNTER)
    assert_counter_passed(result)
    assert sharing_flags(result) == []
    assert not cache.exists()


def test_a_run_does_not_wait_for_another_creator_but_takes_over_a_stale_lock(cache: Path) -> None:
    archive = archive_path(cache)
    cache.mkdir(parents=True)
    lock = archive.with_name(archive.name + ".lock")
    lock.write_text("12345\n")
    busy = run_tlc(COUNTER)
    assert_counter_passed(busy)
    assert sharing_flags(busy) == [] and not archive.exists() and lock.exists()

    old = time.time() - cds.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    taken = run_tlc(COUNTER)
    assert_counter_passed(taken)
    assert any(arg.startswith("-XX:ArchiveClassesAtExit=") for arg in taken.command)
    assert archive.is_file() and not lock.exists()


def test_a_jvm_refusing_the_cds_flags_runs_tlc_without_them(cache: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    real_java = shutil.which("java")
    assert real_java is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "java"  # a JVM without dynamic archives answers as HotSpot does to an unknown -XX option
    fake.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do case "$arg" in -XX:ArchiveClassesAtExit=*|-XX:SharedArchiveFile=*)\n'
        '  echo "Unrecognized VM option \'${arg#-XX:}\'"\n'
        '  echo "Error: Could not create the Java Virtual Machine."\n'
        "  exit 1;; esac; done\n"
        f'exec {real_java} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    first = run_tlc(COUNTER)
    assert_counter_passed(first)
    assert sharing_flags(first) == []  # the repeated run
    assert not cache.exists() or not list(cache.iterdir())  # no archive, temp file or lock left
    later = run_tlc(COUNTER)
    assert_counter_passed(later)
    assert sharing_flags(later) == []  # remembered: no second failed start


def test_cache_directory_precedence(tmp_path: Path) -> None:
    assert cds.cache_dir({cds.CACHE_ENV: str(tmp_path), "XDG_CACHE_HOME": "/x"}) == tmp_path
    assert cds.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "deferdump"
    assert cds.cache_dir({}) == Path.home() / ".cache" / "deferdump"


def test_the_archive_name_changes_with_the_jar_and_the_java(tmp_path: Path) -> None:
    install = locate_tlc()
    jar = tmp_path / "tla2tools.jar"
    shutil.copyfile(install.jar, jar)
    copied = type(install)(install.java, install.java_major, jar, True, install.java_version)
    name = cds.archive_name(copied)
    assert name.startswith(f"tlc-java{install.java_major}-") and name.endswith(".jsa")
    assert cds.archive_name(copied) == name
    assert cds.archive_name(install) != name  # another jar path
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 1_000_000_000))
    touched = cds.archive_name(copied)
    assert touched != name  # the JVM rejects an archive whose jar's mtime changed
    other_java = type(install)(install.java, install.java_major, jar, True, install.java_version + " (other build)")
    assert cds.archive_name(other_java) != touched
