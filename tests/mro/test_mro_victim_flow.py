"""Where a definition sends every entry of ``scheduler_output.preempted_req_ids`` (tools/mro/victim_flow.py), and
where a definition vLLM reads the return of changes what its ``super()`` call returned.

Each shape that keeps every victim id is paired with one that keeps only some, or none: a filter, a difference, a
trimmed copy, an early return of an empty metadata, a loop adding under a test, a field of the class's own."""
from __future__ import annotations

import ast
import textwrap

import pytest

from deferdump.tools.mro.victim_flow import WHOLE, metadata_fields, super_rewrites, victim_flow


def _flow(source: str) -> set[tuple[str, str]]:
    func = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(func, ast.FunctionDef)
    return set(victim_flow(func).out)


CARRIED = {
    "the value itself": "def f(self, so):\n    return so.preempted_req_ids\n",
    "a copy with a fallback": "def f(self, so):\n    return set(so.preempted_req_ids or ())\n",
    "a union with guesses": "def f(self, so):\n    official = set(so.preempted_req_ids or ())\n"
                            "    guessed = {r for r in self._live}\n    return official | guessed\n",
    "an unfiltered comprehension": "def f(self, so):\n    return {r for r in so.preempted_req_ids}\n",
    "getattr with a default": "def f(self, so):\n    return list(getattr(so, 'preempted_req_ids', ()))\n",
    "a loop adding each": "def f(self, so):\n    out = set()\n    for r in so.preempted_req_ids:\n"
                          "        out.add(r)\n    return out\n",
    "an update": "def f(self, so):\n    out = set()\n    out.update(so.preempted_req_ids or ())\n    return out\n",
    "a conditional copy with an empty fallback":
        "def f(self, so):\n    return set(so.preempted_req_ids) if so.preempted_req_ids else set()\n",
}

NOT_CARRIED = {
    "only measured": "def f(self, so):\n    return len(so.preempted_req_ids)\n",
    "a complement": "def f(self, so):\n    return self._live - set(so.preempted_req_ids)\n",
    "an intersection": "def f(self, so):\n    return set(so.preempted_req_ids) & self._dumped\n",
    "a filtered comprehension": "def f(self, so):\n    return {r for r in so.preempted_req_ids if r in self._dumped}\n",
    "a loop adding under a test": "def f(self, so):\n    out = set()\n    for r in so.preempted_req_ids:\n"
                                  "        if r in self._dumped:\n            out.add(r)\n    return out\n",
    "a trimmed copy": "def f(self, so):\n    out = set(so.preempted_req_ids)\n    out -= self._done\n    return out\n",
    "a copy with one taken out": "def f(self, so):\n    out = set(so.preempted_req_ids)\n"
                                 "    out.discard(self._last)\n    return out\n",
    "logged, then guesses returned": "def f(self, so):\n    official = set(so.preempted_req_ids)\n"
                                     "    logger.info('%s', official)\n    return self._guess()\n",
    "kept on self only": "def f(self, so):\n    self._recent.update(so.preempted_req_ids)\n    return self._guesses\n",
    "an early empty return": "def f(self, so):\n    if not so.num_scheduled_tokens:\n        return set()\n"
                             "    return set(so.preempted_req_ids)\n",
    "a self attribute of that name": "def f(self, so):\n    return self.preempted_req_ids\n",
}


@pytest.mark.parametrize("name", sorted(CARRIED))
def test_shapes_keeping_every_victim_are_carried(name: str) -> None:
    assert ("read", WHOLE) in _flow(CARRIED[name]), name


@pytest.mark.parametrize("name", sorted(NOT_CARRIED))
def test_shapes_keeping_only_some_or_none_are_not(name: str) -> None:
    assert not any(source == "read" for source, _ in _flow(NOT_CARRIED[name])), name


def test_fields_of_the_metadata_are_named() -> None:
    """Into a field of a local returned (``meta.preempted = ...``), a constructor keyword, a handed-in object's
    field; a helper's or ``super()``'s return is named for the caller to resolve."""
    assert ("read", "preempted") in _flow(
        "def f(self, so):\n    meta = Meta()\n    meta.preempted = set(so.preempted_req_ids or ())\n    return meta\n")
    assert ("read", "victims") in _flow("def f(self, so):\n    return Meta(dumps=[], victims=so.preempted_req_ids)\n")
    assert ("read", "preempted") in _flow("def f(self, meta, so):\n    meta.preempted.update(so.preempted_req_ids)\n")
    assert ("self:_select", "preempted") in _flow(
        "def f(self, so):\n    meta = Meta()\n    meta.preempted = self._select(so)\n    return meta\n")
    assert ("super:build_connector_meta", WHOLE) in _flow(
        "def f(self, so):\n    meta = super().build_connector_meta(so)\n    return meta\n")
    # a field of the class's own object is not the metadata
    assert not _flow("def f(self, so):\n    self._meta.preempted = set(so.preempted_req_ids)\n    return Meta()\n")


