"""One exception root: every exception class the deferdump package defines derives from DeferDumpError.

Imports every module of the deferdump distribution (`deferdump` itself is a namespace package: each top
package is walked; modules that need vLLM are skipped only when vLLM is absent) and inspects the classes
each one defines.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil

import pytest

from deferdump.reference.errors import DeferDumpError

TOP_PACKAGES = ("deferdump.reference", "deferdump.tools", "deferdump.conformance", "deferdump.spec")
_VLLM = importlib.util.find_spec("vllm")
# Under pytest tests/ is on sys.path, and tests/vllm imports as a namespace package named vllm (no origin).
NEEDS_VLLM = _VLLM is None or _VLLM.origin is None


def _module_names() -> list[str]:
    names: set[str] = set()
    for package in TOP_PACKAGES:
        names.add(package)
        module = importlib.import_module(package)
        names.update(info.name for info in pkgutil.walk_packages(module.__path__, package + "."))
    return sorted(names)


def _import(name: str) -> object | None:
    try:
        return importlib.import_module(name)
    except ImportError as error:
        if NEEDS_VLLM and (error.name or "").split(".")[0] == "vllm":
            return None  # a thin vLLM adapter, where vLLM is not installed
        raise


def _exception_classes() -> list[type[BaseException]]:
    found = []
    for name in _module_names():
        module = _import(name)
        if module is None:
            continue
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == name:
                found.append(value)
    return found


def test_every_module_is_found() -> None:
    names = _module_names()
    assert "deferdump.conformance.driver" in names and "deferdump.reference.stores.threaded" in names
    assert "deferdump.tools.cli.app" in names and len(names) > 80


def test_every_exception_class_derives_from_the_root() -> None:
    classes = _exception_classes()
    names = {f"{cls.__module__}.{cls.__qualname__}" for cls in classes}
    # the two that lived outside the root, and a few that were always under it
    assert {"deferdump.conformance.driver.StepMismatch", "deferdump.reference.stores.threaded.BadBlock",
            "deferdump.reference.errors.UserError", "deferdump.reference.stores.base.StoreError"} <= names
    outside = sorted(name for cls, name in zip(classes, (f"{c.__module__}.{c.__qualname__}" for c in classes))
                     if not issubclass(cls, DeferDumpError))
    assert outside == [], f"exceptions outside deferdump.reference.errors.DeferDumpError: {outside}"


def test_the_check_catches_a_class_outside_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module("deferdump.conformance.driver")

    class Stray(Exception):
        pass

    Stray.__module__ = module.__name__
    monkeypatch.setattr(module, "Stray", Stray, raising=False)
    with pytest.raises(AssertionError, match="deferdump.conformance.driver.*Stray"):
        test_every_exception_class_derives_from_the_root()
