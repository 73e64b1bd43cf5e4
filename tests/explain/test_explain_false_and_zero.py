"""The explain binding keeps TLA+ values FALSE and 0 (TRUE and 1) apart, as TLC does: Python merges them."""
from __future__ import annotations

from deferdump.tools.explain import binding
from deferdump.tools.explain.trace import make_steps
from deferdump.tools.tlc.values import Record, TlaFunction, TlaSet, Tup


def _forward(*writes: tuple[object, object, object]) -> Record:
    call = Record(name="forward", writes=TlaSet(Tup(w) for w in writes))
    return Record(name="execute_model", ranks=TlaFunction([(1, Tup((call,)))]))


def test_set_variables_keep_false_and_zero_apart() -> None:
    (step,) = make_steps([{"schedAsync": TlaSet([False, 0]), "reqState": TlaFunction([(False, "done"), (0, "done")])}])
    assert len(binding._set(step, "schedAsync")) == 2
    offences = binding.sched_tracks_unfinished([step], 0)
    assert len(offences) == 2  # one per tracked id: a frozenset would have reported one
    assert {o.text.split()[4] for o in offences} == {"no", "0"}


def test_block_writes_keep_block_false_apart_from_block_zero() -> None:
    state = {"blocksOf": TlaFunction([("r1", Tup((False, 0)))]), "pending": TlaFunction([(1, TlaSet())])}
    init, step = make_steps([state, {**state, "action": _forward((False, "r1", 1), (0, "r1", 2))}])
    written = binding._writes(step)
    assert len(written) == 2 and written[False] == ("r1", 1) and written[0] == ("r1", 2)
    assert len(binding._blocks(step)) == 2
    assert binding._owner(init, 0) == ("r1", 2) and binding._owner(init, False) == ("r1", 1)
    assert binding.version([init, step], 0, 1) == (1, ("r1", 2))


def test_overwrite_of_block_zero_is_not_reported_for_a_task_reading_block_false() -> None:
    task = Record(id=1, status="running", reqs=TlaSet(["r1"]), blocks=TlaSet([False]), layer=0, event=1)
    before = {"pending": TlaFunction([(1, TlaSet([task]))]), "blocksOf": TlaFunction([("r1", Tup((False, 0)))])}
    steps = make_steps([before, {**before, "action": _forward((0, "r1", 2))}])
    assert binding.overwrites(steps, 1) == []  # the task reads FALSE, the forward wrote 0
    steps = make_steps([before, {**before, "action": _forward((False, "r1", 1))}])
    assert [block for _, _, block in binding.overwrites(steps, 1)] == [False]


def test_same_task_compares_as_tla_plus() -> None:
    a = Record(id=0, reqs=TlaSet(["r1"]), blocks=TlaSet([1]), layer=0)
    assert binding._same_task(a, a) and not binding._same_task(a, a.replace(id=False))
    assert not binding._same_task(a, a.replace(blocks=TlaSet([True])))
