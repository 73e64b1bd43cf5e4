"""CPU stand-ins for ``torch.cuda``'s events and streams, so a connector that records an event around its dumps
runs in a replay on a machine without a GPU.

Why: ``torch.cuda.Event()`` raises ("Tried to instantiate dummy base class Event") where CUDA is absent, and a
connector that makes one on its save path (UCM PR #989's event handle per dump, the fourteenth blind round's
``UCMStyleDirectConnector``) then never submits a dump in the replay, whose counterexample is withdrawn. On the
CPU, work is synchronous: a stream has nothing queued, an event is complete once recorded. So ``query()`` is
True and ``synchronize()``/``wait_event()`` return at once. None of this touches the replay's store tasks, which
alone make a hazard: a stand-in can let the class get further, never make a task end sooner.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any


class CpuEvent:
    """``torch.cuda.Event`` on the CPU: complete once made."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        self.recorded = True

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def elapsed_time(self, end_event: CpuEvent) -> float:
        return 0.0


class CpuStream:
    """``torch.cuda.Stream`` on the CPU: nothing is ever queued on it."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = device

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def record_event(self, event: CpuEvent | None = None) -> CpuEvent:
        event = event or CpuEvent()
        event.record(self)
        return event


_DEFAULT_STREAM = CpuStream()


@contextlib.contextmanager
def _stream(stream: Any = None) -> Iterator[Any]:
    yield stream


#: ``torch.cuda`` attributes replaced while a replay runs on a machine without CUDA.
STANDINS: dict[str, Any] = {
    "Event": CpuEvent,
    "Stream": CpuStream,
    "current_stream": lambda device=None: _DEFAULT_STREAM,
    "default_stream": lambda device=None: _DEFAULT_STREAM,
    "stream": _stream,
    "synchronize": lambda device=None: None,
}


@contextlib.contextmanager
def cuda_standins() -> Iterator[bool]:
    """Within the block, ``torch.cuda``'s events and streams are the CPU stand-ins where CUDA is absent; with CUDA
    the real ones stay. Yields whether they are in at the start (torch already imported, no CUDA).

    torch is not imported here: most classes a replay runs never import it, and importing it costs about 1.4 s of
    the 2 s a replay or exploration child takes (the explorer over `make test`'s sample starts 272 of them). Where
    torch is not imported yet, a finder puts the stand-ins in right after its import completes, whoever imports it
    (the class's module, a method body, a library), and the block's end takes them out again."""
    torch = sys.modules.get("torch")
    if torch is not None:
        saved = _put_in(torch)
        try:
            yield saved is not None
        finally:
            _take_out(torch, saved)
        return
    finder = _PatchOnImport()
    sys.meta_path.insert(0, finder)
    try:
        yield False
    finally:
        sys.meta_path.remove(finder)
        if finder.module is not None:
            _take_out(finder.module, finder.saved)


def _put_in(torch: types.ModuleType) -> dict[str, Any] | None:
    """Replace ``torch.cuda``'s attributes by the stand-ins where CUDA is absent; the replaced ones, or None."""
    if torch.cuda.is_available():
        return None
    saved = {name: getattr(torch.cuda, name) for name in STANDINS}
    for name, standin in STANDINS.items():
        setattr(torch.cuda, name, standin)
    return saved


def _take_out(torch: types.ModuleType, saved: dict[str, Any] | None) -> None:
    for name, real in (saved or {}).items():
        setattr(torch.cuda, name, real)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``torch`` as the other finders do, and puts the stand-ins in once its module has run."""

    def __init__(self) -> None:
        self.module: types.ModuleType | None = None
        self.saved: dict[str, Any] | None = None
        self._finding = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch" or self._finding or self.module is not None:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenPatch(spec.loader, self)
        return spec

    def loaded(self, module: types.ModuleType) -> None:
        self.module = module
        self.saved = _put_in(module)


class _ThenPatch(importlib.abc.Loader):
    """The real loader of ``torch``, then the stand-ins; anything else a caller asks of it, the real loader's."""

    def __init__(self, loader: Any, finder: _PatchOnImport) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        self._finder.loaded(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
