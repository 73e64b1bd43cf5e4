"""Where a definition sends every entry of ``scheduler_output.preempted_req_ids`` (tools/mro/victim_flow.py).

Each shape that keeps every victim id is paired with one that keeps only some, or none: a filter, a difference, a
trimmed copy, an early return of an empty metadata, a loop adding under a test, a field of the class's own."""
from __future__ import annotations

import ast
import textwrap

import pytest

from deferdump.tools.mro.victim_flow import WHOLE, metadata_fields, victim_flow


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
    "an |= into an empty set": "def f(self, so):\n    out = set()\n    out |= set(so.preempted_req_ids or ())\n"
                               "    return out\n",
    "grown by a union with itself": "def f(self, so):\n    out = set(so.preempted_req_ids or ())\n"
                                    "    out = out | self._guesses\n    return out\n",
    "an update": "def f(self, so):\n    out = set()\n    out.update(so.preempted_req_ids or ())\n    return out\n",
    "two loops under one name": "def f(self, so):\n    out = set()\n    for r in so.preempted_req_ids or ():\n"
                                "        out.add(r)\n    for r in self._other:\n        self._seen.discard(r)\n"
                                "    return out\n",
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
    "rebound to guesses": "def f(self, so):\n    victims = set(so.preempted_req_ids)\n"
                          "    victims = self._guess()\n    return victims\n",
    "emptied under a test": "def f(self, so):\n    victims = set(so.preempted_req_ids)\n    if self._quiet:\n"
                            "        victims = set()\n    return victims\n",
    "a cache first": "def f(self, so):\n    return self._cached or set(so.preempted_req_ids)\n",
    "behind a switch": "def f(self, so):\n    return self._fence and set(so.preempted_req_ids)\n",
    "empty unless a switch": "def f(self, so):\n    return set(so.preempted_req_ids) if self._fence else set()\n",
    "a field stored twice": "def f(self, so):\n    meta = Meta()\n    meta.preempted = set(so.preempted_req_ids)\n"
                            "    meta.preempted = self._guess()\n    return meta\n",
    "only in a nested function": "def f(self, so):\n    def g():\n        return set(so.preempted_req_ids)\n"
                                 "    return self._guess()\n",
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
    # another field set in a tuple assignment leaves the victims' field as it was
    assert ("read", "preempted") in _flow(
        "def f(self, so):\n    meta = Meta(preempted=set(so.preempted_req_ids or ()))\n"
        "    meta.flushes, self._pending = self._pending, []\n    return meta\n")
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

