"""Malformed ITF input: one line naming file, state index and JSON path; nothing replayed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.conformance import RecordingFactory, toy_manifest
from deferdump.conformance.errors import TraceInputError
from deferdump.conformance.replay import replay_paths
from deferdump.conformance.tracegen import write_itf
from deferdump.tools.tlc.values import Record, Tup

GOOD_STATES = [{"slots": Tup((0, 0)), "action": Record(name="init")},
               {"slots": Tup((1, 0)), "action": Record(name="inc", slot=1)}]


def _good(tmp_path: Path) -> Path:
    path = tmp_path / "good.itf.json"
    write_itf(path, GOOD_STATES, {"model": "Toy"})
    return path


def _bad(tmp_path: Path, mutate) -> Path:
    obj = json.loads(_good(tmp_path).read_text())
    mutate(obj)
    path = tmp_path / "bad.itf.json"
    path.write_text(json.dumps(obj))
    return path


def _drop_vars(obj):
    del obj["vars"]


def _drop_states(obj):
    del obj["states"]


def _unknown_tag(obj):
    obj["states"][1]["slots"] = {"#tup": [{"#bigint": "1"}, {"#float": "0.5"}]}


def _unknown_action(obj):
    obj["states"][1]["action"]["name"] = "explode"


def _missing_variable(obj):
    del obj["states"][1]["slots"]


def _no_action_var(obj):
    obj["vars"] = ["slots"]
    for state in obj["states"]:
        del state["action"]


CASES = [
    (_drop_vars, "bad.itf.json: $.vars: missing or malformed 'vars'"),
    (_drop_states, "bad.itf.json: $.states: missing or malformed 'states'"),
    (_unknown_tag, "bad.itf.json: state 1: $.states[1].slots[\"#tup\"][1]: unknown value tag '#float'"),
    (_unknown_action, "bad.itf.json: state 1: $.states[1].action.name: unknown action name 'explode'"),
    (_missing_variable, "bad.itf.json: state 1: $.states[1]: missing variable 'slots'"),
    (_no_action_var, "bad.itf.json: $.vars: the model's 'action' variable is missing"),
]


@pytest.mark.parametrize("mutate, message", CASES, ids=[c[0].__name__.strip("_") for c in CASES])
def test_malformed_trace_is_rejected_before_anything_replays(tmp_path, mutate, message):
    bad = _bad(tmp_path, mutate)
    factory = RecordingFactory()
    with pytest.raises(TraceInputError) as caught:
        replay_paths([_good(tmp_path), bad], driver_factory=factory, manifest=toy_manifest())
    text = str(caught.value)
    assert "\n" not in text
    assert text.endswith(text[text.index("bad.itf.json"):])
    assert message in text
    assert factory.replayed == 0


def test_bad_json_names_line_and_column(tmp_path):
    path = tmp_path / "broken.itf.json"
    path.write_text('{"vars": ["x"], "states": [')
    with pytest.raises(TraceInputError, match=r"broken.itf.json: \$: bad JSON at line 1, column 28"):
        replay_paths([path], driver_factory=RecordingFactory())


def _deferdump_trace(tmp_path: Path, mutate) -> Path:
    from support.conformance import deferdump_traces

    obj = json.loads(deferdump_traces("LookupConformance")[0].read_text())
    mutate(obj["#meta"]["constants"])
    path = tmp_path / "lookup.itf.json"
    path.write_text(json.dumps(obj))
    return path


def test_traces_from_before_the_lookup_constants_replay_with_misses_and_full_prompts(tmp_path):
    from deferdump.conformance.deferdump_driver import ModelConstants
    from deferdump.tools.tlc.values import load_itf

    def drop(constants):
        del constants["StoreHits"], constants["ShortReqs"]

    constants = ModelConstants.from_trace(load_itf(_deferdump_trace(tmp_path, drop)))
    assert constants.store_hits is False and constants.short_reqs == frozenset()
    assert constants.need_blocks("r2") == constants.prompt_blocks


def test_a_malformed_lookup_constant_names_its_json_path(tmp_path):
    def corrupt(constants):
        constants["ShortReqs"] = {"#float": "1.5"}

    path = _deferdump_trace(tmp_path, corrupt)
    with pytest.raises(TraceInputError, match=r'lookup.itf.json: \$\["#meta"\].constants.ShortReqs: unknown value tag'):
        replay_paths([path])
