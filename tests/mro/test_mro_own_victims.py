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
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from deferdump.tools.mro.hierarchy import build_hierarchy  # noqa: E402
from deferdump.tools.mro.judge import Judge, ModelRunner  # noqa: E402
from deferdump.tools.mro.source import read_files  # noqa: E402
from deferdump.tools.mro.tla import ModelBounds  # noqa: E402

#: The thirtieth blind round's file: one protocol, victims chosen five ways (index.json says which are right).
ROUND30 = Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_victim_selection.py"
#: FullAttentionDumpConnector's own choice: vLLM's ids, as they came.
OFFICIAL = "        return set(so.preempted_req_ids or ())\n"
UNSHIPPED = "nothing FullAttentionDumpConnector.build_connector_meta ships there visibly holds every id"


def _round30(victims: str = OFFICIAL, *, field: str = "preempted") -> tuple[str, tuple[str, ...]]:
    """FullAttentionDumpConnector with its ``_select_victims`` body replaced, judged with one group (read as a file:
    its tracking sets are found by data flow across the file's classes)."""
    text = ROUND30.read_text(encoding="utf-8")
    assert OFFICIAL in text
    text = text.replace(OFFICIAL, victims, 1)
    if field != "preempted":
        text = text.replace("        meta.preempted = self._select_victims(so, scheduled)\n",
                            f"        meta.{field} = self._select_victims(so, scheduled)\n", 1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / ROUND30.name
        path.write_text(text, encoding="utf-8")
        judge = Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 60))
    judgement = judge.judge("FullAttentionDumpConnector", cases=["single"]).judgements[0]
    return judgement.verdict, judgement.reasons


def test_vllms_victims_shipped_through_a_helper_are_judged() -> None:
    """The round's FullAttentionDumpConnector: ``meta.preempted = self._select_victims(...)``, the helper returning
    ``set(so.preempted_req_ids or ())``, its workers reading ``meta.preempted``: safe (keyed safe)."""
    verdict, reasons = _round30()
    assert verdict == "safe", reasons


def test_victims_of_the_class_own_choosing_make_a_pass_prove_nothing() -> None:
    """ScheduledDiffConnector's diff (keyed unsafe), a filter of vLLM's ids, a complement, a trimmed copy, and vLLM's
    ids put in a field the workers do not read: each passed the model, now ``unknown`` with the reason."""
    shapes = {
        "a diff of scheduled sets": "        gone = self._running_prev - scheduled\n        return gone\n",
        "a filter": "        return {r for r in so.preempted_req_ids if r in self._dumped}\n",
        "logged, guesses returned": "        official = set(so.preempted_req_ids or ())\n"
                                    "        logger.info('%s', official)\n        return set(self._running[-1:])\n",
        "a trimmed copy": "        out = set(so.preempted_req_ids or ())\n        out -= set(so.finished_req_ids)\n"
                          "        return out\n",
    }
    for name, body in shapes.items():
        verdict, reasons = _round30(body)
        assert verdict == "unknown", (name, verdict, reasons)
        assert any(UNSHIPPED in r for r in reasons), (name, reasons)
    verdict, reasons = _round30(field="official")  # right ids, a field handle_preemptions never reads
    assert verdict == "unknown" and any(UNSHIPPED in r for r in reasons), (verdict, reasons)


def test_vllms_ids_with_guesses_added_keep_the_verdict() -> None:
    """LoggedVictimConnector's shape (keyed safe): vLLM's ids united with a mirror's guesses (extra waits only)."""
    verdict, reasons = _round30("        official = set(so.preempted_req_ids or ())\n"
                                "        return official | {r for r in self._running if r not in scheduled}\n")
    assert verdict == "safe", reasons


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
