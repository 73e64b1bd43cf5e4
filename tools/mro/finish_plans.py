"""Transfers planned at a request's finish: a ``request_finished`` that keeps the block ids vLLM hands it (for a dump or
a send of a request that no longer runs).

The model dumps running requests' blocks, submitted in the step that computed them, so its counterexamples are
preemptions and finishes of requests whose dumps are still running. A class whose finish plans its dumps instead
(``self._pending.dumps.append(Transfer(req_id, block_ids[:full], key))``, the dump list ``wait_for_save`` submits
from) never dumps a running request: the corpus's ``AsyncLoadStoreConnector`` (keyed safe) was **unsafe** by a
preemption of a request it never dumped, once its task table was read as a tracking set. A counterexample for such a
class is no run of it (``unknown``); a pass keeps its meaning (the finish's answer is read as before)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from deferdump.tools.mro.unreached_tasks import reached_facts

if TYPE_CHECKING:
    from deferdump.tools.mro.behaviour import EffectReader

FINISH_METHODS = ("request_finished", "request_finished_all_groups")


def finish_plans(reader: "EffectReader", cls: str) -> tuple[str, ...]:
    """Why a counterexample is no run of ``cls``: its finish (as ``cls`` resolves it, with the ``self`` helpers and
    ``super()`` definitions it reaches) keeps the block ids it is handed in ``self`` state."""
    found = []
    for method in FINISH_METHODS:
        owner = reader.hierarchy.lookup(cls, method)
        if owner is None or reader.hierarchy.classes[owner].external:
            continue
        finish = reader.hierarchy.method(owner, method)
        blocks = {finish.param_names[1]} if len(finish.param_names) > 1 else set()
        for facts in reached_facts(reader, cls, (method,)):
            kept = facts.kept_params & (blocks | {"block_ids"})
            if kept:
                found.append(f"{facts.owner}.{facts.name} keeps `{sorted(kept)[0]}` (the blocks vLLM hands "
                             f"{owner}.{method}) in the class's state: a transfer planned at the finish, of a request "
                             "that no longer runs, where the model dumps running requests' blocks, so this "
                             "counterexample's dumps may be ones the class never makes")
                break
    return tuple(dict.fromkeys(found))
