"""The one class-name table agrees with the model's class table and with the reference classes."""
from __future__ import annotations

import re
from pathlib import Path

import deferdump.spec
from deferdump.reference import connectors
from deferdump.reference.class_names import BY_MODEL, INNER, OUTER

REAL_TABLE = (Path(deferdump.spec.__file__).parent / "RealTable.tla").read_text()


def test_every_name_is_the_models_class_name() -> None:
    for names in (*INNER, OUTER):
        assert re.search(rf'^{names.model} == "{names.ucm}"$', REAL_TABLE, re.M), names


def test_every_variant_runs_the_reference_class_and_mro_the_table_names() -> None:
    for names in INNER:
        cls = connectors.VARIANT_CLASSES[names.variant]
        assert cls.__name__ == names.reference
        own = [c.__name__ for c in reversed(cls.__mro__) if c.__module__ == connectors.__name__]
        assert tuple(own) == names.mro
    assert set(connectors.VARIANT_CLASSES) == {names.variant for names in INNER}
    assert getattr(connectors, OUTER.reference).__name__ == OUTER.reference


def test_the_manifest_variants_are_table_names() -> None:
    import json

    manifest = json.loads((Path(deferdump.spec.__file__).parent / "manifest.json").read_text())
    # variant "Contract": the connector contract's models and DeferDump's refinement of it, no class table
    variants = {model["variant"] for model in manifest["models"] if "variant" in model} - {"Contract"}
    assert variants and variants <= set(BY_MODEL), variants - set(BY_MODEL)
