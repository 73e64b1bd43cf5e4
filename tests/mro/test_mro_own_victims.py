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


# -- victims that do not visibly carry vLLM's ids to the field the workers read (own_victims.unshipped_victims) --------
import tempfile  # noqa: E402,F401
from pathlib import Path  # noqa: E402

from deferdump.tools.mro.hierarchy import build_hierarchy  # noqa: E402
from deferdump.tools.mro.judge import Judge, ModelRunner  # noqa: E402
from deferdump.tools.mro.source import read_files  # noqa: E402
from deferdump.tools.mro.tla import ModelBounds  # noqa: E402

UNSHIPPED = "nothing Proto.build_connector_meta ships there visibly holds every id"
#: vLLM's ids, as VLLM_IDS ships them
IDS = "    victims = set(scheduler_output.preempted_req_ids or ())\n"


def test_victims_of_the_class_own_choosing_make_a_pass_prove_nothing() -> None:
    """The thirtieth blind round's victim rules (ScheduledDiffConnector: a diff of scheduled sets; a filter of vLLM's
    ids; a copy trimmed afterwards; the ids put in a field handle_preemptions never reads): each passed the model,
    now ``unknown`` with the reason."""
    assert IDS in VLLM_IDS
    shapes = {
        "own guesses": "    victims = set(self._short)\n",
        "a filter": "    victims = {r for r in scheduler_output.preempted_req_ids or () if r in self._short}\n",
        "a trimmed copy": IDS + "    victims -= set(self._short)\n",
        "rebound": IDS + "    victims = set(self._short)\n",
    }
    for name, body in shapes.items():
        verdict, reasons = _single(VLLM_IDS.replace(IDS, body))
        assert verdict == "unknown", (name, verdict, reasons)
        assert any(UNSHIPPED in r for r in reasons), (name, reasons)
    elsewhere = VLLM_IDS.replace("preempted_req_ids=victims)", "preempted_req_ids=set(), official=victims)")
    assert elsewhere != VLLM_IDS
    verdict, reasons = _single(elsewhere)
    assert verdict == "unknown" and any(UNSHIPPED in r for r in reasons), (verdict, reasons)


def test_vllms_ids_with_guesses_added_keep_the_verdict() -> None:
    """LoggedVictimConnector's shape (thirtieth blind round, keyed safe): vLLM's ids united with a mirror's guesses."""
    verdict, reasons = _single(VLLM_IDS.replace(IDS, IDS + "    victims = victims | set(self._short)\n"))
    assert verdict == "unknown" or verdict == "safe", reasons
    assert not any(UNSHIPPED in r for r in reasons), reasons


def test_a_worker_waiting_more_than_the_victims_is_no_counterexample() -> None:
    """PreforwardTrackerStore (a blind round's, keyed safe with one group) waits ``meta.preempted | meta.finished``
    before the forward: a fence over finish frees the model's ``wait_preempted`` lacks. Its failure is undecided;
    DeferredTrackerStore (reads ``meta.preempted`` alone) is not touched by the rule."""
    from deferdump.tools.mro.own_victims import widened_victims

    path = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_request_tracker.py"
    judge = Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 60))
    why = widened_victims(judge.reader, "PreforwardTrackerStore")
    assert why and "meta.finished" in why[0], why
    assert widened_victims(judge.reader, "DeferredTrackerStore") == ()
    judgement = judge.judge("PreforwardTrackerStore", cases=["single"]).judgements[0]
    assert judgement.verdict == "unknown", (judgement.verdict, judgement.reasons)
