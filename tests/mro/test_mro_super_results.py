"""An override handing vLLM something other than what its ``super()`` call returned (tools/mro/super_results.py):
each changed shape is paired with one that hands the result back as it came."""
from __future__ import annotations

import ast

import pytest

from deferdump.tools.mro.super_results import super_rewrites


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
