"""Cross-check the source reader and C3 against Python itself: the MRO and the owning class of every connector
method must equal what ``cls.__mro__`` and attribute lookup give, for deferdump's reference connector and for
the synthetic fixtures (executed here with stand-in vLLM/UCM modules, which `deferdump mro` never does)."""
from __future__ import annotations

import abc
import inspect
import sys
import types
from pathlib import Path

import pytest

import deferdump.reference.connectors as reference_connectors
from deferdump.tools.mro.behaviour import EffectReader
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import CONNECTOR_METHODS, read_files
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES as ALL_FIXTURES

FIXTURES = ALL_FIXTURES / "mro"
EXECUTABLE_FIXTURES = ["ucm_shaped.py", "cp_override_no_track.py", "outer_no_forward.py", "diamond.py",
                       "super_skip.py", "override_no_super.py", "wrapper_multi_inner.py", "unknown_policy.py",
                       "silent_get_finished.py"]


def _python_owner(cls: type, method: str) -> str | None:
    """The class whose ``__dict__`` holds the attribute Python's lookup finds."""
    return next((c.__name__ for c in cls.__mro__ if method in c.__dict__), None)


def _assert_matches_python(classes: dict[str, type], source: list[Path]) -> None:
    hierarchy = build_hierarchy(read_files(source), require_connector=False)
    assert classes, "no classes to compare"
    for name, cls in classes.items():
        assert hierarchy.mro[name] == [c.__name__ for c in cls.__mro__], name
        expected = {m: _python_owner(cls, m) for m in CONNECTOR_METHODS}
        expected = {m: owner for m, owner in expected.items() if owner is not None}
        if name in hierarchy.connectors:
            assert hierarchy.resolves(name) == expected, name
        else:
            found = {m: hierarchy.lookup(name, m) for m in CONNECTOR_METHODS}
            assert {m: o for m, o in found.items() if o is not None} == expected, name


def test_reference_connector_mro_and_resolution_equal_python() -> None:
    module = reference_connectors
    classes = {
        name: cls
        for name, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__
    }
    assert {"DirectConnector", "LayerWiseConnector", "CPConnector", "OuterConnector"} <= set(classes)
    _assert_matches_python(classes, [Path(module.__file__)])


def test_reference_connectors_are_found_and_the_outer_picks_every_variant() -> None:
    hierarchy = build_hierarchy(read_files([Path(reference_connectors.__file__)]))
    assert hierarchy.connectors == ["DirectConnector", "LayerWiseConnector", "CPConnector", "OuterConnector"]
    assert hierarchy.resolves("CPConnector")["build_connector_meta"] == "DirectConnector"
    judge = Judge(hierarchy, ModelRunner(ModelBounds(), timeout=None))
    inners, reasons = judge.inner_choices("OuterConnector")
    assert inners == ["DirectConnector", "LayerWiseConnector", "CPConnector"] and reasons == []
    assert judge.inner_choices("CPConnector") == ([None], [])


def _stand_in_base() -> type:
    """vLLM's KVConnectorBase_V1 as far as attribute lookup goes: an ABC with every API method."""
    methods = {m: (lambda self, *args, **kwargs: None) for m in CONNECTOR_METHODS if m != "request_finished_all_groups"}
    return type("KVConnectorBase_V1", (abc.ABC,), methods)


@pytest.fixture
def stand_in_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importable stand-ins for the vLLM and UCM modules the fixtures import."""
    base_cls = _stand_in_base()
    hma_cls = type("SupportsHMA", (abc.ABC,), {"request_finished_all_groups": lambda self, r, b: (False, None)})
    base_module = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.base")
    base_module.KVConnectorBase_V1 = base_cls  # type: ignore[attr-defined]
    base_module.SupportsHMA = hma_cls  # type: ignore[attr-defined]
    base_module.KVConnectorMetadata = type("KVConnectorMetadata", (abc.ABC,), {})  # type: ignore[attr-defined]
    parents = ["vllm", "vllm.distributed", "vllm.distributed.kv_transfer", "vllm.distributed.kv_transfer.kv_connector"]
    for name in parents:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    v1 = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1")
    v1.base = base_module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, v1.__name__, v1)
    monkeypatch.setitem(sys.modules, base_module.__name__, base_module)
    ucm = types.ModuleType("ucm")
    store = types.ModuleType("ucm.store")
    store.UcmKVStoreBaseV1 = type("UcmKVStoreBaseV1", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ucm", ucm)
    monkeypatch.setitem(sys.modules, "ucm.store", store)


@pytest.mark.parametrize("fixture", EXECUTABLE_FIXTURES)
def test_fixture_mro_and_resolution_equal_python(
    fixture: str, stand_in_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = FIXTURES / fixture
    module = types.ModuleType(f"mro_fixture_{path.stem}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - our fixture, stand-ins only
    namespace = module.__dict__
    classes = {
        name: value
        for name, value in namespace.items()
        if isinstance(value, type) and value.__module__ == namespace["__name__"]
    }
    _assert_matches_python(classes, [path])


def test_inconsistent_fixture_fails_in_python_too(stand_in_modules: None) -> None:
    path = FIXTURES / "inconsistent.py"
    with pytest.raises(TypeError, match="consistent method resolution"):
        exec(compile(path.read_text(), str(path), "exec"), {"__name__": "mro_fixture_inconsistent"})  # noqa: S102


def test_labels_follow_the_judged_class_mro() -> None:
    """A cooperative super() reaches Tracking in CooperativeFirst's MRO but the base on its own."""
    hierarchy = build_hierarchy(read_files([FIXTURES / "diamond.py"]))
    reader = EffectReader(hierarchy)
    assert reader.label("CooperativeFirst", "Cooperative", "build_connector_meta").label == "super"
    assert hierarchy.lookup("CooperativeFirst", "build_connector_meta", after="Cooperative") == "Tracking"
    assert hierarchy.lookup("Cooperative", "build_connector_meta", after="Cooperative") == "PlanningBase"


def test_super_with_a_class_argument_is_followed_from_that_class() -> None:
    """super(LayerWise, self) skips LayerWise's non-tracking override and reaches Direct's tracking one."""
    hierarchy = build_hierarchy(read_files([FIXTURES / "super_skip.py"]))
    reader = EffectReader(hierarchy)
    assert reader.label("CPSkipping", "CPSkipping", "build_connector_meta").label == "track"
    assert reader.label("CPPlainSuper", "CPPlainSuper", "build_connector_meta").label == "super"
    assert reader.label("CPPlainSuper", "LayerWise", "build_connector_meta").label == "notrack"
