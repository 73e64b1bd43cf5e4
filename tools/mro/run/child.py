"""``python -m deferdump.tools.mro.run.child``: one replay in its own process (a JSON request on stdin, the
outcome as JSON on stdout), so the judged code and the stub modules never touch the judging process."""
from __future__ import annotations

import json
import logging
import sys

from deferdump.tools.mro.run.explore import explore_class
from deferdump.tools.mro.run.replay import replay_counterexample


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    request = json.load(sys.stdin)
    if "explore" in request:  # the class's own schedules, chosen from its answers (explore.py)
        explored = explore_class(request["paths"], request["class"], request["path"], request["case"],
                                 request.get("store_modules", []), **request["explore"])
        json.dump([explored.to_json()], sys.stdout)
        return 0
    traces = request["traces"] if "traces" in request else [request["trace"]]
    outcomes = []
    for trace in traces:  # each from fresh instances and a fresh store; the first hazard ends the search
        outcome = replay_counterexample(request["paths"], request["class"], request["path"], request["case"],
                                        trace, request.get("store_modules", []))
        outcomes.append(outcome)
        if outcome.status in ("reproduced", "not_runnable"):
            break
    json.dump([outcome.to_json() for outcome in outcomes], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
