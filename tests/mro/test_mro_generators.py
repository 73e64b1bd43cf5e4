"""A helper that yields runs none of its body when called: only iterating what it returns runs it. The
fourth blind round's ``LayerStreamConnector`` waits a preempted request's dumps in such a helper and drops
the generator in ``handle_preemptions``, so nothing is waited; reading the call as a wait judged the class
safe with one KV-cache group, where it is unsafe (no TLC here: labels and effects only)."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.behaviour import UNKNOWN, EffectReader
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.source import read_source

HEADER = "from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1\n"


def _connector(call: str, drain_body: str = "yield task") -> str:
    return textwrap.dedent(f"""
    class C(KVConnectorBase_V1):
        def _drain(self, req_ids):
            for req_id in list(self._tasks):
                if req_id in req_ids:
                    task = self._tasks.pop(req_id)
                    self.store.wait(task)
                    {drain_body}

        def handle_preemptions(self, metadata):
            preempted = metadata.preempted_req_ids
            {call}
    """)


def _label_and_calls(source: str) -> tuple[str, tuple[str, ...], frozenset[str]]:
    hierarchy = build_hierarchy(read_source(HEADER + source, "<t>"))
    reader = EffectReader(hierarchy)
    label = reader.label("C", "C", "handle_preemptions")
    return label.label, label.reasons, reader.effect("C", "C", "handle_preemptions").calls


def test_a_dropped_generator_runs_nothing_so_its_waits_are_not_the_callers() -> None:
    label, reasons, calls = _label_and_calls(_connector("self._drain(preempted)"))
    assert "wait" not in calls
    assert label != "wait_preempted"


def test_a_generator_iterated_to_its_end_is_the_callers_work() -> None:
    for call in ("self.failed.update(self._drain(preempted))", "list(self._drain(preempted))",
                 "[x for x in self._drain(preempted)]", "for _ in self._drain(preempted): pass"):
        label, reasons, calls = _label_and_calls(_connector(call))
        assert "wait" in calls, call
        assert not any("generator" in r for r in reasons), (call, reasons)


def test_a_generator_kept_or_half_iterated_is_unknown_and_says_why() -> None:
    for call in ("self._later = self._drain(preempted)", "next(self._drain(preempted))",
                 "self.failed.update(x for x in self._drain(preempted))",
                 "any(self._drain(preempted))"):
        label, reasons, _ = _label_and_calls(_connector(call))
        assert label == UNKNOWN, call
        assert any("generator self._drain()" in r for r in reasons), (call, reasons)


def test_a_plain_helper_called_as_a_statement_still_runs() -> None:
    """Without a ``yield`` the helper is an ordinary call: its waits are the caller's."""
    label, reasons, calls = _label_and_calls(_connector("self._drain(preempted)", drain_body="pass"))
    assert "wait" in calls
    assert not any("generator" in r for r in reasons)
