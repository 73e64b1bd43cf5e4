"""The reading rules the twenty-second blind round called for (two helpers wrote 12 files with answer keys: callbacks
and callables reached through more than one hop, and subclasses of vLLM's own shipped connectors;
tests/fixtures/mro/corpus/blind_pipeline_generators_callables.py and its siblings are judged with TLC by the corpus
test):

* **an attribute holding a callable is called through its ``__call__``.** ``CloseThenLaunchConnector`` keeps a
  ``Launcher`` in ``self._launch`` and a ``Closer`` in ``self._close``; ``handle_preemptions`` runs
  ``self._close(preempted)`` and then ``self._launch(queued)``, whose ``__call__`` submits the previous step's dumps,
  after the preemption wait and before the forward rewrites the preempted request's blocks. The reader took
  ``self._launch(...)`` for a call of a method no class defines, saw no store work at all and judged the class
  **safe** with one group, as a MultiConnector child and under MLA (truth unsafe);
* **a bound method kept in an attribute runs as that method**: ``self._drain = self._settle`` and then
  ``self._drain(done)`` in ``get_finished`` waits the finished requests' tasks; it was read as no wait at all
  (a report before the wait: a false alarm on a correct connector)."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_source
from deferdump.tools.mro.tla import ModelBounds
from test_mro_blind_round6 import HEADER, PROTOCOL, _labels

#: Callable helper objects: one submits the dumps it is handed, one waits a request's tasks, one only counts.
CALLABLES = """
class Launcher:
    def __init__(self, store):
        self._store = store
        self.tasks = []
    def __call__(self, queued):
        for blocks in queued:
            self.tasks.append(self._store.dump(blocks))
class Closer:
    def __init__(self, store, by_req):
        self._store = store
        self._by_req = by_req
    def __call__(self, req_ids):
        for req_id in req_ids:
            for task in self._by_req.pop(req_id, []):
                self._store.wait(task)
class Tally:
    def __init__(self):
        self.calls = 0
    def __call__(self, *args):
        self.calls += 1
"""


def _judge(hooks: str) -> Judge:
    source = HEADER + CALLABLES + PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(hooks), "    "))
    return Judge(build_hierarchy(read_source(source, "<t>")), ModelRunner(ModelBounds(), 60))


def test_a_callable_helper_that_submits_from_handle_preemptions_starts_a_transfer_outside_the_save_path() -> None:
    judge = _judge("""
def register_kv_caches(self, kv_caches):
    self._launch = Launcher(self.store)
    self._queued = []
def handle_preemptions(self, metadata):
    self._settle(metadata.preempted_req_ids)
    queued, self._queued = self._queued, []
    self._launch(queued)
""")
    outside = judge._transfers_outside_the_model("Proto", None)  # noqa: SLF001
    assert any("Launcher.__call__ submits a store dump()" in why for why in outside), outside


COUNTING = """
def register_kv_caches(self, kv_caches):
    self._tick = Tally()
def handle_preemptions(self, metadata):
    self._tick(metadata)
    self._settle(metadata.preempted_req_ids)
"""


def test_a_callable_helper_that_only_counts_adds_nothing() -> None:
    counted = _labels(COUNTING, prelude=CALLABLES)
    assert counted["Proto.handle_preemptions"].label == _labels("")["Proto.handle_preemptions"].label
    assert _judge(COUNTING)._transfers_outside_the_model("Proto", None) == ()  # noqa: SLF001


def test_a_callable_helper_that_waits_is_not_read_as_no_wait() -> None:
    """``self._close(done)`` in get_finished waits through ``Closer.__call__``: not a report before the wait (the
    label the model would give a call that does nothing), but a call the reader cannot label by name."""
    labels = _labels("""
def register_kv_caches(self, kv_caches):
    self._close = Closer(self.store, self._by_req)
def get_finished(self, finished_req_ids):
    done = finished_req_ids & self._async_dump_req_ids
    self._close(done)
    return done, None
""", prelude=CALLABLES)
    finished = labels["Proto.get_finished"]
    assert finished.label != "report_before_wait"
    assert any("Closer.__call__ does a store wait" in r for r in finished.reasons), finished.reasons


def test_a_bound_method_kept_in_an_attribute_runs_as_that_method() -> None:
    plain = _labels("")
    bound = _labels("""
def register_kv_caches(self, kv_caches):
    self._drain = self._settle
def get_finished(self, finished_req_ids):
    done = finished_req_ids & self._async_dump_req_ids
    self._drain(done)
    return done, None
""")
    assert bound["Proto.get_finished"].label == plain["Proto.get_finished"].label == "wait_finished"


def test_an_attribute_never_assigned_stays_a_call_that_contributes_nothing() -> None:
    """The documented limit (docs/mro.md): ``self._missing()`` that no class defines or assigns adds no effect."""
    plain = _labels("")
    missing = _labels("""
def handle_preemptions(self, metadata):
    self._missing(metadata)
    self._settle(metadata.preempted_req_ids)
""")
    assert missing["Proto.handle_preemptions"].label == plain["Proto.handle_preemptions"].label
