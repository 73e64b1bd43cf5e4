"""Transfers the model does not see: calls into helper objects (tools/mro/helpers.py), a delayed free with
nothing the model follows in flight, and a ``get_transfer_results`` that bypasses ``get_finished``. vLLM 0.32's
``MooncakeConnector`` and ``HiSparseConnector`` were judged safe through the first two (their save methods do
nothing; their worker helpers push and mirror blocks); tests/vllm/test_vllm_mro_sources.py judges them.
The reader tests need no TLC; the judge tests run real TLC."""
from __future__ import annotations

import textwrap

import pytest

from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Context, Judge, ModelRunner
from deferdump.tools.mro.source import read_files, read_source
from deferdump.tools.mro.tla import ModelBounds
from support import FIXTURES

HEADER = (
    "import threading\n"
    "from remote_engine import Engine, Agent\n"
    "from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorTransferResults\n"
)

#: A P/D-style connector: nothing in the save methods; start_load_kv hands the step's sends to a helper.
PULL = """
class {helper_def}

class PullConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.worker = {helper}()
        self._finished = set()
    def start_load_kv(self, forward_context, **kwargs):
        {start}
    def wait_for_layer_load(self, layer_name):
        pass
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass
    def wait_for_save(self):
        pass
    def get_finished(self, finished_req_ids):
        {finished}
    def request_finished(self, request, block_ids):
        return {delay}, {{"remote_blocks": block_ids}}
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass
    def build_connector_meta(self, scheduler_output):
        return scheduler_output
"""

SENDER = """Sender:
    def __init__(self):
        self._sends = {}
        self._done = set()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
    def _serve(self):
        while True:
            self._push(self._sends.popitem())
    def record(self, meta):
        self._sends.update(meta.sends)
    def finished(self):
        return set(self._done)"""

LEDGER = """Ledger:
    def __init__(self):
        self._sends = {}
    def record(self, meta):
        self._sends.update(meta.sends)
    def finished(self):
        return set(self._sends)"""


def _source(helper_def: str = SENDER, helper: str = "Sender", start: str = "self.worker.record(self._get_connector_metadata())",
            finished: str = "return self.worker.finished(), None", delay: str = "True") -> str:
    return HEADER + textwrap.dedent(PULL).format(helper_def=helper_def, helper=helper, start=start,
                                                 finished=finished, delay=delay)


def _judge(source: str, timeout: float = 120) -> Judge:
    return Judge(build_hierarchy(read_source(source, "<t>")), ModelRunner(ModelBounds(), timeout))


# -- reading: which helper calls may start a transfer -------------------------------------------------------
def test_a_call_into_an_analysed_helper_that_starts_a_thread_is_a_transfer_outside_the_model() -> None:
    why = _judge(_source())._transfers_outside_the_model("PullConnector", None)
    assert len(why) == 2, why  # start_load_kv and get_finished both call into the Sender
    start = next(w for w in why if w.startswith("PullConnector.start_load_kv"))
    assert "self.worker.record()" in start and "Sender.__init__ hands work on" in start and "Thread" in start


def test_an_analysed_helper_that_only_keeps_data_starts_nothing() -> None:
    assert _judge(_source(LEDGER, "Ledger"))._transfers_outside_the_model("PullConnector", None) == ()


def test_code_that_was_not_analysed_is_followed_by_what_the_call_is() -> None:
    """A hook handed on, or a call that is neither a release nor a query, may start a transfer; releasing a
    handle or reading a notification list does not."""
    cases = {
        "self.worker.start_load_kv(forward_context)": "a Engine, a class that was not analysed",
        "self.worker.push(self._get_connector_metadata())": "a Engine, a class that was not analysed",
        "self.worker.release_handle(7)": None,
        "self.worker.get_notifs()": None,
        "self.worker.wait(self._finished)": None,
    }
    for start, expected in cases.items():
        why = _judge(_source("Unused:\n    pass", "Engine", start=start, finished="return None, None"))
        found = why._transfers_outside_the_model("PullConnector", None)
        if expected is None:
            assert found == (), (start, found)
        else:
            assert len(found) == 1 and expected in found[0], (start, found)


