"""Block tables a connector keeps across steps (tools/mro/block_tables.py): one extended with ``new_block_ids``
where no test reads ``resumed_req_ids`` goes on, after a preemption, with ids vLLM freed (for a resumed request
vLLM 0.32 sends the whole new table in that field). The model's dumps read each request's current blocks, so a
pass proves nothing there: the twenty-ninth blind round's ``ResumeAppendDumpConnector`` (appends always, in a helper
it hands the ids to) and ``LegacyResumeFlagConnector`` (decides the resume by ``resumed_from_preemption``, which vLLM
0.32 lacks) were judged **safe**; each rule has an opposite that keeps its verdict."""
from __future__ import annotations

import ast
import textwrap

from deferdump.tools.mro.block_tables import NEW_BLOCKS_FIELD, RESUMED_FIELD, table_extensions, unreplaced_tables
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.source import _own_nodes, read_source

from test_mro_blind_round26 import _judge
from test_mro_blind_round6 import HEADER, PROTOCOL

#: Keeps each request's block table across steps and appends what every step sends.
APPEND_ALWAYS = """
def build_connector_meta(self, scheduler_output):
    cached = scheduler_output.scheduled_cached_reqs
    for i, req_id in enumerate(cached.req_ids):
        table = self._tables.setdefault(req_id, [])
        new_ids = cached.new_block_ids[i]
        if new_ids is not None:
            table.extend(new_ids[0])
    self._async_dump_req_ids.update(scheduler_output.saving)
    return scheduler_output
"""

#: The opposite: a resumed request's table is replaced (vLLM 0.32's own comment, output.py ~138-142).
REPLACE_ON_RESUME = APPEND_ALWAYS.replace("""        if new_ids is not None:
            table.extend(new_ids[0])""", """        if new_ids is not None and req_id in cached.resumed_req_ids:
            self._tables[req_id] = list(new_ids[0])
        elif new_ids is not None:
            table.extend(new_ids[0])""")

#: The opposite, reset first: ``if resumed: self._t[r] = []`` before the extension, which no ``else`` holds.
RESET_THEN_APPEND = APPEND_ALWAYS.replace("""        table = self._tables.setdefault(req_id, [])
""", """        if req_id in cached.resumed_req_ids:
            self._tables[req_id] = []
        table = self._tables.setdefault(req_id, [])
""")

#: The ids handed to a helper that appends them whatever the flag it is given says (ResumeAppendDumpConnector).
HELPER_APPENDS = """
def _refresh(self, tracker, new_ids, resumed):
    if resumed:
        logger.debug("resumed")
    tracker.extend(new_ids)
def build_connector_meta(self, scheduler_output):
    cached = scheduler_output.scheduled_cached_reqs
    for i, req_id in enumerate(cached.req_ids):
        tracker = self._tables.get(req_id)
        new_ids = cached.new_block_ids[i]
        if tracker is not None and new_ids is not None:
            self._refresh(tracker, new_ids[0], req_id in cached.resumed_req_ids)
    self._async_dump_req_ids.update(scheduler_output.saving)
    return scheduler_output
"""

#: The opposite: the helper replaces the table when the flag its caller computed from resumed_req_ids says so.
HELPER_REPLACES = HELPER_APPENDS.replace("""    if resumed:
        logger.debug("resumed")
    tracker.extend(new_ids)""", """    if resumed:
        tracker[:] = new_ids
    else:
        tracker.extend(new_ids)""")

#: The resume decided by a helper reading a field vLLM 0.32's CachedRequestData does not have (LegacyResumeFlag).
LEGACY_FLAG = REPLACE_ON_RESUME.replace("req_id in cached.resumed_req_ids", "self._is_resumed(cached, i, req_id)") + """
def _is_resumed(self, cached, i, req_id):
    flags = getattr(cached, "resumed_from_preemption", None)
    return bool(flags[i]) if flags is not None else False
"""

