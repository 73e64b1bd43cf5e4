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
    """Within the block, ``torch.cuda``'s events and streams are the CPU stand-ins where CUDA is absent (yields
    whether they were put in); with CUDA the real ones stay. torch is imported here, by the replay's child
    process, not by every ``deferdump mro`` that reads a stub module's name."""
    import torch

    if torch.cuda.is_available():
        yield False
        return
    saved = {name: getattr(torch.cuda, name) for name in STANDINS}
    for name, standin in STANDINS.items():
        setattr(torch.cuda, name, standin)
    try:
        yield True
    finally:
        for name, real in saved.items():
            setattr(torch.cuda, name, real)
