"""A scheduler side that ships preemption victims of its own choosing (tools/mro/own_victims.py, facts
``preempted_reads`` from ``attribute_reads`` in tools/mro/ast_helpers.py). The twenty-ninth blind round's
``RunningOrderConnector`` reads ``preempted_req_ids`` only for its length and pops that many requests off the tail of
an admission-order mirror: under vLLM's priority policy those are not the victims, so the workers wait the wrong
dumps. It was judged **safe** with one group and as a child; a pass now proves nothing. The opposites (the ids
themselves shipped, a length logged beside them) keep their verdicts."""
from __future__ import annotations

from test_mro_blind_round26 import _judge

#: The victims popped off a mirror of admissions, as many as vLLM preempted.
MIRROR = """
def build_connector_meta(self, scheduler_output):
    self._async_dump_req_ids.update(scheduler_output.saving)
    victims = set()
    for _ in range(len(scheduler_output.preempted_req_ids or ())):
        if self._short:
            victims.add(self._short.pop())
    self._short.extend(scheduler_output.saving)
    return Meta(saving=scheduler_output.saving, blocks=scheduler_output.blocks, preempted_req_ids=victims)
"""

#: The opposite: vLLM's own ids shipped.
VLLM_IDS = MIRROR.replace("""    victims = set()
    for _ in range(len(scheduler_output.preempted_req_ids or ())):
        if self._short:
            victims.add(self._short.pop())
""", """    victims = set(scheduler_output.preempted_req_ids or ())
""")

#: The opposite: a length logged beside the ids shipped.
LOGGED_LENGTH = VLLM_IDS.replace("    victims = set(", """    logger.debug("%d preempted", len(scheduler_output.preempted_req_ids))
    victims = set(""")


def _single(hooks: str) -> tuple[str, tuple[str, ...]]:
    judgement = _judge(hooks).judge("Proto", cases=["single"]).judgements[0]
    return judgement.verdict, judgement.reasons


def test_victims_taken_from_a_mirror_make_a_pass_prove_nothing() -> None:
    verdict, reasons = _single(MIRROR)
    assert verdict == "unknown", (verdict, reasons)
    assert any("reads scheduler_output.preempted_req_ids only for its length" in r for r in reasons), reasons


def test_shipping_vllms_ids_keeps_the_verdict() -> None:
    for hooks in (VLLM_IDS, LOGGED_LENGTH):
        verdict, reasons = _single(hooks)
        assert not any("only for its length" in r for r in reasons), reasons
        assert verdict == "safe", reasons
