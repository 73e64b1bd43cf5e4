"""The connector contract's core properties, checked on a watching wrapper's boundary log.

Connector-agnostic (delayed free, flush on reuse and reference-count pinning all pass):
- `finished_sending`: names only a request whose free the connector delayed (`request_finished` returned
  True), once per life of the request;
- no block of a delayed, unreported request is handed out from the free pool to another request (local
  prefix-cache hits are shared read-only and allowed);
- in a drained run every delayed request is reported by the end.
Read from the scheduler's file (where vLLM's decisions and the aggregated worker output are seen).
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deferdump.tools.watch.fresh import step_fresh_blocks


@dataclass(frozen=True)
class BoundaryVerdict:
    """`ok`, or the property broken (`property`), why (`detail`) and the first bad event (`event`)."""

    ok: bool
    property: str = ""
    detail: str = ""
    event: dict[str, Any] | None = None


@dataclass
class _State:
    delayed: dict[str, set[int]] = field(default_factory=dict)  # delayed, unreported: request -> its blocks
    local_hits: dict[str, int] = field(default_factory=dict)


def read_scheduler_events(log_dir: Path) -> list[dict[str, Any]]:
    """The scheduler file's events in order (one engine's run)."""
    files = sorted(Path(log_dir).glob("scheduler-*.ndjson"))
    if len(files) != 1:
        raise FileNotFoundError(f"{log_dir}: {len(files)} scheduler logs, expected one")
    return [json.loads(line) for line in files[0].read_text(encoding="utf-8").splitlines() if line.strip()]


def check_boundary(events: Iterable[dict[str, Any]], *, drained: bool) -> BoundaryVerdict:
    """Check the properties on one scheduler log's events; `drained`: the run ended with no request held."""
    state = _State()
    for event in events:
        kind = event["event"]
        if kind == "get_num_new_matched_tokens":
            state.local_hits[event["req"]] = int(event["num_computed_tokens"])
        elif kind == "request_finished":
            if event["delayed"]:
                blocks = set(event["block_ids"]) | {b for g in event.get("group_block_ids", ()) for b in g}
                state.delayed[event["req"]] = blocks - {0}
        elif kind == "update_connector_output":
            for req in event["finished_sending"]:
                if req not in state.delayed:
                    return BoundaryVerdict(False, "ReportOnlyDelayed", f"finished_sending names {req}, whose "
                                           "free was not delayed (or was already reported)", event)
                del state.delayed[req]
        elif kind == "build_connector_meta":
            bad = _reused(event, state)
            if bad is not None:
                return BoundaryVerdict(False, "NoReuseBeforeReport", bad, event)
            for req in event["finished"]:
                state.local_hits.pop(req, None)
    if drained and state.delayed:
        return BoundaryVerdict(False, "EveryDelayedReported",
                               f"the run drained with {', '.join(sorted(state.delayed))} delayed and never reported")
    return BoundaryVerdict(True)


def _reused(event: dict[str, Any], state: _State) -> str | None:
    """A block of a delayed, unreported request that vLLM handed out from its free pool in this step."""
    if not state.delayed:
        return None
    owners = {block: req for req, blocks in state.delayed.items() for block in blocks}

    def groups(entry: dict[str, Any]) -> list[list[int]]:
        return [entry["block_ids"], *entry.get("group_block_ids", ())]

    new = [(e["req"], groups(e)) for e in event["reqs"] if e["new"]]
    cached = [(e["req"], e["resumed"], groups(e)) for e in event["reqs"] if not e["new"]]
    for block in step_fresh_blocks(new, cached, state.local_hits, int(event["block_size"])):
        if block in owners:
            holder = next(e["req"] for e in event["reqs"] if any(block in g for g in groups(e)))
            return f"block {block} of {owners[block]} (delayed, not reported) handed to {holder}"
    return None
