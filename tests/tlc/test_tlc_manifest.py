"""The manifest schema and the comparison of TLC results with a model's expectations (no JVM needed)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deferdump.tools.tlc.bridge import Kind, Status, TlcResult
from deferdump.tools.tlc.cfg import strip_comments
from deferdump.tools.tlc.manifest import Expectation, ManifestError, UnknownModel, compare, load_manifest


def _write(tmp_path: Path, models: list[dict[str, object]]) -> Path:
    (tmp_path / "M.tla").write_text("---- MODULE M ----\n====\n")
    (tmp_path / "M.cfg").write_text("")
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"models": models}))
    return path


def _model(**changes: object) -> dict[str, object]:
    model: dict[str, object] = {"name": "A", "module": "M", "config": "M.cfg", "tier": "ci", "variant": "CP",
                                "expect": "pass", "distinct_states": 5, "mutant": False, "conformance": True}
    model.update(changes)
    return model


def test_loads_entries_and_selects_by_name_and_tier(tmp_path: Path) -> None:
    manifest = load_manifest(_write(tmp_path, [
        _model(), _model(name="B", tier="deep", expect={"violation": "XInv"}, distinct_states=None, workers=2,
                         module="M.tla", config="M"),
    ]))
    a, b = manifest.models
    assert (a.module_path, a.config_path, a.expect, a.workers) == (tmp_path / "M.tla", tmp_path / "M.cfg",
                                                                   Expectation(), 1)
    assert (b.module, b.config, b.expect.violation, b.workers) == ("M", "M.cfg", "XInv", 2)
    assert [e.name for e in manifest.select(tier="deep")] == ["B"]
    assert [e.name for e in manifest.select(["B", "A"])] == ["B", "A"]
    with pytest.raises(ManifestError, match="models not in tier ci: B"):
        manifest.select(["B"], tier="ci")
    with pytest.raises(UnknownModel, match="unknown model 'C' .*lists: A, B"):
        manifest.get("C")


@pytest.mark.parametrize(("change", "fragment"), [
    ({"tier": "nightly"}, "model 'A': 'tier' must be one of ci, deep, sim, not 'nightly'"),
    ({"tier": "sim", "distinct_states": 5}, "'distinct_states' must be null in tier sim"),
    ({"sim_batch": 0}, "'sim_batch' must be a positive integer, not 0"),
    ({"sim_batch": "20"}, "'sim_batch' must be a positive integer"),
    ({"variant": "Multi"}, "'variant' must be one of Direct, LayerWise, CP"),
    ({"expect": "fail"}, "'expect' must be \"pass\" or"),
    ({"expect": {"violation": ""}}, "'expect' must be"),
    ({"distinct_states": 0}, "'distinct_states' must be a positive integer or null"),
    ({"mutant": "no"}, "'mutant' must be true or false"),
    ({"module": "Missing"}, "module file"),
    ({"config": "Missing.cfg"}, "config file"),
    ({"distinct": 5}, "unknown keys: distinct"),
    ({"workers": 0}, "'workers' must be a positive integer"),
    ({"reproduces": "vllm#52360", "row": "P1", "expect": {"violation": "XInv"}}, "'reproduces' must be a thread"),
    ({"reproduces": 52360, "row": "P1", "expect": {"violation": "XInv"}}, "'reproduces' must be a thread"),
    ({"reproduces": "vllm-project/vllm#52360", "row": "Q1", "expect": {"violation": "XInv"}}, "'row' must be"),
    ({"reproduces": "vllm-project/vllm#52360", "row": "P0", "expect": {"violation": "XInv"}}, "'row' must be"),
    ({"reproduces": "vllm-project/vllm#52360", "expect": {"violation": "XInv"}}, "'reproduces' and 'row' go together"),
    ({"row": "P1", "expect": {"violation": "XInv"}}, "'reproduces' and 'row' go together"),
    ({"reproduces": "vllm-project/vllm#52360", "row": "P1"}, "must expect the violation"),
])
def test_schema_errors_name_model_and_key(tmp_path: Path, change: dict[str, object], fragment: str) -> None:
    with pytest.raises(ManifestError) as raised:
        load_manifest(_write(tmp_path, [_model(**change)]))
    assert fragment in str(raised.value)
    assert str(raised.value).startswith(str(tmp_path / "manifest.json"))


def test_reproduces_and_row_are_read(tmp_path: Path) -> None:
    manifest = load_manifest(_write(tmp_path, [
        _model(), _model(name="B", expect={"violation": "XInv"}, mutant=True,
                         reproduces="ModelEngine-Group/unified-cache-management#989", row="P4")]))
    a, b = manifest.models
    assert (a.reproduces, a.row) == (None, None)
    assert (b.reproduces, b.row) == ("ModelEngine-Group/unified-cache-management#989", "P4")


def test_structural_errors(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="listed twice"):
        load_manifest(_write(tmp_path, [_model(), _model()]))
    with pytest.raises(ManifestError, match="missing keys: conformance"):
        load_manifest(_write(tmp_path, [{k: v for k, v in _model().items() if k != "conformance"}]))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ManifestError, match="bad JSON at line 1"):
        load_manifest(tmp_path / "bad.json")
    with pytest.raises(ManifestError, match="manifest not found"):
        load_manifest(tmp_path / "none.json")


def test_shipped_manifest_is_valid() -> None:
    manifest = load_manifest()
    assert manifest.path.name == "manifest.json"


def _result(status: Status, kind: Kind | None, prop: str | None, distinct: int | None) -> TlcResult:
    return TlcResult(status=status, kind=kind, property=prop, distinct_states=distinct, generated_states=None,
                     depth=None, seconds=0.0, trace=[], loop_index=None, message=None, exit_code=0,
                     spec=Path("M.tla"), config=None)


def test_compare() -> None:
    passing = _result(Status.PASS, None, None, 5)
    assert compare(Expectation(), 5, passing) == []
    assert compare(Expectation(), 6, passing) == [
        "distinct states 5, manifest says 6 (the model changed: review, then update the manifest)"]
    assert compare(Expectation("XInv"), None, passing) == ["expected violation of XInv, got pass"]
    violated = _result(Status.VIOLATION, Kind.INVARIANT, "XInv", 3)
    assert compare(Expectation("XInv"), None, violated) == []
    assert compare(Expectation("YInv"), None, violated) == [
        "expected violation of YInv, got violation of XInv (invariant)"]
    assert compare(Expectation("Deadlock"), None, _result(Status.VIOLATION, Kind.DEADLOCK, None, 3)) == []
    unnamed = _result(Status.VIOLATION, Kind.LIVENESS, None, 3)
    assert "list exactly one PROPERTY" in compare(Expectation("LiveProp"), None, unnamed)[0]
    assert compare(Expectation(), 5, _result(Status.ERROR, Kind.TIMEOUT, None, 2)) == [
        "expected pass, got error (timeout)"]


# The switch each mutant turns on: a `Bugs` entry or the handle_preemptions label of its MC module.
MUTANT_SWITCHES = {
    "AggForwardsFirst": 'Bugs = {"agg_first"}',
    "RedoUntracked": 'Bugs = {"redo_untracked"}',
    "ShutdownKeepsHandles": 'Bugs = {"shutdown_no_release"}',
    "LookupSeesRunning": 'Bugs = {"lookup_sees_running"}',
    "PreemptLate": 'Bugs = {"preempt_late"}',
    "ExtraNotShipped": 'Bugs = {"extra_not_shipped"}',
    "CountNotForwarded": 'Bugs = {"count_not_forwarded"}',
    "RfagDelaysAll": 'Bugs = {"rfag_delays_all"}',
    "ReportLostOnError": 'Bugs = {"report_lost_on_error"}',
    "WaitOneSave": 'Bugs = {"wait_one_save"}',
    "IdleIgnoresDelayed": 'Bugs = {"idle_ignores_delayed"}',
    "PreemptFenced": 'Bugs = {"preempt_fenced"}',
    "FenceCountsEmpty": '"fence_counts_empty"}',
    "ReqIdReuse": 'Bugs = {"count_per_req"}',
    "SharedPrefixReadsInvalid": 'Bugs = {"sharer_reads_invalid"}',
    "SharedPrefixAllRecompute": 'Bugs = {"sharers_recompute"}',
}


CONTRACT_MODULE = "ConnectorContract"  # spec/ConnectorContract.tla: its own constants, no `action`, no `Bugs`


def test_every_ci_mutant_checks_the_property_it_names() -> None:
    """A mutant's cfg lists the invariant or property its expectation names, and a model that is no
    mutant turns no bug on."""
    for entry in load_manifest().models:
        if entry.tier != "ci":
            continue
        text = strip_comments(entry.config_path.read_text())
        if entry.mutant:
            assert re.search(rf"^\s*{entry.expect.violation}\s*$", text, flags=re.MULTILINE), entry.name
        elif entry.module != CONTRACT_MODULE:  # the contract's models have no bug switches
            assert re.search(r"^\s*Bugs = \{\}\s*$", text, flags=re.MULTILINE), entry.name


def test_models_whose_action_is_read_record_every_call() -> None:
    """`action` carries each step's connector calls only where something reads them: a conformance model's
    traces (replayed call by call) and a violation's counterexample (explain); a passing model records
    step names only, which checks faster."""
    for entry in load_manifest().models:
        if entry.module == CONTRACT_MODULE:
            continue  # no `action` history
        text = strip_comments(entry.config_path.read_text())
        wanted = "TRUE" if entry.conformance or not entry.expect.passes else "FALSE"
        assert re.search(rf"^\s*Record = {wanted}\s*$", text, flags=re.MULTILINE), entry.name


def test_bug_switch_mutants_turn_their_bug_on() -> None:
    models = {e.name: e for e in load_manifest().models}
    for name, switch in MUTANT_SWITCHES.items():
        assert models[name].mutant and switch in models[name].config_path.read_text(), name
    module = models["PreemptWaitsOneVictim"].module_path.read_text()
    assert '"wait_one_preempted"' in module
    bugs = set(re.findall(r'"(\w+)"', re.search(r"BugNames == \{([^}]*)\}",
                                                (models["DirectSafety"].spec_dir / "DeferDump.tla").read_text()).group(1)))
    assert bugs == {re.search(r'"(\w+)"', s).group(1) for s in MUTANT_SWITCHES.values()}



@pytest.mark.parametrize(("change", "fragment"), [
    ({"reproduces": "vllm#32255", "row": "P10"}, "'reproduces' must be a thread \"owner/repo#number\""),
    ({"reproduces": "vllm-project/vllm#0", "row": "P10"}, "'reproduces' must be a thread"),
    ({"reproduces": "vllm-project/vllm 32255", "row": "P10"}, "'reproduces' must be a thread"),
    ({"reproduces": ["vllm-project/vllm#32255"], "row": "P10"}, "'reproduces' must be a thread"),
    ({"reproduces": "vllm-project/vllm#32255", "row": "X1"}, "'row' must be a bug row id"),
    ({"reproduces": "vllm-project/vllm#32255"}, "'reproduces' and 'row' go together"),
    ({"row": "P10"}, "'reproduces' and 'row' go together"),
    ({"reproduces": "vllm-project/vllm#32255", "row": "P10", "expect": "pass"}, "must expect the violation"),
])
def test_reproduces_names_a_thread_on_a_violating_mutant(tmp_path: Path, change: dict[str, object],
                                                         fragment: str) -> None:
    model = _model(mutant=True, expect={"violation": "XInv"}, conformance=False)
    model.update(change)
    with pytest.raises(ManifestError, match="model 'A'") as raised:
        load_manifest(_write(tmp_path, [model]))
    assert fragment in str(raised.value)


def test_reproduces_is_read(tmp_path: Path) -> None:
    entry, plain = load_manifest(_write(tmp_path, [
        _model(mutant=True, expect={"violation": "XInv"}, conformance=False,
               reproduces="vllm-project/vllm-ascend#16662", row="P8"),
        _model(name="B"),
    ])).models
    assert (entry.reproduces, entry.row, plain.reproduces, plain.row) == ("vllm-project/vllm-ascend#16662", "P8",
                                                                          None, None)


def test_reproducing_models_name_their_row_and_cover_the_async_bug_switches() -> None:
    """Every shipped model that reproduces a field bug is in the CI tier and its description starts with its
    row, and every asynchronous-load bug switch of DeferDump.tla is some CI mutant's bug."""
    models = load_manifest().models
    reproducing = [e for e in models if e.reproduces]
    assert reproducing
    for entry in reproducing:
        assert entry.tier == "ci" and entry.row, entry.name
        assert not entry.name.startswith(("Async", "AbortFrees")) or (entry.description or "").startswith(entry.row)
    spec = (models[0].spec_dir / "DeferDump.tla").read_text()
    switches = set(re.findall(r'"(\w+)"', re.search(r"AsyncBugNames == \{([^}]*)\}", spec).group(1)))
    used = {switch for e in models if e.mutant and e.tier == "ci"
            for switch in re.findall(r'"(\w+)"', (re.search(r"^\s*Bugs = \{([^}]*)\}", strip_comments(
                e.config_path.read_text()), flags=re.MULTILINE) or re.match("()", "")).group(1))}
    assert switches and switches <= used, sorted(switches - used)
