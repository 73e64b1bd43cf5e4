"""Finding Java and the TLC jar: the pinned checksum, the TLA2TOOLS_JAR override, version checks."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from deferdump.tools.tlc import java
from deferdump.tools.tlc.java import (
    TLA2TOOLS_SHA256,
    JarChecksumMismatch,
    JarNotFound,
    JavaNotFound,
    JavaTooOld,
    find_jar,
    locate_tlc,
    parse_java_major,
)
from deferdump.tools.tlc.bridge import Status, run_tlc
from support import FIXTURES as ALL_FIXTURES

FIXTURES = ALL_FIXTURES / "tla"


def test_packaged_jar_matches_the_pin() -> None:
    jar, overridden = find_jar({})
    assert jar.name == "tla2tools.jar" and not overridden
    install = locate_tlc()
    assert install.java_major >= 11 and install.jar == jar


@pytest.mark.parametrize(("text", "major"), [
    ('openjdk version "17.0.15" 2025-04-15', 17),
    ('java version "1.8.0_292"', 8),
    ('openjdk version "11" 2018-09-25', 11),
])
def test_java_version_parsing(text: str, major: int) -> None:
    assert parse_java_major(text) == major


def test_missing_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(JavaNotFound, match="java not found on PATH: install a JRE >= 11"):
        run_tlc(FIXTURES / "Counter.tla")


def test_old_java_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "java"
    fake.write_text('#!/bin/sh\necho \'java version "1.8.0_292"\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(JavaTooOld, match="is Java 8; TLC needs Java >= 11"):
        locate_tlc()


def test_corrupted_jar_fails_the_checksum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corrupted = tmp_path / "tla2tools.jar"
    shutil.copyfile(find_jar({})[0], corrupted)
    with corrupted.open("ab") as stream:
        stream.write(b"\0")
    monkeypatch.setattr(java, "_packaged_jar", lambda: corrupted)
    monkeypatch.delenv("TLA2TOOLS_JAR", raising=False)
    with pytest.raises(JarChecksumMismatch, match=f"expected {TLA2TOOLS_SHA256}"):
        run_tlc(FIXTURES / "Counter.tla")


def test_override_skips_the_checksum_and_logs_the_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    copy = tmp_path / "other.jar"
    shutil.copyfile(find_jar({})[0], copy)
    monkeypatch.setenv("TLA2TOOLS_JAR", str(copy))
    with caplog.at_level(logging.INFO, logger="deferdump.tools"):
        result = run_tlc(FIXTURES / "Counter.tla")
    assert result.status is Status.PASS and str(copy) in result.command
    assert any(r.getMessage().startswith("TLC version: TLC2 Version 2.15") for r in caplog.records)
    monkeypatch.setenv("TLA2TOOLS_JAR", str(tmp_path / "missing.jar"))
    with pytest.raises(JarNotFound, match="missing.jar is not a file"):
        locate_tlc()


def test_small_models_start_on_c1_and_large_or_unknown_ones_keep_the_tiered_compiler() -> None:
    assert java.jit_args(14) == java.QUICK_JIT == ("-XX:TieredStopAtLevel=1",)
    assert java.jit_args(java.QUICK_JIT_MAX_STATES) == java.QUICK_JIT
    assert java.jit_args(java.QUICK_JIT_MAX_STATES + 1) == ()
    assert java.jit_args(None) == ()
    quick = run_tlc(FIXTURES / "Counter.tla", expected_states=10)
    default = run_tlc(FIXTURES / "Counter.tla")
    assert "-XX:TieredStopAtLevel=1" in quick.command and "-XX:TieredStopAtLevel=1" not in default.command
    assert quick.status is default.status is Status.PASS
    assert (quick.distinct_states, quick.generated_states) == (default.distinct_states, default.generated_states)


def test_a_manifest_check_passes_its_recorded_size_to_the_jit_choice() -> None:
    from deferdump.tools.tlc.manifest import check_model, load_manifest

    entry = min((e for e in load_manifest().models if e.tier == "ci" and e.expect.passes),
                key=lambda e: e.distinct_states or 0)  # the smallest: the wiring, not the model, is under test
    outcome = check_model(entry)
    assert outcome.expected_ok, outcome.mismatches
    assert ("-XX:TieredStopAtLevel=1" in outcome.result.command) == (entry.distinct_states <= java.QUICK_JIT_MAX_STATES)
