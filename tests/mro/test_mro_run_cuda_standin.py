"""`--run` on a connector that records a CUDA event around each dump, on a machine without CUDA: the class
must really dump in the replay (`tools/mro/run/cuda_standin.py`), or its counterexample is withdrawn for a
reason that is the machine's, not the class's (the fourteenth blind round's `UCMStyleDirectConnector`: reading
unsafe on the hybrid model, its key unsafe, `--run` unknown because `torch.cuda.Event()` raised inside its
`try` and no dump was ever submitted)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deferdump.tools.mro.run.cuda_standin import cuda_standins
from deferdump.tools.mro.run.runner import run_report
from support.mro import RUN_TIMEOUT, judge_cases

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the stand-ins apply where CUDA is absent")

_EVENTS = '''
import torch
from blockstore_client import BlockStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata


class SaveMeta(KVConnectorMetadata):
    def __init__(self, stores):
        self.stores = stores


class EventDumps(KVConnectorBase_V1):
    """Delayed frees and waits in get_finished, no handle_preemptions: a preemption frees blocks a dump still
    reads. Each dump records an event first, as UCM's do; a failure to make one skips the dump."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.store = BlockStore()
        self._saving_reqs = set()
        self._inflight = []
        self._events = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def build_connector_meta(self, scheduler_output):
        stores = [(new.req_id, list(new.block_ids[0])) for new in scheduler_output.scheduled_new_reqs]
        self._saving_reqs.update(rid for rid, _ in stores)
        return SaveMeta(stores)

    def request_finished(self, request, block_ids):
        if request.request_id in self._saving_reqs:
            self._saving_reqs.discard(request.request_id)
            return True, None
        return False, None

    def wait_for_save(self):
        for rid, blocks in self._get_connector_metadata().stores:
            try:
                event = torch.cuda.Event()
                event.record()
                task = self.store.dump(blocks, rid)
            except Exception:
                continue
            self._events[rid] = event
            self._saving_reqs.add(rid)
            self._inflight.append((task, {rid}))

    def get_finished(self, finished_req_ids):
        done = finished_req_ids & self._saving_reqs
        for entry in list(self._inflight):
            if entry[1] & done:
                self.store.wait(entry[0])
                self._inflight.remove(entry)
        self._saving_reqs -= done
        return done or None, None
'''


def test_the_standins_replace_cuda_events_and_streams_only_inside_the_block() -> None:
    with pytest.raises(RuntimeError):
        torch.cuda.Event()
    with cuda_standins() as applied:
        assert applied
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream())
        assert event.query() and torch.cuda.Stream().query()
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.synchronize()
    with pytest.raises(RuntimeError):  # the real (dummy) class is back
        torch.cuda.Event()


_LAZY = """
import sys
from deferdump.tools.mro.run.cuda_standin import CpuEvent, cuda_standins
assert "torch" not in sys.modules
with cuda_standins() as applied:
    assert not applied and "torch" not in sys.modules  # the block itself imports nothing
    def save():  # a connector importing torch in a method body, inside the block
        import torch
        return torch.cuda.Event(enable_timing=True)
    event = save()
    assert isinstance(event, CpuEvent) and event.query()
import torch
assert torch.cuda.Event is not CpuEvent  # the real class is back after the block
try:
    torch.cuda.Event()
except RuntimeError:
    print("restored")
"""


def test_a_child_that_never_imports_torch_does_not_pay_for_it_and_one_that_does_gets_the_standins() -> None:
    """A replay or exploration child runs every class inside ``cuda_standins``; most classes never import torch,
    whose import was 1.4 s of a child's 2 s. The stand-ins go in when torch is imported, wherever that happens."""
    done = subprocess.run([sys.executable, "-c", _LAZY], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "restored", done.stderr


def test_a_class_recording_cuda_events_around_its_dumps_is_replayed_and_its_hazard_confirmed(tmp_path: Path) -> None:
    path = tmp_path / "connectors.py"
    path.write_text(_EVENTS, encoding="utf-8")
    report = run_report(judge_cases([path], {"EventDumps": ["single"]}), [path], ("blockstore_client",),
                        timeout=RUN_TIMEOUT)
    (single,) = report.connectors["EventDumps"].judgements
    assert (single.verdict, single.source) == ("unsafe", "reading, replayed"), (single.reasons, single.run)
