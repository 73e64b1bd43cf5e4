"""Connectors built on classes imported from elsewhere (vLLM's shipped connectors, a package's own base connector):
`deferdump mro` finds the base's source as Python would (the file's folder, --import-root, a folder above the file
named as the package, the running Python's packages) and reads it; where it finds none the subclass is still a
connector, judged `unknown` with the base named, never passed over as "no connector classes"."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from deferdump.tools.mro.imported_bases import imported_base_files
from deferdump.tools.mro.judge import ModelRunner, judge_files
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES

HERE = FIXTURES / "mro" / "imported_bases"
SITE = HERE / "site"
USER = HERE / "user" / "on_shipped.py"
RUNNER = ModelRunner(ModelBounds(), timeout=300)


def test_a_subclass_is_read_with_its_imported_base_through_a_package_reexport() -> None:
    followed, bases = imported_base_files([USER], [SITE])
    assert [p.name for p in followed] == ["synchronous.py", "deferred.py"]
    assert {b.name: b.module for b in bases} == {"SyncShippedConnector": "shippedkv",
                                                 "DeferredShippedConnector": "shippedkv"}


def test_with_the_base_read_an_inherited_synchronous_save_is_safe() -> None:
    """`CountingSync` overrides only build_connector_meta (calling super): the save it runs is the shipped one,
    which waits its dump in the call. Without the base's source it could not be anything but unknown."""
    read = judge_files([USER], only=["CountingSync"], runner=RUNNER, import_roots=[SITE])
    assert read.connectors["CountingSync"].verdict == "safe"
    assert read.connectors["CountingSync"].resolves["wait_for_save"] == "SyncShippedConnector"
    unread = judge_files([USER], only=["CountingSync"], runner=RUNNER)
    judgement = unread.connectors["CountingSync"]
    assert judgement.verdict == "unknown"
    assert any("SyncShippedConnector is imported, not analysed" in r for r in judgement.reasons), judgement.reasons
    assert [b.why for b in unread.imported_bases if b.name == "SyncShippedConnector"][0].startswith("no source file")


def test_overrides_that_drop_the_shipped_wait_are_never_called_safe() -> None:
    report = judge_files([USER], only=["FireAndForgetSync", "EagerReportDeferred"], runner=RUNNER,
                         import_roots=[SITE])
    assert {n: j.verdict for n, j in report.connectors.items()} == {"FireAndForgetSync": "unknown",
                                                                    "EagerReportDeferred": "unknown"}
    assert report.connectors["EagerReportDeferred"].resolves["request_finished"] == "DeferredShippedConnector"


def test_a_relative_import_reads_the_sibling_module() -> None:
    path = SITE / "shippedkv" / "connectors" / "local_sub.py"
    followed, _ = imported_base_files([path])
    assert [p.name for p in followed] == ["synchronous.py"]
    report = judge_files([path], runner=RUNNER)
    assert list(report.connectors) == ["LocalFireAndForget"]  # the base's own class is read, not judged
    assert report.connectors["LocalFireAndForget"].verdict != "safe"


def test_a_package_import_from_inside_its_source_tree_is_found_without_roots(tmp_path: Path) -> None:
    """`from shippedkv.connectors.synchronous import …` in a file inside the shippedkv folder: Python would find the
    package once installed; the reader finds it from the folder named as the package above the file."""
    inner = tmp_path / "shippedkv" / "extra"
    inner.mkdir(parents=True)
    (tmp_path / "shippedkv" / "__init__.py").write_text("", encoding="utf-8")
    (inner / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "shippedkv" / "base_conn.py").write_text(
        (SITE / "shippedkv" / "connectors" / "synchronous.py").read_text(encoding="utf-8"), encoding="utf-8")
    sub = inner / "sub.py"
    sub.write_text("from shippedkv.base_conn import SyncShippedConnector\n\n\n"
                   "class Sub(SyncShippedConnector):\n    pass\n", encoding="utf-8")
    followed, _ = imported_base_files([sub])
    assert followed == [tmp_path / "shippedkv" / "base_conn.py"]


def test_a_base_file_that_redefines_a_name_of_the_given_files_is_not_read(tmp_path: Path) -> None:
    """Which class a name means would depend on imports the reader does not resolve: the base stays unread."""
    sub = tmp_path / "mine.py"
    sub.write_text("from shippedkv import SyncShippedConnector\n\n\nclass SyncSaveMeta:\n    pass\n\n\n"
                   "class Mine(SyncShippedConnector):\n    pass\n", encoding="utf-8")
    followed, bases = imported_base_files([sub], [SITE])
    assert followed == [] and "defines SyncSaveMeta" in bases[0].why
    report = judge_files([sub], runner=RUNNER, import_roots=[SITE])
    assert report.connectors["Mine"].verdict == "unknown"


def test_helpers_deriving_from_other_libraries_do_not_pull_their_sources_in(tmp_path: Path) -> None:
    """A helper (no connector method, no `…Connector` base) deriving from a class of another installed package:
    its base is not followed (pytest's sources stand in for torch's)."""
    helper = tmp_path / "helper.py"
    helper.write_text("from _pytest.main import Session\n\n\nclass Pool(Session):\n    def shutdown(self):\n"
                      "        pass\n", encoding="utf-8")
    assert imported_base_files([helper]) == ([], [])


def test_a_connector_on_an_unreadable_base_is_judged_unknown_not_passed_over(tmp_path: Path) -> None:
    """Before, `class Mine(ExampleConnector)` without vLLM's sources was "no connector classes" (exit 2)."""
    path = tmp_path / "on_example.py"
    path.write_text("from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector\n\n\n"
                    "class Mine(ExampleConnector):\n    def wait_for_save(self):\n        return None\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "deferdump.tools.cli.app", "mro", str(path), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-500:]
    out = json.loads(done.stdout)
    assert out["connectors"]["Mine"]["verdict"] == "unknown"
    assert out["imported_bases"][0]["name"] == "ExampleConnector" and out["imported_bases"][0]["read"] is None


def test_cli_reports_where_each_base_was_read_and_refuses_a_missing_root(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "deferdump.tools.cli.app", "mro", str(USER), "--class", "CountingSync",
                           "--import-root", str(SITE)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-800:] + done.stderr[-800:]
    assert "base SyncShippedConnector (imported from shippedkv" in " ".join(done.stdout.split())
    assert "SyncSaveMeta" not in done.stdout  # the base file's classes are read, not listed
    bad = subprocess.run([sys.executable, "-m", "deferdump.tools.cli.app", "mro", str(USER), "--import-root",
                          str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "not a directory" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_run_says_why_a_base_outside_the_files_folders_cannot_be_imported() -> None:
    """--run imports the given files' folders only: a base from an import root is not importable there, and the
    reading verdict stands with the reason."""
    from deferdump.tools.mro.run.runner import run_report
    name = "CountingSync"
    report = judge_files([USER], only=[name], runner=RUNNER, import_roots=[SITE])
    ran = run_report(report, [USER], ["blockstore_client"], 60)
    judgement = ran.connectors[name]
    assert judgement.verdict == "safe"
    assert all(j.run is None or "No module named 'shippedkv'" in j.run.detail for j in judgement.judgements)
