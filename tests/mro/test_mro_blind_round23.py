"""The reading rule the twenty-third blind round called for (two helpers wrote 12 files with answer keys: behaviour
changed by decorators, descriptors and class construction, and the shapes of the field's third-party connectors;
tests/fixtures/mro/corpus/blind_once_guard_decorators.py and its siblings are judged with TLC by the corpus test):

* **a decorator whose wrapper may return before it calls the method is not read through.** ``once_per_request``
  (``if (fn.__name__, req_id) in seen: return None``) and ``guarded("flag")`` (``if not getattr(self, flag):
  return None``) call the body at most once, in a ``return fn(...)`` statement, and the reader took that statement
  for the whole wrapper: ``PreemptOnceConnector`` (a finish flush skipped because the preemption ran it first),
  ``MetadataGuardConnector`` (a preemption wait skipped because vLLM calls ``handle_preemptions`` before it binds
  the step's metadata, gpu_model_runner.py ~3971, kv_connector_model_runner_mixin.py ~77) and
  ``TracedOnceConnector`` (two once-guarded methods sharing one key through a wrapper without ``functools.wraps``)
  were read as waiting and judged **safe** with one group, as MultiConnector children and under MLA (truth
  unsafe)."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.behaviour import UNKNOWN, EffectReader
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.source import read_source

HEADER = "import functools\nfrom vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1\n"

DECORATORS = """
def once_per_request(fn):
    @functools.wraps(fn)
    def wrapper(self, req_id, *args, **kwargs):
        seen = self.__dict__.setdefault("_once_seen", set())
        key = (fn.__name__, req_id)
        if key in seen:
            return None
        seen.add(key)
        return fn(self, req_id, *args, **kwargs)
    return wrapper
def guarded(flag):
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            value = getattr(self, flag, False)
            if not value:
                return None
            return fn(self, *args, **kwargs)
        return wrapper
    return decorate
def checked(fn):
    def wrapper(self, *args, **kwargs):
        if self._closed:
            raise RuntimeError("closed")
        return fn(self, *args, **kwargs)
    return wrapper
def lazily(fn):
    def wrapper(self, *args, **kwargs):
        yield fn(self, *args, **kwargs)
    return wrapper
def traced(fn):
    def traced_call(self, *args, **kwargs):
        if self._verbose:
            print("calling", args)
        result = fn(self, *args, **kwargs)
        return result
    return traced_call
def reraising(fn):
    def wrapper(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except OSError:
            self._errors += 1
            raise
    return wrapper
"""

CONNECTOR = """
class C(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._tasks = {}
    @DECORATOR
    def handle_preemptions(self, metadata):
        for req_id in metadata.preempted_req_ids:
            for task in self._tasks.pop(req_id, []):
                self.store.wait(task)
"""


def _label(decorator: str):
    source = HEADER + textwrap.dedent(DECORATORS) + textwrap.dedent(CONNECTOR).replace("DECORATOR", decorator)
    hierarchy = build_hierarchy(read_source(source, "<t>"))
    owner = hierarchy.lookup("C", "handle_preemptions")
    assert owner is not None
    return EffectReader(hierarchy).label("C", owner, "handle_preemptions")


def test_a_decorator_that_may_return_raise_or_yield_before_the_call_is_not_read_through() -> None:
    for decorator in ("once_per_request", 'guarded("_windowed")', "checked", "lazily"):
        label = _label(decorator)
        name = decorator.split("(")[0]
        assert label.label == UNKNOWN and f"@{name}" in label.reasons[0], (decorator, label)


def test_a_decorator_that_always_reaches_the_call_is_still_read_through() -> None:
    """The opposite: an ``if`` that only logs, and a handler that re-raises, leave the body's wait as it is."""
    for decorator in ("traced", "reraising"):
        assert _label(decorator).label == "wait_preempted", decorator