#: The opposite: the same helper reading resumed_req_ids.
CURRENT_FLAG = LEGACY_FLAG.replace('''    flags = getattr(cached, "resumed_from_preemption", None)
    return bool(flags[i]) if flags is not None else False''', '''    return req_id in cached.resumed_req_ids''')

#: Not a table: each step's ids go into a record of this step's metadata (``meta.dumps.append((r, ids))``).
RECORDS = """
def build_connector_meta(self, scheduler_output):
    meta = self._get_connector_metadata()
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, new_ids in zip(cached.req_ids, cached.new_block_ids):
        job = dict(req_id=req_id, blocks=new_ids)
        self._short.append((req_id, new_ids))
        self._short.append(job)
    self._async_dump_req_ids.update(scheduler_output.saving)
    return scheduler_output
"""


def _stale(hooks: str) -> tuple[str, ...]:
    source = PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(hooks), "    "))
    return unreplaced_tables(build_hierarchy(read_source(HEADER + textwrap.dedent(source), "<t>")), "Proto")


def test_a_table_appended_with_new_block_ids_and_no_resume_test_is_stale_after_a_preemption() -> None:
    why = _stale(APPEND_ALWAYS)
    assert len(why) == 1 and NEW_BLOCKS_FIELD in why[0] and RESUMED_FIELD in why[0] and "Proto.build_connector_meta" \
        in why[0], why
    single = _judge(APPEND_ALWAYS).judge("Proto", cases=["single"]).judgements[0]
    assert single.verdict == "unknown" and any(RESUMED_FIELD in r for r in single.reasons), single.reasons


def test_a_table_replaced_or_reset_on_a_resume_keeps_the_verdict() -> None:
    for hooks in (REPLACE_ON_RESUME, RESET_THEN_APPEND):
        assert _stale(hooks) == (), hooks
    assert _judge(REPLACE_ON_RESUME).judge("Proto", cases=["single"]).judgements[0].verdict == "safe"


def test_ids_handed_to_a_helper_that_appends_whatever_its_flag_says_are_stale() -> None:
    why = _stale(HELPER_APPENDS)
    assert len(why) == 1 and "Proto._refresh" in why[0] and "handed them by Proto.build_connector_meta" in why[0], why
    assert _stale(HELPER_REPLACES) == ()  # the flag the caller reads from resumed_req_ids decides the extension


def test_a_resume_decided_by_a_field_vllm_does_not_have_is_no_resume_test() -> None:
    why = _stale(LEGACY_FLAG)
    assert len(why) == 1 and "Proto.build_connector_meta" in why[0], why
    assert _stale(CURRENT_FLAG) == ()
    assert _judge(LEGACY_FLAG).judge("Proto", cases=["single"]).judgements[0].verdict == "unknown"


def test_records_holding_a_steps_ids_are_not_a_table() -> None:
    assert _stale(RECORDS) == ()
    assert _judge(RECORDS).judge("Proto", cases=["single"]).judgements[0].verdict == "safe"


def test_a_list_the_call_builds_or_a_parameter_no_caller_keeps_is_not_a_kept_table() -> None:
    """``tables = [...]`` built in the call, and a helper appending to a parameter (``meta``) its caller fills afresh,
    keep nothing from before a preemption."""
    func = ast.parse(textwrap.dedent("""
    def build(self, cached):
        tables = [[] for _ in range(2)]
        for g, ids in enumerate(cached.new_block_ids[0]):
            tables[g].extend(ids)
        return tables
    """)).body[0]
    assert table_extensions(func, list(_own_nodes(func))) == ()  # type: ignore[arg-type]
    helper_to_meta = """
    def _plan(self, meta, ids):
        for block in ids:
            meta.append(block)
    def build_connector_meta(self, scheduler_output):
        meta = []
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            self._plan(meta, cached.new_block_ids[i][0])
        self._async_dump_req_ids.update(scheduler_output.saving)
        return scheduler_output
    """
    assert _stale(helper_to_meta) == ()
    assert _stale(helper_to_meta.replace("meta = []", "meta = self._tables.get('r')")) != ()
