"""`deferdump mro` end to end: JSON shape, the rich table, exit codes, one-line errors for bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import deferdump.reference.connectors as reference_connectors
from support import FIXTURES as ALL_FIXTURES

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

FIXTURES = ALL_FIXTURES / "mro"
REFERENCE = Path(reference_connectors.__file__)


def _mro(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deferdump.tools.cli.app", "mro", *args], capture_output=True, text=True, timeout=900
    )


def test_json_on_the_reference_connector_has_the_documented_shape() -> None:
    out = _mro(str(REFERENCE), "--json", "--class", "CPConnector")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert set(report) == {"classes", "connectors", "imported_bases"}
    assert report["imported_bases"] == []  # the reference connector defines its bases in the file
    assert all(set(entry) == {"bases", "mro", "defines"} for entry in report["classes"].values())
    assert report["classes"]["CPConnector"]["mro"] == ["CPConnector", "LayerWiseConnector", "DirectConnector", "object"]
    assert report["classes"]["LayerWiseConnector"]["bases"] == ["DirectConnector"]
    assert "build_connector_meta" not in report["classes"]["CPConnector"]["defines"]
    assert list(report["connectors"]) == ["CPConnector"]
    cp = report["connectors"]["CPConnector"]
    assert set(cp) == {"resolves", "verdict", "violated", "context", "cases", "source"}
    assert cp["source"] == "reading"
    # every case vLLM can run it in, each with its own verdict (the class verdict is the worst)
    assert {key: case["verdict"] for key, case in cp["cases"].items()} == {
        "single": "safe", "multi": "safe", "hybrid": "safe", "mla": "safe", "layerwise": "safe"
    }
    # not SupportsHMA (the core classes; the vLLM adapter is): its sliding-window case is a model whose every
    # layer is sliding-window, on the non-HMA path, and the fence (wait_freed) covers it
    assert cp["cases"]["hybrid"]["path"] == "non_hma"
    assert cp["cases"]["layerwise"]["case"] == "layerwise" and cp["cases"]["multi"]["path"] == "multi"
    assert cp["resolves"]["build_connector_meta"] == "DirectConnector"
    assert cp["resolves"]["wait_for_save"] == "CPConnector"
    assert (cp["verdict"], cp["violated"], cp["context"]) == ("safe", None, None)


def test_table_output_and_exit_status_for_an_unsafe_connector() -> None:
    out = _mro(str(FIXTURES / "override_no_super.py"), "--class", "LoggingConnector")
    assert out.returncode == 1, out.stderr
    assert "LoggingConnector" in out.stdout and "unsafe" in out.stdout
    assert "TrackingConnector -> KVConnectorBase_V1" in " ".join(out.stdout.split())
    assert "non-HMA path" in out.stdout


@pytest.mark.parametrize(
    ("fixture", "message"),
    [
        ("syntax_error.py", "syntax_error.py:6: syntax error"),
        ("no_connectors.py", "no connector classes"),
        ("inconsistent.py", "Cannot create a consistent method resolution order (MRO) for bases Direct, LayerWise"),
        ("missing.py", "cannot read"),
    ],
)
def test_bad_input_gives_one_line_and_no_traceback(fixture: str, message: str) -> None:
    out = _mro(str(FIXTURES / fixture), "--json")
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in out.stderr


def test_a_folder_is_judged_as_the_python_files_below_it(tmp_path: Path) -> None:
    """A connector package is named by its folder: every ``*.py`` below it, none from ``__pycache__`` or hidden
    folders (a syntax error there would stop the run)."""
    package = tmp_path / "my_connector"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "conn.py").write_text((FIXTURES / "override_no_super.py").read_text())
    for junk in ("__pycache__", ".venv"):
        (package / junk).mkdir()
        (package / junk / "broken.py").write_text("class A(:\n")
    by_folder = _mro(str(package), "--class", "LoggingConnector", "--json")
    by_file = _mro(str(FIXTURES / "override_no_super.py"), "--class", "LoggingConnector", "--json")
    assert by_folder.returncode == by_file.returncode == 1, by_folder.stderr
    assert json.loads(by_folder.stdout)["connectors"] == json.loads(by_file.stdout)["connectors"]
    empty = tmp_path / "empty"
    (empty / "__pycache__").mkdir(parents=True)
    (empty / "__pycache__" / "conn.py").write_text("")
    out = _mro(str(empty))
    assert out.returncode == 2 and out.stderr.strip() == f"deferdump: {empty}: no Python files in this folder"


def test_unknown_class_selection_is_bad_input() -> None:
    out = _mro(str(FIXTURES / "super_skip.py"), "--class", "Nope")
    assert out.returncode == 2 and "not a connector class in the given files: Nope" in out.stderr


def test_unsafe_verdict_shows_its_counterexample_in_table_json_and_html(tmp_path: Path) -> None:
    fixture = str(FIXTURES / "ucm_independent_no_forward.py")
    table = _mro(fixture, "--class", "OuterStoreConnector", "--html", str(tmp_path))
    assert table.returncode == 1, table.stderr
    text = " ".join(table.stdout.split())
    assert "counterexample: NoUnexpectedReportInv violated, top level, HMA path" in text
    assert "build_connector_meta: dump" in text and "UNEXPECTED finished_sending" in text
    page = tmp_path / "OuterStoreConnector.html"
    assert page.is_file() and "NoUnexpectedReportInv" in page.read_text(encoding="utf-8")
    report = json.loads(_mro(fixture, "--class", "OuterStoreConnector", "--json").stdout)
    example = report["connectors"]["OuterStoreConnector"]["counterexample"]
    assert example["property"] == "NoUnexpectedReportInv"
    assert example["trace"][0]["action"] is None  # the initial state, as `deferdump check --json` writes it
    assert {"action", "state"} == set(example["trace"][-1]) and "unexpectedReports" in example["trace"][-1]["state"]


def test_html_into_a_missing_directory_is_bad_input(tmp_path: Path) -> None:
    out = _mro(str(FIXTURES / "super_skip.py"), "--html", str(tmp_path / "nope"))
    assert out.returncode == 2 and "not a directory" in out.stderr and "Traceback" not in out.stderr