def test_the_store_client_loads_are_not_saves() -> None:
    """UCM's connectors load with ``self.store.load_data`` (and wait it) in start_load_kv: the attribute they
    submit dumps to is the store, judged where it submits; its loads are outside what this checker judges."""
    source = _source("Unused:\n    pass", "Engine", start="self.worker.load_data(self._get_connector_metadata())",
                     finished="return None, None")
    source = source.replace("    def wait_for_save(self):\n        pass",
                            "    def wait_for_save(self):\n        self.worker.wait(self.worker.dump_data([1]))")
    assert "dump_data" in source
    assert _judge(source)._transfers_outside_the_model("PullConnector", None) == ()
    other = source.replace("self.worker.wait(self.worker.dump_data([1]))", "pass")  # not the store: followed
    found = _judge(other)._transfers_outside_the_model("PullConnector", None)
    assert len(found) == 1 and "self.worker.load_data()" in found[0]


def test_a_helper_reached_through_a_field_of_another_helper_is_followed() -> None:
    helper = """Owner:
    def __init__(self):
        self.sender = Sender()
    def record(self, meta):
        pass

class """ + SENDER
    why = _judge(_source(helper, "Owner", start="self.worker.sender.kick()", finished="return None, None"))
    found = why._transfers_outside_the_model("PullConnector", None)
    assert len(found) == 1 and "self.worker holds a Owner" in found[0] and "self.sender holds a Sender" in found[0]


def test_a_wrapper_calling_its_inner_connector_is_the_inner_class_own_business() -> None:
    source = HEADER + textwrap.dedent("""
    class Inner(KVConnectorBase_V1):
        def get_finished(self, finished_req_ids):
            return None, None

    class Wrapper(KVConnectorBase_V1):
        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config, role, kv_cache_config)
            self.inner = Inner(vllm_config, role, kv_cache_config) if role else Engine()
        def get_finished(self, finished_req_ids):
            return self.inner.get_finished(finished_req_ids)
    """)
    judge = _judge(source)
    assert judge._transfers_outside_the_model("Wrapper", "Inner") == ()
    found = judge._transfers_outside_the_model("Wrapper", None)  # the other choice: a class not analysed
    assert len(found) == 1 and "a Engine, a class that was not analysed" in found[0]


# -- judging, real TLC -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_delayed_free_with_nothing_the_model_follows_in_flight_is_not_safe() -> None:
    """The remote side reads the delayed blocks; the class learns of it through an Agent it only queries.
    No helper call starts anything, the model has no transfer at all, and a pass proves nothing."""
    source = _source("Unused:\n    pass", "Agent", start="pass",
                     finished="return set(self.worker.get_notifs()) & set(finished_req_ids), None")
    judgement = _judge(source).judge_context("PullConnector", Context("non_hma", None), [])
    assert judgement.verdict == "unknown", (judgement.verdict, judgement.reasons)
    assert any("PullConnector.request_finished delays" in r or "PullConnector.request_finished may return True" in r
               for r in judgement.reasons), judgement.reasons
    # the same class that never delays a free has nothing for a remote reader to read: safe
    never = _source("Unused:\n    pass", "Agent", start="pass",
                    finished="return set(self.worker.get_notifs()) & set(finished_req_ids), None", delay="False")
    assert _judge(never).judge_context("PullConnector", Context("non_hma", None), []).verdict == "safe"


@pytest.mark.slow
def test_get_transfer_results_that_bypasses_get_finished_leaves_get_finished_out_of_the_verdict(tmp_path) -> None:
    """DelayedFreeConnector (corpus) is safe with one group: get_finished waits before it reports. vLLM's
    runners call get_transfer_results; a subclass reporting from there at once must not inherit that safe."""
    base = (FIXTURES / "mro" / "corpus" / "deferred_delayed_free.py").read_text()
    early = textwrap.dedent("""

    class EarlyReporter(DelayedFreeConnector):
        def get_transfer_results(self, finished_req_ids):
            return KVConnectorTransferResults(finished_sending=set(finished_req_ids))

    class Wrapping(DelayedFreeConnector):
        def get_transfer_results(self, finished_req_ids):
            self._count = len(finished_req_ids)
            return super().get_transfer_results(finished_req_ids)
    """)
    path = tmp_path / "early.py"
    path.write_text(HEADER + base + early)  # read_files: the tracking set (`_saving_reqs`) is found by data flow
    judge = Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 120))
    single = Context("non_hma", None)
    assert judge.judge_context("DelayedFreeConnector", single, []).verdict == "safe"
    assert judge.judge_context("Wrapping", single, []).verdict == "safe"  # super() reaches the base's wrap
    reporter = judge.judge_context("EarlyReporter", single, [])
    assert reporter.verdict in ("unknown", "unsafe"), reporter.verdict
    assert reporter.labels["DelayedFreeConnector.get_finished"] == "unknown"
    assert reporter.verdict == "unsafe" or any("get_transfer_results" in r for r in reporter.reasons)
