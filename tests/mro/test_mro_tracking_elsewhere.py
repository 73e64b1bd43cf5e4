"""A worker that tracks its requests outside ``wait_for_save``: the twenty-ninth blind round's
``StageLocalTrackingConnector`` tracks in ``save_kv_layer`` after a replica rank's return, so under MLA a replica rank
never reports and the request's delayed free never comes (vLLM's aggregator waits for every rank). It was judged
**safe** under MLA for two reasons, each with a rule here and its opposite:

* its ``wait_for_save`` re-stores each request's remaining copies under the id it iterates
  (``for r, copies in list(self._pending.items()): ... self._pending[r] = left``), which read as adding requests to a
  tracking set: the save read as the model's tracking ``wait_for_save``;
* with that fixed, the save is ``unknown`` ("does not record the step's dump requests"), and the model's worst reading
  of it tracks on every rank: under MLA a pass of that reading proves nothing."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.behaviour import UNTRACKED_SAVE
from deferdump.tools.mro.source import read_source

from test_mro_blind_round26 import _judge, _labels
from test_mro_blind_round29 import RANK_PRELUDE
from test_mro_blind_round6 import HEADER, PROTOCOL

#: Tracks in the per-layer save after the replica return; wait_for_save only reaps (re-keys what is left).
TRACKS_IN_THE_LAYER_SAVE = """
def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
    if get_tensor_model_parallel_rank() != 0:
        return
    meta = self._get_connector_metadata()
    self._async_dump_req_ids.update(meta.saving)
    task = self.store.dump(meta.blocks)
    for req_id in meta.saving:
        self._by_req.setdefault(req_id, []).append(task)
def wait_for_save(self):
    for req_id, tasks in list(self._by_req.items()):
        left = [t for t in tasks if not self.store.check(t)]
        if left:
            self._by_req[req_id] = left
        else:
            del self._by_req[req_id]
"""

#: The opposite: the same store into ``self._by_req`` keyed by the step's requests (not the ids it iterates) adds.
KEYED_BY_THE_STEP = TRACKS_IN_THE_LAYER_SAVE.replace("""def wait_for_save(self):
    for req_id, tasks in list(self._by_req.items()):
        left = [t for t in tasks if not self.store.check(t)]
        if left:
            self._by_req[req_id] = left
        else:
            del self._by_req[req_id]""", """def wait_for_save(self):
    meta = self._get_connector_metadata()
    for req_id in meta.saving:
        self._by_req[req_id] = []""")


def _ops(hooks: str, attr: str) -> frozenset[str]:
    source = PROTOCOL.format(hooks=textwrap.indent(textwrap.dedent(hooks), "    "))
    facts = read_source(HEADER + RANK_PRELUDE + textwrap.dedent(source), "<t>")["Proto"].methods["wait_for_save"]
    return dict(facts.attr_ops)[attr]


def test_re_storing_the_entries_a_loop_iterates_is_not_tracking() -> None:
    label = _labels(TRACKS_IN_THE_LAYER_SAVE, prelude=RANK_PRELUDE)["Proto.wait_for_save"]
    assert label.label == "unknown" and UNTRACKED_SAVE in label.reasons[0], label
    assert "add" not in _ops(TRACKS_IN_THE_LAYER_SAVE, "_by_req")
    assert "add" in _ops(KEYED_BY_THE_STEP, "_by_req")  # keyed by the step's requests: new entries


def test_a_save_that_does_not_track_proves_nothing_under_mla() -> None:
    judge = _judge(TRACKS_IN_THE_LAYER_SAVE, prelude=RANK_PRELUDE)
    mla = judge.judge("Proto", cases=["mla"]).judgements[0]
    assert mla.verdict == "unknown" and any(UNTRACKED_SAVE in r for r in mla.reasons), (mla.verdict, mla.reasons)


def test_the_prs_tracking_save_stays_safe_under_mla() -> None:
    """The opposite: the protocol fixture's ``wait_for_save`` tracks on every rank; the rule leaves it safe."""
    mla = _judge("").judge("Proto", cases=["mla"]).judgements[0]
    assert mla.verdict == "safe", (mla.verdict, mla.reasons)
