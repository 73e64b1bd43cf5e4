"""The protocol core's coverage leaves out load paths only where the code says so, and only the ones named here:
the asynchronous-load branches inside core methods (conformance has no async-load model yet)."""
from __future__ import annotations

import inspect
import re

from deferdump.conformance.corecov import LOAD_PATH_MARK, measure_core_coverage
from deferdump.reference import connectors

MARKED = [
    "for req_id, plan in self._request_plans.items():",  # build_connector_meta: parked requests' async loads
    "if request.req_id in self._recving_req_ids:",  # request_finished: an abort while an async load runs
]


def test_only_the_async_load_branches_are_marked_as_load_paths() -> None:
    source = inspect.getsource(connectors)
    marked = [line.split("#")[0].strip() for line in source.splitlines() if re.search(LOAD_PATH_MARK, line)]
    assert marked == MARKED


def test_marked_lines_and_their_blocks_are_not_counted() -> None:
    _, with_mark = measure_core_coverage(lambda: None)
    lines = inspect.getsource(connectors).splitlines()
    marked_numbers = {number for number, line in enumerate(lines, start=1) if re.search(LOAD_PATH_MARK, line)}
    missed_lines = {int(m.group(1)) for entry in with_mark.missed for m in [re.search(r"line (\d+) not run", entry)] if m}
    assert marked_numbers and not (marked_numbers & missed_lines)
    assert not any(f"branch {n} ->" in entry for entry in with_mark.missed for n in marked_numbers)
    assert with_mark.statements > 100  # nothing else went: the core is still the whole deferred-dump mechanism
