"""The generated MC module and cfg: every constant the shipped protocol model declares gets a value."""
from __future__ import annotations

from deferdump.tools.mro.judge import ModelRunner
from deferdump.tools.mro.tla import (
    ClassTable,
    ModelBounds,
    cfg_assignments,
    config_text,
    declared_constants,
    module_name,
    module_text,
)
from deferdump.tools.tlc.specfiles import spec_dir

TABLE = ClassTable(
    classes=("object", "Base", "Direct"),
    bases={"object": (), "Base": ("object",), "Direct": ("Base",)},
    behaviour={("Direct", "build_connector_meta"): "track", ("Direct", "request_finished"): "delay_if_tracked"},
)


def test_declared_constants_ignore_comments() -> None:
    source = "CONSTANTS\n    A,   \\* first, with a comma\n    (* B, *) C\n\nASSUME TRUE\nCONSTANT D\n"
    assert declared_constants(source) == {"A", "C", "D"}


def test_cfg_assignments_skip_substitutions() -> None:
    assert cfg_assignments("CONSTANTS\n    Classes <- MC\n    Req = {r1, r2}\n    X = TRUE \\* note\n") == {
        "Req": "{r1, r2}",
        "X": "TRUE",
    }


def test_generated_cfg_assigns_every_constant_the_protocol_declares() -> None:
    directory = spec_dir()
    declared = declared_constants((directory / "DeferDump.tla").read_text()) | declared_constants(
        (directory / "Connectors.tla").read_text()
    )
    inherited, rank0 = ModelRunner(ModelBounds(), timeout=None).spec_settings(directory)
    cfg = config_text("Direct", False, "multi", ModelBounds(), inherited, rank0=rank0)
    assigned = set(cfg_assignments(cfg)) | {"Classes", "Bases", "Defines", "Behaviour"}
    assert declared <= assigned
    assert "Multi = TRUE" in cfg and "HMA = FALSE" in cfg and 'InnerClass = "Direct"' in cfg
    # the spec's passing models record no calls; a judged model's counterexample is shown, so it does
    assert "Record = FALSE" in (directory / "DirectSafety.cfg").read_text() and "Record = TRUE" in cfg


def test_module_text_holds_the_table_and_names_are_stable() -> None:
    name = module_name(TABLE, "Direct", False, "non_hma", ModelBounds())
    assert name == module_name(TABLE, "Direct", False, "non_hma", ModelBounds())
    assert name != module_name(TABLE, "Direct", False, "multi", ModelBounds())
    text = module_text(name, TABLE)
    assert text.startswith(f"---- MODULE {name} ----") and "EXTENDS DeferDump" in text
    assert '<<"Direct", "build_connector_meta">> :> "track"' in text
    assert '"Direct" :> <<"Base">>' in text


def test_liveness_cfg_checks_the_property_without_symmetry() -> None:
    plain = config_text("Direct", False, "non_hma", ModelBounds())
    live = config_text("Direct", False, "non_hma", ModelBounds(), liveness=True)
    assert "SYMMETRY Symmetry" in plain and "PROPERTY" not in plain
    assert "SYMMETRY" not in live and "PROPERTY\n    DelayedEventuallyFreedProp" in live
    assert module_name(TABLE, "Direct", False, "non_hma", ModelBounds(), True) != module_name(
        TABLE, "Direct", False, "non_hma", ModelBounds()
    )


def test_ranks_are_spelled_like_the_spec_cfgs() -> None:
    assert "Rank = {0, 1}\n    Rank0 = 0" in config_text("D", False, "multi", ModelBounds(ranks=2))
    assert "Rank = {w0, w1}\n    Rank0 = w0" in config_text("D", False, "multi", ModelBounds(ranks=2), rank0="w0")


def _layer_saver(wait_for_save: str) -> ClassTable:
    """A connector that submits a dump per layer (save_kv_layer), never delays a free, tracks nothing and reports
    nothing (get_finished as the base class)."""
    methods = {"save_kv_layer": "submit_layer", "wait_for_save": wait_for_save, "request_finished": "base",
               "request_finished_all_groups": "base", "build_connector_meta": "notrack",
               "handle_preemptions": "base", "get_finished": "base"}
    return ClassTable(classes=("object", "Layered"), bases={"object": (), "Layered": ("object",)},
                      behaviour={("Layered", method): label for method, label in methods.items()})


def test_wait_all_makes_per_layer_dumps_synchronous_and_polling_does_not() -> None:
    """The `wait_all` label (the judge's benign reading of a wait_for_save that drains every pending task) is
    what makes per-layer dumps without delayed frees safe: the same class polling instead is unsafe, real TLC.
    Two layers: the step's layer tasks are all waited, not only the last one."""
    runner = ModelRunner(ModelBounds(layers=2), timeout=300)
    draining = runner.check(_layer_saver("wait_all"), "Layered", False, "non_hma")
    polling = runner.check(_layer_saver("poll_track"), "Layered", False, "non_hma")
    assert draining.passed, draining.violated
    assert not polling.passed and polling.violated == "NoOverwriteWhileDumpingInv"
