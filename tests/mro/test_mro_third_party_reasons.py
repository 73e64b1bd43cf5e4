"""Reasons that stay true on shapes found in other projects' connectors (2026-12-06: `deferdump mro` run on
PegaFlow, vllm-ascend, FlexKV, Mooncake, DingoCache, AIBrix and cpumemconnector sources, read through the search
tools and not copied here; no verdict was wrong, four `unknown` reasons said something false about the code):

* PegaFlow's ``PdConnector`` (a ``__getattr__`` forwarder) was said to get ``_wait_pending_dump_task`` from its
  ``__getattr__``: a UCM helper the model knows, which nothing in that class calls;
* vllm-ascend's ``AscendMultiConnector.request_finished_all_groups`` was said not to delegate to
  ``request_finished``; it does, through ``super()``, when a child lacks HMA;
* vllm-ascend's ``AscendOffloadingConnector`` was said to assign no recognisable class to the scheduler it forwards
  to; its ``super().__init__`` does.
Reader tests, no TLC."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_source
from deferdump.tools.mro.tla import ModelBounds

HEADER = ("from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA\n"
          "from blockstore_client import BlockStore\n")


def _judge(source: str) -> Judge:
    return Judge(build_hierarchy(read_source(HEADER + textwrap.dedent(source), "<t>")), ModelRunner(ModelBounds(), 60))


def test_a_getattr_forwarder_is_asked_only_for_methods_someone_calls() -> None:
    judge = _judge("""
    class Forwarder(KVConnectorBase_V1):
        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config, role, kv_cache_config)
            self._delegate = make_delegate(vllm_config)
        def __getattr__(self, name):
            return getattr(self._delegate, name)
    """)
    labels = {(l.owner, l.method): l for l in judge._labels("Forwarder", None, [])}  # noqa: SLF001
    assert ("Forwarder", "_wait_pending_dump_task") not in labels, labels
    # what the class does not define vLLM still asks of it: request_finished_all_groups is not on the base
    asked = labels[("Forwarder", "request_finished_all_groups")]
    assert "Python asks Forwarder.__getattr__ for it at run time" in asked.reasons[0], asked


def test_a_finish_that_delegates_on_some_paths_says_so() -> None:
    judge = _judge("""
    class SplitFinish(KVConnectorBase_V1, SupportsHMA):
        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config, role, kv_cache_config)
            self._all_hma = vllm_config.all_hma
        def request_finished(self, request, block_ids):
            return False, None
        def request_finished_all_groups(self, request, block_ids):
            if not self._all_hma:
                return super().request_finished(request, block_ids[0])
            return bool(block_ids), None
    """)
    labels = {(l.owner, l.method): l for l in judge._labels("SplitFinish", None, [])}  # noqa: SLF001
    finish = labels[("SplitFinish", "request_finished_all_groups")]
    assert finish.label == "unknown", finish
    assert "calls another class's request_finished on some paths and answers itself on others" in finish.reasons[0]


def test_a_wrapper_s_inner_classes_include_what_its_base_s_init_assigns() -> None:
    judge = _judge("""
    class Scheduler:
        def build(self, out):
            return out
    class Worker:
        def save(self):
            return None
    class AscendWorker(Worker):
        pass
    class Base(KVConnectorBase_V1):
        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config, role, kv_cache_config)
            self.connector_scheduler = Scheduler()
            self.connector_worker = Worker()
        def build_connector_meta(self, scheduler_output):
            return self.connector_scheduler.build_connector_meta(scheduler_output)
        def wait_for_save(self):
            self.connector_worker.wait_for_save()
    class Layout(Base):
        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config, role, kv_cache_config)
            self.connector_worker = AscendWorker()
    """)
    _, reasons = judge.inner_choices("Layout")
    assert not any("assigns no recognisable class" in r for r in reasons), reasons
    assert any("puts Scheduler in self.connector_scheduler" in r for r in reasons), reasons
    assert any("puts AscendWorker in self.connector_worker" in r for r in reasons), reasons
    assert not any("puts Worker in self.connector_worker" in r for r in reasons), reasons  # the nearer __init__'s