def test_the_fields_a_worker_reads_off_its_metadata() -> None:
    def fields(source: str) -> frozenset[str] | None:
        func = ast.parse(textwrap.dedent(source)).body[0]
        assert isinstance(func, ast.FunctionDef)
        return metadata_fields(func)

    assert fields("def handle_preemptions(self, m):\n    assert isinstance(m, Meta)\n    for r in m.preempted:\n"
                  "        self._settle(r)\n") == {"preempted"}
    assert fields("def handle_preemptions(self, m):\n    ids = getattr(m, 'victims', ())\n") == {"victims"}
    # handed on whole, or the object itself as getattr's fallback: any field may be the one read
    assert fields("def handle_preemptions(self, m):\n    self._drain(m)\n") is None
    assert fields("def handle_preemptions(self, m):\n    ids = getattr(m, 'victims', m)\n") is None


REWRITES = {
    "a field reassigned": "def build_connector_meta(self, so):\n    meta = super().build_connector_meta(so)\n"
                          "    meta.dumps = meta.dumps[:1]\n    return meta\n",
    "a field mutated": "def build_connector_meta(self, so):\n    meta = super().build_connector_meta(so)\n"
                       "    meta.dumps.pop()\n    return meta\n",
    "an answer changed": "def request_finished(self, request, block_ids):\n"
                         "    delay, params = super().request_finished(request, block_ids)\n"
                         "    if self._extra:\n        delay = True\n    return delay, params\n",
    "something else returned": "def get_finished(self, ids):\n    done, recv = super().get_finished(ids)\n"
                               "    return done - self._held, recv\n",
    "other arguments handed on": "def request_finished_all_groups(self, request, block_ids):\n"
                                 "    return super().request_finished_all_groups(request, tuple([] for _ in block_ids))\n",
    "a parameter rebound first": "def get_finished(self, finished_req_ids):\n"
                                 "    finished_req_ids = finished_req_ids - self._held\n"
                                 "    return super().get_finished(finished_req_ids)\n",
    "the result only looked at": "def request_finished(self, request, block_ids):\n"
                                 "    if super().request_finished(request, block_ids)[0]:\n"
                                 "        self._n += 1\n    return False, None\n",
}

UNCHANGED = {
    "returned at once": "def build_connector_meta(self, so):\n    self._n += 1\n"
                        "    return super().build_connector_meta(so)\n",
    "named, checked, returned": "def build_connector_meta(self, so):\n    meta = super().build_connector_meta(so)\n"
                                "    assert isinstance(meta, Meta)\n    logger.debug('%s', meta.dumps)\n    return meta\n",
    "its own arguments by keyword": "def request_finished(self, request, block_ids):\n"
                                    "    return super().request_finished(request=request, block_ids=block_ids)\n",
    "a pair returned as it came": "def get_finished(self, ids):\n    done, recv = super().get_finished(ids)\n"
                                  "    self._seen |= done or set()\n    return done, recv\n",
    "a method vLLM does not read the return of": "def wait_for_save(self):\n    x = super().wait_for_save()\n"
                                                 "    x.foo = 1\n",
}


@pytest.mark.parametrize("name", sorted(REWRITES))
def test_a_changed_super_result_is_reported(name: str) -> None:
    func = ast.parse(REWRITES[name]).body[0]
    assert isinstance(func, ast.FunctionDef)
    assert super_rewrites(func), name


@pytest.mark.parametrize("name", sorted(UNCHANGED))
def test_a_super_result_handed_back_as_it_came_is_not(name: str) -> None:
    func = ast.parse(UNCHANGED[name]).body[0]
    assert isinstance(func, ast.FunctionDef)
    assert super_rewrites(func) == (), name


def test_a_build_truncating_what_its_base_built_is_not_read_as_its_base() -> None:
    """EagerBudgetConnector (thirtieth blind round, keyed unsafe) cuts ``meta.dumps`` to a budget after its base
    tracked every planned request: read as ``super`` it passed; now ``unknown``. The opposite (the list only logged)
    is still its base's."""
    import tempfile
    from pathlib import Path

    from deferdump.tools.mro.hierarchy import build_hierarchy
    from deferdump.tools.mro.judge import Judge, ModelRunner
    from deferdump.tools.mro.source import read_files
    from deferdump.tools.mro.tla import ModelBounds

    original = (Path(__file__).parents[1] / "fixtures" / "mro" / "corpus" / "blind_victim_selection.py").read_text()
    cut = "        meta.dumps = ranked[:budget]\n"
    assert cut in original

    def label(text: str) -> tuple[str, tuple[str, ...]]:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "round30.py"
            path.write_text(text, encoding="utf-8")
            judge = Judge(build_hierarchy(read_files([path])), ModelRunner(ModelBounds(), 60))
            found = judge.reader.label("EagerBudgetConnector", "EagerBudgetConnector", "build_connector_meta")
            return found.label, found.reasons

    verdict, reasons = label(original)
    assert verdict == "unknown" and "changes `meta.dumps`" in reasons[0], reasons
    assert label(original.replace(cut, "        logger.debug('%d ranked', len(ranked))\n"))[0] == "super"
