"""The spec's behaviour label of each method definition, read from what the definition does.

A definition's effect is its own body plus every ``self.<helper>()`` and ``super()`` call it makes,
resolved through the MRO of the class being judged. The effect is mapped to the vocabulary of
``spec/Connectors.tla`` (``track``/``notrack``, ``delay_if_tracked``, ``wait_finished`` ...). A pure
``super()`` pass-through is labelled ``super`` and a wrapper's call into its inner connector ``forward``,
so the model itself does the dispatch. What the syntax cannot settle is ``unknown``, with the reason.
"""
from __future__ import annotations

import ast

from collections.abc import Iterator, Sequence

from dataclasses import dataclass, replace

from deferdump.tools.mro.helpers import DATA_METHODS, HelperObjects, is_special
from deferdump.tools.mro.hierarchy import Hierarchy
from deferdump.tools.mro.settled_paths import settled_across_helpers
from deferdump.tools.mro.source import (
    CONNECTOR_METHODS,
    FILLING_CALLS,
    HIDDEN_SUBMIT,
    UNSEEN_KEEPING,
    DelayGuard,
    Delegation,
    Forward,
    MethodFacts,
    TaskFlow,
    named_store_acts,
)

#: The connector methods the protocol model dispatches (``Connectors!Methods``).
SPEC_METHODS: tuple[str, ...] = (
    "build_connector_meta",
    "request_finished",
    "request_finished_all_groups",
    "handle_preemptions",
    "save_kv_layer",
    "wait_for_save",
    "get_finished",
    "_wait_pending_dump_task",
)

UNKNOWN = "unknown"

#: The "class" of a hand-off of ``self`` to a module-level function (:meth:`EffectReader._called_back`).
MODULE_FUNCTION = "<module>"

#: Methods of the standard containers whose meaning the reader's task flow assumes (``append`` keeps, ``pop`` takes).
CONTAINER_METHODS = frozenset({
    "get", "items", "keys", "values", "pop", "popitem", "setdefault", "update", "clear", "copy", "add", "discard",
    "remove", "append", "appendleft", "extend", "extendleft", "insert", "popleft", "put", "put_nowait", "get_nowait",
    "task_done", "join", "qsize", "empty", "full",
})
#: Standard containers a helper may subclass (the builtins, ``collections``, ``queue``, ``collections.abc``).
CONTAINER_BASES = frozenset({
    "dict", "list", "set", "frozenset", "deque", "OrderedDict", "defaultdict", "Counter", "UserDict", "UserList",
    "Queue", "SimpleQueue", "LifoQueue", "PriorityQueue", "MutableMapping", "MutableSet", "MutableSequence",
})

#: Builtin types whose methods (C code) do no store work and call no method a subclass overrides (``dict.pop`` never
#: calls an overriding ``__delitem__``); ``UserDict``, ``OrderedDict`` and ``queue.Queue`` are not among them.
BUILTIN_TYPES = frozenset({"object", "dict", "list", "set", "frozenset", "tuple", "str", "bytes", "bytearray", "int"})

#: The methods that start the step's dumps in the model (a replaced task there is a lost one).
SAVE_METHODS = ("save_kv_layer", "wait_for_save")

#: Calls that ask a KV-cache tensor its identity: two layers sharing one cache (``kv_sharing_target_layer_name``) answer
#: alike, which the model's layers never do (the judge's rule for the two-layer case).
TENSOR_IDENTITY_CALLS = frozenset({"data_ptr", "untyped_storage"})

#: Names that tell a KV-cache group's kind (vLLM 0.32's v1/kv_cache_interface.py): a class reading them may dump
#: some groups and not others.
GROUP_SPEC_WORDS = frozenset({"SlidingWindowSpec", "SlidingWindowMLASpec", "FullAttentionSpec", "AttentionSpec",
                              "MLAAttentionSpec", "ChunkedLocalAttentionSpec", "kv_cache_spec", "sliding_window"})

#: Not a model label: a preemption wait selecting tasks by their blocks (the judge resolves it per case).
AMBIGUOUS_PREEMPT = "wait_preempted_or_freed"
#: The reason of a ``get_finished`` whose waits are chosen by nothing it reports (it may drain every task).
UNSELECTED_REPORT_WAITS = "waits store tasks, but none is selected by the requests it reports"

#: Calls on other objects that mean "blocks on a store task", "polls one", "submits a dump".
WAIT_CALLS = frozenset({"wait", "wait_dump"})
CHECK_CALLS = frozenset({"check"})
#: Completion queries on futures and events (``f.done()``, ``event.is_set()``): what they report ended may be a
#: store wait run elsewhere (a thread, an event loop, a callback), which the reader does not follow.
COMPLETION_QUERIES = frozenset({"done", "is_set"})
SUBMIT_CALLS = frozenset({"dump_data", "dump"})
#: Calls that write a tensor out before returning (``safetensors.torch.save_file``, ``torch.save``): a save
#: made only of these is synchronous, so no dump outlives the call.
SYNC_SAVE_CALLS = frozenset({"save_file", "save", "tofile"})
#: Calls that wait for the stream's earlier work (``t.cpu()`` is a blocking copy on the current stream): a
#: ``non_blocking=True`` copy in the same call is complete once one of these has run.
SYNC_POINT_CALLS = frozenset({"cpu", "synchronize", "item", "tolist", "numpy"})

#: Calls that never block on a transfer: builtins, container, string and logging methods, and the store's
#: non-blocking calls. Any other call a ``get_finished`` makes (``state.finish()``, ``stack.close()``, a
#: stored callback, a module-level helper) may wait a dump the reader does not see.
NEVER_WAIT = DATA_METHODS | frozenset({
    "len", "set", "frozenset", "list", "dict", "tuple", "sorted", "reversed", "isinstance", "issubclass",
    "getattr", "hasattr", "setattr", "min", "max", "sum", "any", "all", "enumerate", "zip", "range", "iter",
    "next", "int", "str", "float", "bool", "repr", "type", "id", "map", "filter", "print", "format", "hash",
    "startswith", "endswith", "split", "strip", "lower", "upper", "perf_counter", "monotonic",
    "check", "done", "is_set", "cancelled", "running", "lookup", "dump", "dump_data", "defaultdict", "deque",
    "Counter", "OrderedDict", "field", "KVConnectorTransferResults", "notify", "notify_all",
})

#: Unknown definitions are checked twice: with the worst label the method admits, then with the PR's.
PESSIMISTIC: dict[str, str] = {
    "build_connector_meta": "notrack",
    "request_finished": "base",
    "request_finished_all_groups": "base",
    "handle_preemptions": "base",
    "save_kv_layer": "submit_layer",
    "wait_for_save": "poll_track_submit",
    "get_finished": "report_before_wait",
    "_wait_pending_dump_task": "release_on_success",
}
OPTIMISTIC: dict[str, str] = {
    "build_connector_meta": "track",
    "request_finished": "delay_if_tracked",
    "request_finished_all_groups": "call_request_finished",
    "handle_preemptions": "wait_preempted",
    "save_kv_layer": "pass",
    "wait_for_save": "poll_track_submit",
    "get_finished": "wait_finished",
    "_wait_pending_dump_task": "release_finally",
}

#: Under a hybrid model the benign reading of an unrecognised ``handle_preemptions`` is the fence (wait every
#: pending task reading a block freed since it was submitted): a plain preemption wait is unsafe there.
OPTIMISTIC_HYBRID: dict[str, str] = {**OPTIMISTIC, "handle_preemptions": "wait_freed"}

#: The other benign reading of an unrecognised save: it completes before returning (no dump in flight, so
#: nothing to track or wait). A class is ``unsafe`` only when both benign readings fail.
OPTIMISTIC_SYNC: dict[str, str] = {**OPTIMISTIC, "save_kv_layer": "sync_save", "wait_for_save": "sync_save"}

#: Part of the reason of a definition that adds requests to the tracking set only under a test while it dumps
#: either way. The model's worst reading of such a ``wait_for_save`` (``poll_track_submit``) still tracks every
#: request it dumps, so a pass of it proves nothing (the judge's rule; the twenty-eighth blind round's
#: ``BackfillDumpConnector`` ships background dumps for requests it never tracks).
GUARDED_TRACKING = "adds requests to the tracking set only under a test"

#: Part of the reason of a definition whose branch on the worker's rank the model's ranks cannot follow. Under MLA the
#: model's worst reading of such a save (``poll_track_submit``) tracks on every rank; a rank that returns before it
#: tracks never reports, and vLLM's aggregator waits for every rank's report (the twenty-ninth blind round's
#: ``ReplicaAwareLaneConnector``), so a pass of that reading proves nothing (the judge's rule).
RANK_DECIDED = "by the worker's rank"

#: Part of the reason of a ``wait_for_save`` that adds no request to a tracking set. The class tracks elsewhere (a
#: per-layer save, a helper run under a test) or nowhere; the model's worst reading tracks in ``wait_for_save`` on
#: every rank. Under MLA a rank tracking elsewhere may return first and never report (the twenty-ninth blind round's
#: ``StageLocalTrackingConnector`` tracks in ``save_kv_layer`` after a replica rank's return), so a pass of that
#: reading proves nothing there (the judge's rule).
UNTRACKED_SAVE = "does not record the step's dump requests in the tracking set"
#: A get_finished whose waits the model has no label for: every benign reading of it reports what it waits.
SILENT_WAITS = "waits store tasks and reports nothing"
#: The reason a layer save that submits here and waits in a helper is unknown (before settled_paths.py is asked).
SPLIT_SAVE_WAIT = ("submits a dump and waits store tasks in another function: whether the task it waits is the one "
                   "it submitted (a synchronous save) is not read")

#: The reason an abstract (or unconditionally raising) definition is unknown: a class resolving to it stops.
ABSTRACT_REASON = "is abstract: a class resolving to it cannot run"

#: Methods vLLM 0.32 calls in every engine step (build_connector_meta at each schedule; start_load_kv,
#: wait_for_save and get_finished around each forward, kv_connector_model_runner_mixin.py ~72-105): a class
#: whose definition of one of them cannot run stops at the first step, before any block can be reused.
EVERY_STEP_METHODS = ("build_connector_meta", "start_load_kv", "wait_for_save", "get_finished")

#: Worker methods vLLM calls around each forward (kv_connector_model_runner_mixin.py ~72-105) in which the
#: model starts no transfer of its own: its saves are submitted in save_kv_layer and wait_for_save (its
#: handle_preemptions and get_finished only wait). A store submit, or work handed to another thread or
#: stream, in one of these may read KV blocks after the call returns (a save started with the next step's
#: loads, a push of a loaded prefix, a dump of a preempted or finished request), which no model run follows.
OUTSIDE_METHODS = ("bind_connector_metadata", "handle_preemptions", "start_load_kv", "wait_for_layer_load",
                   "get_finished", "clear_connector_metadata", "get_block_ids_with_load_errors",
                   "build_connector_worker_meta")

#: Worker methods vLLM 0.32 calls in every step that the model has no action for (kv_connector_model_runner_mixin.py
#: ~72-105): the metadata bound before the forward, the per-layer load waits, ``start_load_kv`` after the forward (no
#: synchronous loads), and after the transfer results the load errors, stats, events, worker metadata and the clear.
#: A store wait in one of them ends dumps the model leaves running, so a counterexample may be no run of the class.
UNMODELLED_STEP_METHODS = ("bind_connector_metadata", "wait_for_layer_load", "start_load_kv",
                           "get_block_ids_with_load_errors", "get_kv_connector_stats",
                           "get_kv_connector_kv_cache_events", "build_connector_worker_meta",
                           "clear_connector_metadata")

#: Scheduler-side methods vLLM 0.32 calls that the model has no action for: the output of each step
#: (``update_connector_output``, then the stats and ``take_events``, scheduler.py ~2329-2380), the allocation hooks
#: around ``build_connector_meta`` and the questions it asks while scheduling (~787-791, ~2833).
UNMODELLED_SCHEDULER_METHODS = ("update_connector_output", "get_kv_connector_stats", "take_events",
                                "get_num_new_matched_tokens", "update_state_after_alloc", "has_pending_block_frees",
                                "has_pending_push_work")

#: The benign reading of an unrecognised finish: it delays every finished request (a safety invariant can
#: only lose violations by delaying more: nothing is freed before it is reported, and no report is unexpected).
DELAY_ALL: dict[str, str] = {"request_finished": "delay_all", "request_finished_all_groups": "delay_all"}

#: A wrapper's method also counts as forwarding when it calls a related inner method (the HMA variant
#: falling back to the inner ``request_finished``).
FORWARD_ALIASES: dict[str, tuple[str, ...]] = {
    "request_finished_all_groups": ("request_finished",),
    "request_finished": ("request_finished_all_groups",),
}

#: The model's label for a wrapper method that calls a different inner method (``Connectors!CrossForward``).
CROSS_FORWARD_LABELS: dict[tuple[str, str], str] = {
    ("request_finished_all_groups", "request_finished"): "forward_request_finished",
    ("request_finished", "request_finished_all_groups"): "forward_request_finished_all_groups",
}


@dataclass(frozen=True)
class Effect:
    """Everything one call of a method does for an instance of some class, helpers and supers included."""

    tracking_ops: frozenset[str] = frozenset()
    calls: frozenset[str] = frozenset()
    finally_calls: frozenset[str] = frozenset()
    handler_calls: frozenset[str] = frozenset()  # called in an ``except`` handler (helpers included)
    guarded_adds: tuple[str, ...] = ()  # additions to the tracking set made only under a test (where, line, test)
    plain_adds: bool = False  # an addition to the tracking set under no such test (helpers included)
    self_calls: frozenset[str] = frozenset()  # the definition's own self.<m>() calls (not transitive)
    constant: str | None = None  # the literal every return yields, when the call returns only that
    delay_answer: bool | None = None  # the literal first element of every returned tuple (a finish's delay)
    records: frozenset[str] = frozenset()  # self attributes it adds entries to (request records a report may read)
    noop: bool = False
    abstract: bool = False
    forwards: tuple[Forward, ...] = ()
    reasons: tuple[str, ...] = ()  # why part of the behaviour is unknown
    async_hints: tuple[str, ...] = ()  # hand-offs to other threads/streams, with where they are
    flows: tuple[TaskFlow, ...] = ()  # store-task data flow of the definition and everything it calls
    words: frozenset[str] = frozenset()  # names the definition and everything it calls read
    foreign_words: frozenset[str] = frozenset()  # of those, attributes read on objects other than self
    attr_calls: tuple[tuple[str, str, str], ...] = ()  # (where, attr, path) of every self.<attr>.<path>() call
    rank_guards: tuple[tuple[str, str, frozenset[str]], ...] = ()  # (where, test, what it guards)
    value_calls: tuple[str, ...] = ()  # calls of values the reader does not resolve, with where they are

    @property
    def submits_waited(self) -> bool:
        """Every store task submitted in the call (helpers included) is waited before it returns and none
        is kept on ``self``: a synchronous save, whatever the methods are called."""
        submits = sum(f.submits for f in self.flows)
        return submits > 0 and sum(f.waited_here for f in self.flows) == submits and not self.kept_in

    @property
    def kept_in(self) -> frozenset[str]:
        return frozenset().union(*(f.kept_in for f in self.flows))

    @property
    def waits_each(self) -> frozenset[str]:
        return frozenset().union(*(f.waits_each for f in self.flows))

    @property
    def stops_early(self) -> frozenset[str]:
        return frozenset().union(*(f.stops_early for f in self.flows))

    @property
    def relevant(self) -> bool:
        """Does the effect do any of the protocol's work (beyond calling elsewhere)?"""
        return bool(
            self.tracking_ops
            or self.calls & (WAIT_CALLS | CHECK_CALLS | SUBMIT_CALLS)
            or self.constant is not None
            or self.forwards
        )


@dataclass(frozen=True)
class DefinitionLabel:
    """The spec label of ``owner``'s definition of ``method`` (judged for some class); ``reasons`` says
    why it is ``unknown``; ``phantom`` marks a definition an unanalysed base *might* have."""

    owner: str
    method: str
    label: str
    reasons: tuple[str, ...] = ()
    phantom: bool = False
    hybrid_reasons: tuple[str, ...] = ()  # set: under a hybrid model the label is unknown, for these reasons
    # set: the code does worse than ``label`` (it loses tasks the label keeps). The model runs ``label``; a pass
    # proves nothing (unknown, for these reasons), an overwrite it finds is real (losing a task removes waits only)
    beyond_model: tuple[str, ...] = ()


class EffectReader:
    """Computes effects and labels for one hierarchy, memoised."""

    def __init__(self, hierarchy: Hierarchy) -> None:
        self.hierarchy = hierarchy
        self.helpers = HelperObjects(hierarchy)
        self._memo: dict[tuple[str, str, str, bool], Effect] = {}
        self._stored: dict[str, dict[str, str]] = {}  # class -> attribute its code assigns on self -> where, first

    def transfer_started(self, cls: str, owner: str, method: str, inner: str | None = None) -> str | None:
        """What in ``owner``'s ``method`` (with the helpers it calls, on an instance of ``cls``) may start a
        transfer that outlives the call: a store submit, work handed to another thread or stream, or a call
        into a helper object whose code may do either (:mod:`deferdump.tools.mro.helpers`); None when nothing
        does. ``inner``: the wrapper's inner class in this judgement (calls into it are its own)."""
        effect = self.effect(cls, owner, method)
        submits = sorted(effect.calls & SUBMIT_CALLS)
        if submits:
            return f"a store {submits[0]}()"
        hints = _pending_hints(effect)
        if not effect.calls & {"stream", "Stream"}:
            # a non_blocking copy on the current stream is ordered before the forward's kernels on that
            # stream, which are what rewrites a block (vLLM's ExampleConnector loads this way); on a side
            # stream it is not
            hints = [h for h in hints if "non_blocking" not in h]
        if hints:
            return hints[0]
        for where, attr, path in effect.attr_calls:
            why = self.helpers.unfollowed(cls, attr, path, inner)
            if why is not None:
                return f"{where}: self.{attr}.{path}(), and {why}"
        return self._started_through_others(cls, owner, method)

    def _started_through_others(self, cls: str, owner: str, method: str) -> str | None:
        """A transfer started through an object that is not a ``self`` attribute: a local built by name
        (``batch = DumpBatch(store); batch.flush()``) or a receiver whose class is not read (a container's element,
        a loop variable, a parameter), which may be any helper class of the analysed files that has the method."""
        for facts in self._reached(cls, owner, method):
            calls = [(helper, name, line, f"a local {helper}") for helper, name, line in facts.other_calls]
            calls += [(helper, name, line, f"{receiver}, which may be a {helper}")
                      for receiver, name, line in facts.loose_calls for helper in self.helpers.helper_classes()]
            for helper, name, line, on in calls:
                why = self.helpers.method_starts(helper, name, ())
                if why is not None:
                    return f"{facts.name} line {line}: .{name}() on {on}, and {why}"
            for line, target, name, receiver, back, conn_owner, acts in self._called_back(cls, facts, ()):
                if "a store submit" in acts or "a hand-off to another thread or stream" in acts:
                    return (f"{facts.name} line {line}: {_callback_text(target, name, receiver, back)}, and "
                            f"{conn_owner}.{back} does {', '.join(sorted(acts))}")
        return None

    def _helper_does(self, cls: str, helper: str, calls: frozenset[str]) -> bool:
        """Does ``self.<helper>()`` on an instance of ``cls`` (its helpers included) make one of ``calls``?
        A helper no analysed class defines is assumed to (its work is unknown)."""
        target = self.hierarchy.lookup(cls, helper)
        if target is None or self.hierarchy.classes[target].external:
            return target is None
        return bool(self.effect(cls, target, helper).calls & calls)

    def _two_waiting_branches(self, cls: str, owner: str, facts: MethodFacts) -> tuple[str, ...]:
        """A preemption handler whose ``if`` waits on both sides (DeltaChunkConnector: every pending task
        when ``meta.drain_all``, else the preempted requests'): one side may be a fence over blocks freed
        while the request runs, which the test decides on a hybrid model; the reader does not evaluate it."""
        def waits(side: frozenset[str]) -> bool:
            return "wait" in side or any(self._helper_does(cls, c[5:], WAIT_CALLS) for c in side if c != "wait")
        return tuple(
            f"{owner}.handle_preemptions waits on both sides of `if {test}`: on a hybrid model one side may be "
            "a fence over blocks freed while the request runs, and the reader does not evaluate the test"
            for test, body, orelse in facts.branch_waits if waits(body) and waits(orelse)
        )

    def _unconditional_helper_waits(self, cls: str, owner: str, facts: MethodFacts) -> tuple[str, ...]:
        """A preemption handler or ``wait_for_save`` that always calls a helper which waits store tasks
        (``self._drain_short()``, WindowFencedSaver and SplitGroupSaver of the sixth blind round): it waits more
        than its label's tasks, which on a hybrid model may be the dumps of the sliding-window group (a fence),
        and which tasks it is is not read."""
        def drains(helper: str) -> bool:  # waits, and not only tasks a poll found done (UCM's _poll_pending_...)
            target = self.hierarchy.lookup(cls, helper)
            if target is None or self.hierarchy.classes[target].external:
                return False
            calls = self.effect(cls, target, helper).calls
            return bool(calls & WAIT_CALLS) and not calls & CHECK_CALLS
        helpers = sorted(c for c in facts.top_self_calls if drains(c))
        return tuple(f"{owner}.{facts.name} always calls self.{h}(), which waits store tasks: on a hybrid model they "
                     "may be the sliding-window group's dumps (a fence), which the reader does not establish"
                     for h in helpers[:1])

    def rank_attrs(self, cls: str) -> frozenset[str]:
        """The ``self`` attributes any definition in ``cls``'s MRO assigns from the worker's rank: tests of them
        are rank tests, whatever the attributes are called."""
        found: set[str] = set()
        for owner in self.hierarchy.mro.get(cls, (cls,)):
            facts = self.hierarchy.classes.get(owner)
            if facts is not None and not facts.external:
                for definition in facts.methods.values():
                    found |= definition.rank_attrs
        return frozenset(found)

    def rank_reasons(self, cls: str, owner: str, method: str) -> tuple[str, ...]:
        """Why ``owner``'s ``method`` (helpers included) behaves differently on different ranks in a way the
        model's ranks cannot follow: a test of the rank that guards a return, a loop exit, a store wait or
        submit, a ``super()`` call or a helper that waits or submits. The model runs every rank with one label
        (under MLA only rank 0 dumps, whatever the code says), so such a branch is unknown with two ranks.
        ``if <rank test>: return`` at the top level of a save method is the MLA early return the model has."""
        why: list[str] = []
        for where, test, does in self.effect(cls, owner, method).rank_guards:
            if does == {"early_return"} and where.endswith((".wait_for_save", ".save_kv_layer")):
                continue
            own = where == f"{owner}.{method}"
            # in a helper, a value returned by the rank (a store key, a shard) ends only the helper; a bare
            # return there skips what the helper does after it, which matters where that waits or submits
            helper = where.rpartition(".")[2]
            exits = {"return", "return_value", "break", "early_return"} if own else {"break"} | (
                {"return", "early_return"} if self._helper_does(cls, helper, WAIT_CALLS | SUBMIT_CALLS) else set())
            acts = sorted(d for d in does if d in exits | {"wait", "submit", "super"})
            acts += [f"{call}() (it waits or submits)" for call in sorted(d for d in does if d.startswith("self."))
                     if self.hierarchy.lookup(cls, call[5:]) is not None
                     and self._helper_does(cls, call[5:], WAIT_CALLS | SUBMIT_CALLS)]
            if acts:
                why.append(f"{where}: `if {test}` decides {', '.join(acts)} {RANK_DECIDED}; the model runs "
                           "every rank with one label (under MLA only rank 0 dumps, whatever the code does)")
        return tuple(dict.fromkeys(why))

    def effect(self, cls: str, owner: str, method: str, *, delegations: bool = True) -> Effect:
        """The effect of ``owner``'s definition of ``method`` running on an instance of ``cls``; without
        ``delegations``, ``super()``/``Parent.m(self)`` calls are left out (the definition's own work)."""
        return self._effect(cls, owner, method, delegations, ())

    def _effect(
        self, cls: str, owner: str, method: str, delegations: bool, stack: tuple[tuple[str, str], ...]
    ) -> Effect:
        key = (cls, owner, method, delegations)
        if key in self._memo:
            return self._memo[key]
        if (owner, method) in stack:  # recursion adds nothing new
            return Effect()
        facts = self.hierarchy.method(owner, method)
        aliased, called = self.helpers.called_attributes(cls, facts)
        if called:  # ``self._launch(queued)`` on a helper object: its ``__call__``, read as any call on it
            facts = replace(facts, attr_calls=(*facts.attr_calls, *called))
        inner = stack + ((owner, method),)
        reasons = [f"{owner}.{method}: {r}" for r in facts.opaque]
        for why, callee in (*facts.counted_waits, *facts.partial_waits):
            target = None if callee == "wait" else self.hierarchy.lookup(cls, callee)
            if callee == "wait" or (target is not None and not self.hierarchy.classes[target].external
                                    and self._effect(cls, target, callee, True, inner).calls & WAIT_CALLS):
                reasons.append(f"{owner}.{method}: {why}")
        callees: list[Effect] = []
        answered_by: Effect | None = None  # the helper whose answer the whole body returns
        for helper in sorted({*facts.self_calls, *aliased}):  # a bound method kept in an attribute runs as itself
            target = self.hierarchy.lookup(cls, helper)
            if target is not None:
                if self.hierarchy.method(target, helper).generator:
                    # a generator's body runs only as far as its result is iterated
                    uses = {use for name, use in facts.self_call_uses if name == helper}
                    if uses == {"dropped"}:
                        continue  # the generator object is thrown away: none of its body ever runs
                    if uses - {"consumed"}:  # kept somewhere, or dropped at one call and iterated at another
                        reasons.append(
                            f"{owner}.{method} does not iterate every generator self.{helper}() returns to its "
                            "end where it calls it: when, and how far, its body runs is not followed"
                        )
                callees.append(self._effect(cls, target, helper, True, inner))
                if helper == facts.returned_self_call and not self.hierarchy.method(target, helper).generator \
                        and (method, helper) != ("request_finished_all_groups", "request_finished"):
                    # (the model has its own label for that one: call_request_finished)
                    answered_by = callees[-1]
            elif self.hierarchy.opaque_ancestors(cls):
                opaque = self.hierarchy.opaque_ancestors(cls)[0]
                reasons.append(f"{owner}.{method} calls self.{helper}(), which may come from {opaque}")
        # ``self.x = v`` runs a property setter, ``self.x`` a property getter, where the class has one
        for name in sorted(facts.attr_stores):
            target = self.hierarchy.lookup(cls, f"{name}.setter")
            if target is not None:
                callees.append(self._effect(cls, target, f"{name}.setter", True, inner))
        for name in sorted(facts.attr_loads):
            target = self.hierarchy.lookup(cls, name)
            if target is not None and self.hierarchy.method(target, name).is_property:
                callees.append(self._effect(cls, target, name, True, inner))
        delegated: list[Effect] = []
        for delegation in facts.delegations if delegations else ():
            if delegation.anchor not in self.hierarchy.mro:
                if delegation.method in CONNECTOR_METHODS and delegation.anchor[:1].isupper():
                    reasons.append(
                        f"{owner}.{method} calls {delegation.anchor}.{delegation.method}(self, ...), "
                        "a class outside the analysed files"
                    )
                continue
            target = self.hierarchy.delegation_target(cls, delegation)
            if target is None and self._builtin_delegation(cls, delegation):
                continue  # ``super().__setitem__(k, v)`` in a ``dict`` subclass: the builtin's, no store work
            if target is None:
                reasons.append(f"{owner}.{method}: super().{delegation.method}() finds no definition")
                continue
            delegated.append(self._effect(cls, target, delegation.method, True, inner))
        reasons += self._misread_helper_calls(cls, owner, method, facts, inner)
        reasons += self._helper_iterations(cls, owner, method, facts)
        reasons += self._callbacks(cls, owner, method, facts, inner)
        everything = callees + delegated
        only_delegates = len(delegated) == 1 and not callees and facts.body == "code" and not facts.tracking_ops \
            and not facts.own_returns
        constant = facts.constant_return
        if only_delegates and constant is None:
            constant = delegated[0].constant
        delay_answer = facts.delay_answer
        if only_delegates and delay_answer is None:
            delay_answer = delegated[0].delay_answer
        if answered_by is not None and constant is None and delay_answer is None:
            # ``return self.request_finished_all_groups(request, (block_ids,))`` answers what that method answers
            # (StepBatchConnector, thirtieth blind round: a constant False read as "decides the delay without
            # consulting the tracking set")
            constant, delay_answer = answered_by.constant, answered_by.delay_answer
        result = Effect(
            tracking_ops=facts.tracking_ops.union(*(e.tracking_ops for e in everything)),
            calls=facts.calls.union(*(e.calls for e in everything)),
            finally_calls=facts.finally_calls.union(*(e.finally_calls for e in everything)),
            handler_calls=facts.handler_calls.union(*(e.handler_calls for e in everything)),
            guarded_adds=tuple(dict.fromkeys([*(f"{owner}.{method} line {line}: `if {test}`"
                                                for line, test in facts.guarded_adds),
                                              *(g for e in everything for g in e.guarded_adds)])),
            plain_adds=facts.plain_adds or any(e.plain_adds for e in everything),
            self_calls=facts.self_calls,
            constant=constant,
            delay_answer=delay_answer,
            records=frozenset(a for a, ops in facts.attr_ops if "add" in ops).union(*(e.records for e in everything)),
            noop=(facts.body == "noop" and not everything) or (only_delegates and delegated[0].noop),
            abstract=facts.body == "abstract" or (only_delegates and delegated[0].abstract),
            forwards=tuple(dict.fromkeys([*facts.forwards, *(f for e in everything for f in e.forwards)])),
            reasons=tuple(dict.fromkeys([*reasons, *(r for e in everything for r in e.reasons)])),
            async_hints=tuple(dict.fromkeys(
                [*(f"{owner}.{method} {h}" for h in facts.async_hints), *(h for e in everything for h in e.async_hints)]
            )),
            flows=tuple([*([facts.task_flow] if facts.task_flow else []), *(f for e in everything for f in e.flows)]),
            words=facts.words.union(*(e.words for e in everything)),
            foreign_words=facts.foreign_words.union(*(e.foreign_words for e in everything)),
            attr_calls=tuple(dict.fromkeys(
                [*((f"{owner}.{method} line {line}", a, p) for a, p, line in facts.attr_calls),
                 *(c for e in everything for c in e.attr_calls)]
            )),
            value_calls=tuple(dict.fromkeys(
                [*(f"{owner}.{method} {c}" for c in facts.value_calls), *(c for e in everything for c in e.value_calls)]
            )),
            rank_guards=tuple(dict.fromkeys(
                [*((f"{owner}.{method}", t, d) for t, d in facts.rank_guards),
                 *((f"{owner}.{method}", t, d) for t, attrs, d in facts.attr_guards if attrs & self.rank_attrs(cls)),
                 *(g for e in everything for g in e.rank_guards)]
            )),
        )
        self._memo[key] = result
        return result

    def _builtin_delegation(self, cls: str, delegation: Delegation) -> bool:
        """Does ``delegation`` reach a builtin type's method (``super().pop(k)`` in a ``dict`` subclass,
        ``list.append(self, x)``)? Those do no store work and call no method a subclass overrides."""
        if delegation.kind != "super":
            return delegation.anchor in BUILTIN_TYPES
        mro = self.hierarchy.mro[cls]
        after = mro[mro.index(delegation.anchor) + 1:] if delegation.anchor in mro else []
        external = [c for c in after if self.hierarchy.classes[c].external]
        return any(c in BUILTIN_TYPES for c in external) and all(c in BUILTIN_TYPES for c in external)

    def _misread_helper_calls(
        self, cls: str, owner: str, method: str, facts: MethodFacts, stack: tuple[tuple[str, str], ...]
    ) -> list[str]:
        """Calls ``self.<attr>.<m>()`` into a helper class of the analysed files whose ``m`` does not do what the
        reader takes the name to mean: the reader reads ``dump``/``wait``/``check`` as the store's calls and any
        other name as no store work, so a ``SlotTable.set`` that submits a dump, a ``StoreIO.wait`` that only
        polls or a ``commit`` that dumps and waits (nineteenth blind round) would be judged as what it is not."""
        found: list[str] = []
        for helper, name, line in facts.other_calls:
            # a local the body made (``batch = DumpBatch(store)``, whose ``flush`` submits the dumps); a class that
            # was not analysed (a lock, a list) is read by the call's name, as before
            why = self._misread_on(helper, name, stack) if helper in self.helpers.helper_classes() else None
            if why is not None:
                found.append(f"{owner}.{method} (line {line}) calls .{name}() on a local {helper}, and {why}: "
                             f"{_read_by_name(name)}")
        for receiver, name, line in facts.loose_calls:
            # a container's element, a loop variable, a parameter, a call's result: any helper class may be it
            for helper in self.helpers.helper_classes():
                why = self._misread_on(helper, name, stack)
                if why is not None:
                    found.append(f"{owner}.{method} (line {line}) calls {receiver}.{name}(), whose class is not read "
                                 f"and may be a {helper}, and {why}: {_read_by_name(name)}")
                    break
        for attr, dotted, line in facts.attr_calls:
            *fields, path = dotted.split(".")
            if fields:  # self.<attr>.<field>.<m>(): what the helper holds in <field>
                helpers, unresolved = self.helpers.analysed_helpers(cls, attr), False
                for name in fields:
                    helpers = sorted({h for c in helpers for h in self.helpers.analysed_helpers(c, name)})
            else:  # a factory's result, a registry entry, a parameter: it may be any class the files define
                helpers, unresolved = self.helpers.candidates(cls, attr)
            for helper in helpers:
                why = self._misread_on(helper, path, stack)
                if why is None:
                    continue
                on = f"on what may be a {helper} (self.{attr} is not built by name)" if unresolved else f"on a {helper}"
                found.append(f"{owner}.{method} (line {line}) calls self.{attr}.{dotted}() {on}, and {why}: "
                             f"{_read_by_name(path)}")
        return found

    def _callbacks(
        self, cls: str, owner: str, method: str, facts: MethodFacts, stack: tuple[tuple[str, str], ...]
    ) -> list[str]:
        """Calls that hand ``self`` to a helper's method which calls back into the connector (twenty-first blind round:
        ``plan.execute(self)``, whose ``RequestPlan.execute`` runs ``connector._dump(tag, blocks, key)``, was read as
        no store work, so the class's only dumps were never seen and it was judged **safe**). A method the helper
        calls on one of its parameters that the connector defines with store work makes the calling definition
        ``unknown``: which of the connector's methods run, and with which tasks, is the helper's choice."""
        found = []
        for line, target, name, receiver, back, conn_owner, acts in self._called_back(cls, facts, stack):
            hidden = f" ({HIDDEN_SUBMIT})" if "a store submit" in acts else ""
            found.append(f"{owner}.{method} (line {line}) {_callback_text(target, name, receiver, back)}, and "
                         f"{conn_owner}.{back} does {', '.join(sorted(acts))}{hidden}: the reader does not follow a "
                         "call back into the connector")
        return found

    def _called_back(
        self, cls: str, facts: MethodFacts, stack: tuple[tuple[str, str], ...]
    ) -> list[tuple[int, str, str, str, str, str, frozenset[str]]]:
        """For each call in ``facts`` that hands ``self`` to a helper's method, the first method of the connector that
        helper calls on one of its parameters with store work: (line, helper class, its method, the parameter, the
        connector's method, its owner, the store work)."""
        found = []
        for kind, what, name, line in facts.handoffs:
            if kind == "function":  # a module function of the file: ``name`` holds the methods it calls on parameters
                hit = self._first_callback(cls, [("", back) for back in name.split(",")], stack)
                if hit is not None:
                    found.append((line, MODULE_FUNCTION, what, *hit))
                continue
            if kind == "attr":
                helpers, _ = self.helpers.candidates(cls, what)
            elif kind == "class":
                helpers = [what] if what in self.helpers.helper_classes() else []
            else:
                helpers = self.helpers.helper_classes()
            for helper in helpers:
                target = self.hierarchy.lookup(helper, name)
                if target is None or self.hierarchy.classes[target].external:
                    continue
                called = self.hierarchy.method(target, name)
                hit = self._first_callback(
                    cls, [(r, back) for r, back, _ in called.loose_calls if r in called.param_names], stack)
                if hit is not None:
                    found.append((line, target, name, *hit))
                    break
        return found

    def _first_callback(
        self, cls: str, calls: list[tuple[str, str]], stack: tuple[tuple[str, str], ...]
    ) -> tuple[str, str, str, frozenset[str]] | None:
        """The first of ``calls`` (receiver, method) whose method ``cls`` defines with store work, as (receiver, method,
        its owner, the store work)."""
        for receiver, back in calls:
            owner = self.hierarchy.lookup(cls, back)
            if owner is None or self.hierarchy.classes[owner].external or (owner, back) in stack:
                continue
            acts = _store_acts(self._effect(cls, owner, back, True, stack))
            if acts:
                return receiver, back, owner, acts
        return None

    def _helper_iterations(self, cls: str, owner: str, method: str, facts: MethodFacts) -> list[str]:
        """Loops whose body waits, polls or submits over an object that may be a helper class of the analysed files
        with its own ``__iter__`` (twentieth blind round: ``for rid, task in Retired(store, table, ids): wait(task)``,
        where ``Retired.__iter__`` yields only the tasks a poll found done, was read as a wait of every preempted
        request's task): which tasks the loop sees is that ``__iter__``'s choice, which the reader does not follow."""
        found: list[str] = []
        for kind, what, line in facts.iterations:
            if kind == "class":
                candidates = [what] if what in self.helpers.helper_classes() else []
            elif kind == "attr":
                candidates, _ = self.helpers.candidates(cls, what)
            elif kind == "attr_item":
                # an entry of a self container: a helper only if one is put there, so only classes the connector
                # itself builds by name (a container of plain data holds no Retired nobody constructs); one whose
                # class is not read (a factory's) may hold anything
                candidates, _ = self.helpers.candidates(cls, what)
                candidates = candidates or self._built_helpers(cls)
                what = f"an entry of self.{what}"
            elif kind == "self_call":
                called = self.hierarchy.lookup(cls, what)
                if called is not None and not self.hierarchy.classes[called].external \
                        and self.hierarchy.method(called, what).generator:
                    continue  # a generator of the class: iterated as the generator rule reads it
                candidates = self.helpers.helper_classes()
                what = f"self.{what}()"
            else:
                candidates = self.helpers.helper_classes()
            for helper in candidates:
                target = self.hierarchy.lookup(helper, "__iter__") or self.hierarchy.lookup(helper, "__next__")
                if target is None or self.hierarchy.classes[target].external:
                    continue
                on = f"a {helper}" if kind == "class" else \
                    f"self.{what}, which may hold a {helper}" if kind == "attr" else f"{what}, which may be a {helper}"
                found.append(f"{owner}.{method} (line {line}) loops over {on}, whose own iteration ({target}) decides "
                             "which entries the loop's waits and submits see: the reader does not follow what it yields")
                break
        return found

    def _misread_on(self, helper: str, name: str, stack: tuple[tuple[str, str], ...]) -> str | None:
        """What ``<helper instance>.<name>()`` does that its name does not say; None when ``helper`` has no analysed
        ``name`` (a builtin's, a base's that was not read), when the call is one already being read, or when it
        does what the name says."""
        target = self.hierarchy.lookup(helper, name)
        if target is None or self.hierarchy.classes[target].external or (target, name) in stack:
            return None
        why = self._helper_call_misread(helper, target, name, stack)
        if why is None and (name in CONTAINER_METHODS or is_special(name)):
            # a container subclass's own extend/pop/__setitem__ (twenty-first blind round: StepBatch(list).extend
            # replaces the batch, so a fence over it waits only the newest dumps): the reader's task flow reads the
            # call as the builtin's
            base = next((c for c in self.hierarchy.mro[helper] if c in CONTAINER_BASES), None)
            if base is not None:
                why = (f"{target}.{name} overrides {base}.{name}, so which entries it keeps or drops is its own, "
                       f"not the container's ({UNSEEN_KEEPING})")
        return why

    def _helper_call_misread(self, helper: str, target: str, name: str,
                             stack: tuple[tuple[str, str], ...]) -> str | None:
        """What ``<helper instance>.<name>()`` (defined by ``target``) does that the name does not say; None when it
        does just what the reader takes the name to mean."""
        done = self._effect(helper, target, name, True, stack)
        if done.reasons:
            return done.reasons[0]
        actual = _store_acts(done)
        named = _store_acts_named(name)
        if actual == named:
            return None
        hidden = f" ({HIDDEN_SUBMIT})" if "a store submit" in actual - named else ""
        return f"{target}.{name} does {', '.join(sorted(actual)) or 'no store work'}{hidden}"

    def label(self, cls: str, owner: str, method: str) -> DefinitionLabel:
        """The spec label of ``owner``'s definition of ``method``, judged for an instance of ``cls``."""
        shadow = self._instance_shadow(cls, method)
        if shadow is not None:
            return DefinitionLabel(owner, method, UNKNOWN, (shadow,))
        owner_facts = self.hierarchy.classes[owner]
        if owner_facts.external:
            if owner_facts.opaque:
                return DefinitionLabel(owner, method, UNKNOWN, owner_facts.opaque, phantom=True)
            return DefinitionLabel(owner, method, "base")
        facts = self.hierarchy.method(owner, method)
        related = (method, *FORWARD_ALIASES.get(method, ()))
        if any(f.method in related for f in facts.forwards):
            return DefinitionLabel(owner, method, "forward")
        if facts.super_rewrites:
            line, what = facts.super_rewrites[0]
            # EagerBudgetConnector (thirtieth blind round) truncates ``meta.dumps`` after its base tracked every
            # request it planned: read as its base's, the requests whose dumps it cut were "tracked and dumped"
            return DefinitionLabel(owner, method, UNKNOWN, (
                f"{owner}.{method} {what} (line {line}) after calling super().{method}(): vLLM acts on what it "
                "returns, which is then not what its base's definition built, and the reader does not follow the "
                "change",))
        own = self.effect(cls, owner, method, delegations=False)
        plain_super = [d for d in facts.delegations if d.method == method]
        if (
            plain_super
            and all(d.kind == "super" and d.anchor == owner for d in plain_super)
            and len(facts.delegations) == len(plain_super)
            and not own.relevant
            and not own.reasons
        ):
            return DefinitionLabel(owner, method, "super")
        effect = self.effect(cls, owner, method)
        paired = self._layer_pair(cls, owner, method, effect)
        replacing = sorted({*(r for f in effect.flows for r in f.replaced), *self._replaced_in_helpers(cls, effect)}
                           ) if method in SAVE_METHODS else []
        if paired is not None:
            if paired.label == UNKNOWN or all(any("layer" in n for n in names) for _, names in replacing):
                return paired  # a per-layer key, waited (every entry) in the same step: nothing is replaced
            return self._replacing(owner, method, paired.label, replacing)
        label, reasons = classify(
            method, owner, effect, self.saves_async(cls), self._reported_waits(cls, owner, method),
            own_unconditional=not facts.has_condition,
        )
        if label == UNKNOWN and self._settled_across_helpers(cls, owner, method, effect, reasons):
            label, reasons = "sync_save", ()
        if label == "blocking" and self._waits_before_submits(cls, facts, effect):
            # DoubleBufferedDumpConnector (twenty-eighth blind round): drains the buffer filled two steps ago, then
            # submits this step's dump through a helper that returns it in a record appended to that buffer;
            # FuturesBatchDumpConnector calls ``concurrent.futures.wait`` over older futures, then hands the new
            # task's ``store.wait`` to a thread pool: either way the new dump outlives the call
            where = f"{owner}.{method}"
            return DefinitionLabel(owner, method, UNKNOWN, (
                f"{where} calls a wait and submits a dump, but every wait comes before its first submit, so none is of "
                f"a task it submits in the call: the new dump may outlive the call, its task among {UNSEEN_KEEPING}",))
        if method == "request_finished_all_groups" and label == UNKNOWN \
                and any(d.method == "request_finished" for d in facts.delegations):
            # vllm-ascend's AscendMultiConnector: super().request_finished(request, block_ids[0]) when a child lacks
            # HMA, its own answer otherwise; "does not delegate" would misdescribe it
            reasons = (f"{owner}.request_finished_all_groups calls another class's request_finished on some paths "
                       "and answers itself on others: the model has no label for an answer split that way",)
        hybrid: tuple[str, ...] = ()
        if method == "handle_preemptions" and label in ("wait_preempted", AMBIGUOUS_PREEMPT):
            switched = [(f.owner, f.name, test) for f in self._reached(cls, owner, method)
                        for test in f.switched_selections]
            if switched:
                # Either side may be the one that runs, in any case: waiting every task it holds before the forward
                # is a flush that can make even an undelayed finish safe (and a fence on a hybrid model), waiting
                # the preempted ones is not (LeaderLayoutConnector, eighth blind round: the side is chosen by the
                # KV-cache layout)
                return DefinitionLabel(owner, method, UNKNOWN, (
                    f"{owner}.handle_preemptions chooses what it waits by `{switched[0][2]}` "
                    f"({switched[0][0]}.{switched[0][1]}), between "
                    "state it holds and the preempted requests it is given: where the first is chosen it waits more "
                    "than the preempted requests' tasks before the forward (a flush; on a hybrid model a fence), and "
                    "the reader does not evaluate the test",))
            hybrid = self._two_waiting_branches(cls, owner, facts) + self._unconditional_helper_waits(cls, owner, facts)
        if method == "handle_preemptions" and label == "wait_preempted":
            unselected = self._unselected_waits(cls, owner, method, ())
            if unselected:  # it may wait more than the preempted requests' tasks: the label would be worse than the code
                return DefinitionLabel(owner, method, UNKNOWN, (
                    f"{owner}.handle_preemptions waits store tasks not selected by the preempted requests "
                    f"({unselected[0]}): it may wait more than their tasks before the forward (a flush, which makes "
                    "even an undelayed finish safe; on a hybrid model a fence over blocks freed while the request "
                    "runs), which the reader does not establish (ScopeCollapseConnector, tenth blind round)",))
        if method in ("wait_for_save", "save_kv_layer") and label in ("blocking", "sync_save"):
            split = [(f, line, test) for f in self._reached(cls, owner, method) for line, test in f.wait_or_keep]
            if split:
                where, line, test = split[0]
                return DefinitionLabel(owner, method, UNKNOWN, (
                    f"{where.owner}.{where.name} line {line}: `if {test}` waits on one side and keeps in a self "
                    f"container on the other: {owner}.{method} waits some of its dumps at once and leaves others "
                    "running, by a test the reader does not evaluate (RecordStoreConnector, twenty-ninth blind round)",))
            switch = self._only_switched_waits(cls, owner, facts)
            if switch:
                return DefinitionLabel(owner, method, UNKNOWN, (
                    f"{owner}.{method} waits store tasks only when `{switch}`: a synchronous save where the switch "
                    "is on, a deferred one where it is off, and the reader does not evaluate it (DeadlinePhaseConnector, "
                    "eighth blind round)",))
        if method == "wait_for_save" and label not in (UNKNOWN, "base", "sync_save"):
            hybrid += self._unconditional_helper_waits(cls, owner, facts)
        if method == "get_finished" and label == "report_before_wait":
            gate = self._report_gate(cls, owner)
            if gate:
                return DefinitionLabel(owner, method, UNKNOWN, gate)
        submits = sum(f.submits for f in effect.flows)
        waited = sum(f.waited_here for f in effect.flows)
        if method in ("wait_for_save", "save_kv_layer") and 0 < waited < submits and effect.kept_in:
            hybrid = (f"{owner}.{method} waits some of the dumps it submits before returning and keeps others: "
                      "a fence on a hybrid model if the waited ones are the sliding-window group's, which reading "
                      "the code cannot establish",)
        if method in ("request_finished", "request_finished_all_groups") and facts.false_when_member \
                and label not in (UNKNOWN, "base", "forward"):
            return DefinitionLabel(owner, method, UNKNOWN, (
                f"{owner}.{method} answers False (free the blocks now) when `{facts.false_when_member[0]}`: a request "
                "its set holds, whose dump may still run, is freed undelayed (BestEffortPersistConnector, sixth "
                "blind round)",))
        standing = self._standing_guard(cls, facts, ()) if method in ("request_finished", "request_finished_all_groups") \
            and label == "delay_if_tracked" else None
        if standing is not None:
            line, test = standing
            return DefinitionLabel(owner, method, UNKNOWN, (
                f"{owner}.{method} line {line}: its answer also rests on `{test}`, not only on the tracking set: a "
                "tracked request whose dump may still run can be answered False (freed at once), which the label "
                "\"delay if tracked\" does not say (FirstTokenChunkSaveConnector, twenty-fifth blind round)",))
        if method == "handle_preemptions" and label == "wait_all_always":
            undrained = self._undrained_kept(cls, owner, effect)
            if undrained:
                return DefinitionLabel(owner, method, UNKNOWN, undrained)
        if method == "handle_preemptions" and label not in (UNKNOWN, "base", "pass"):
            stale = self._set_after_preemptions(cls, owner)
            if stale:
                return DefinitionLabel(owner, method, UNKNOWN, stale)
        if method in SAVE_METHODS and label not in (UNKNOWN, "base", "pass", "sync_save", "super", "forward"):
            hybrid += self._group_selection(cls)
        lost = [why for f in self._reached(cls, owner, method) for why in f.lost_tasks] if method in SAVE_METHODS else []
        if lost and label != UNKNOWN:
            return DefinitionLabel(owner, method, label, reasons, hybrid_reasons=hybrid, beyond_model=(
                f"{owner}.{method}: {lost[0]}; the model keeps every task",))
        shared = self._shared_dumps(cls, owner, method) if method in SAVE_METHODS and label != UNKNOWN else []
        if shared:
            return DefinitionLabel(owner, method, label, reasons, hybrid_reasons=hybrid, beyond_model=(
                f"{owner}.{method}: {shared[0]}; the model gives each request its own dumps",))
        if replacing and label != UNKNOWN:
            return replace(self._replacing(owner, method, label, replacing), reasons=reasons, hybrid_reasons=hybrid)
        return DefinitionLabel(owner, method, label, reasons, hybrid_reasons=hybrid)

    def _built_helpers(self, cls: str) -> list[str]:
        """The helper classes of the analysed files that ``cls``'s own code (its analysed MRO) builds by name."""
        built: set[str] = set()
        for owner in self.hierarchy.mro[cls]:
            facts = self.hierarchy.classes[owner]
            if not facts.external:
                built |= {n for m in facts.methods.values() for n in m.plain_calls}
        return [c for c in self.helpers.helper_classes() if c in built]

    def _instance_shadow(self, cls: str, method: str) -> str | None:
        """Where an instance of ``cls`` may hold ``method`` itself (``self.handle_preemptions = PreemptionFence(...)``
        in ``__init__``, twentieth blind round): Python finds a function on the class only when the instance's own
        ``__dict__`` has no entry of that name, so what vLLM calls is the assigned object, whose code is not read."""
        if cls not in self._stored:  # every self.<x> = ... of the analysed MRO, with its first place: once per class
            stored: dict[str, str] = {}
            for owner in self.hierarchy.mro[cls]:
                if not self.hierarchy.classes[owner].external:
                    for name, defined in sorted(self.hierarchy.classes[owner].methods.items()):
                        for attr in defined.attr_stores:
                            stored.setdefault(attr, f"{owner}.{name}")
            self._stored[cls] = stored
        where = self._stored[cls].get(method)
        if where is None:
            return None
        return (f"{where} assigns self.{method}: the object it puts on the instance, not the class's {method}, is "
                "what vLLM calls, and which it is the reader does not follow")

    def _reached(self, cls: str, owner: str, method: str, delegations: bool = False) -> Iterator[MethodFacts]:
        """The facts of ``owner``'s ``method`` and of every analysed ``self`` helper it reaches (with
        ``delegations``, also every ``super()``/``Parent.m(self)`` definition), each once."""
        seen: set[tuple[str, str]] = set()
        pending = [(owner, method)]
        while pending:
            where, name = pending.pop()
            if (where, name) in seen or where not in self.hierarchy.classes or self.hierarchy.classes[where].external:
                continue
            seen.add((where, name))
            facts = self.hierarchy.method(where, name)
            yield facts
            pending += [(t, h) for h in facts.self_calls if (t := self.hierarchy.lookup(cls, h)) is not None]
            pending += [(t, d.method) for d in (facts.delegations if delegations else ())
                        if d.anchor in self.hierarchy.mro and (t := self.hierarchy.delegation_target(cls, d)) is not None]
            pending += [(t, a) for a in facts.attr_loads if (t := self.hierarchy.lookup(cls, a)) is not None
                        and not self.hierarchy.classes[t].external and self.hierarchy.method(t, a).is_property]

    def _undrained_kept(self, cls: str, owner: str, effect: Effect) -> tuple[str, ...]:
        """``wait_all_always`` says "every pending task is waited before each forward"; the reader saw a loop
        waiting every entry of some ``self`` containers. True only if the dumps are kept in those containers, or
        handed to them whole (a copy, or a move that starts the old name afresh): a drain of ``self.prev`` set by
        ``self.prev = self.cur; self.cur.clear()`` waits an empty list (StepAliasConnector, thirteenth blind
        round). The reason names a kept container no drain reaches; empty when every one is reached."""
        kept: set[str] = set()
        filled: set[str] = set()  # containers the save path adds entries to (a task a helper returned among them)
        reached: list[MethodFacts] = list(self._reached(cls, owner, "handle_preemptions"))
        for method in SAVE_METHODS:
            save_owner = self.hierarchy.lookup(cls, method)
            if save_owner is None or self.hierarchy.classes[save_owner].external:
                continue
            kept |= self.effect(cls, save_owner, method).kept_in
            for facts in self._reached(cls, save_owner, method):
                reached.append(facts)
                filled |= {attr for attr, path, _ in facts.attr_calls if path.rsplit(".", 1)[-1] in FILLING_CALLS}
        for base in self.hierarchy.mro[cls]:  # an alias made once, in any __init__ (``self.b = self.a``)
            if "__init__" in self.hierarchy.classes[base].methods and not self.hierarchy.classes[base].external:
                reached.append(self.hierarchy.method(base, "__init__"))
        drained = set().union(*(f.drains for f in effect.flows))
        transfers = {t for facts in reached for t in facts.attr_transfers}
        covered, grew = set(drained), True
        while grew:
            grew = False
            for target, source, how in transfers:
                if target in covered and source not in covered and how in ("copy", "moved"):
                    covered.add(source)
                    grew = True
        aliases = sorted((t, s) for t, s, how in transfers if how == "alias" and t in covered)
        if aliases:  # the drained list may be another name's, emptied there (kept or not: a helper may return the task)
            target, source = aliases[0]
            return (f"{owner}.handle_preemptions waits every entry of self.{target}, but self.{target} = self.{source} "
                    f"makes one container of the two, and the entries are put in and emptied through either: whether "
                    "any pending task is still in it when the drain runs is not established (StepAliasConnector, "
                    "thirteenth blind round)",)
        missing = sorted(kept - covered)
        if not kept and filled and not filled & covered:
            # the save path keeps its tasks through a helper's return value (``self.cur.append(self._dump(...))``),
            # so the reader sees no kept container: the drain must at least reach one the save path fills
            missing = sorted(filled)
        if not missing:
            return ()
        return (f"{owner}.handle_preemptions waits every entry of self.{', self.'.join(sorted(drained))}, but the dumps "
                f"are kept in self.{missing[0]}, which the reader does not see handed over to it whole: whether "
                "every pending task is waited before the forward is not established",)

    def _group_selection(self, cls: str) -> tuple[str, ...]:
        """Where ``cls`` reads the KV-cache groups' specs (``SlidingWindowSpec``, ``kv_cache_spec``, ...): it may dump
        the full-attention groups only, while the hybrid model's dumps always read the sliding-window group too,
        whose blocks vLLM frees while the request runs. A hazard the model finds there may be none of the class's
        (FlagStateConnector, sixteenth blind round: ``isinstance(g.kv_cache_spec, SlidingWindowSpec)`` in
        ``__init__`` left those groups out, and the class was read unsafe on the hybrid model). A pass stands: fewer
        groups dumped only removes hazards."""
        for owner in self.hierarchy.mro[cls]:
            facts_of = self.hierarchy.classes.get(owner)
            if facts_of is None or facts_of.external:
                continue
            for name, facts in facts_of.methods.items():
                read = sorted(facts.words & GROUP_SPEC_WORDS)
                if read:
                    return (f"{owner}.{name} reads `{read[0]}`: the class may choose which KV-cache groups it dumps by "
                            "their spec, leaving out the sliding-window group the hybrid model's dumps read",)
        return ()

    def _set_after_preemptions(self, cls: str, owner: str) -> tuple[str, ...]:
        """vLLM 0.32 calls ``handle_preemptions`` before it binds the step's metadata (gpu_model_runner.py
        ~3968-3971; bind_connector_metadata comes with the forward): a preemption wait that selects its tasks
        by state ``bind_connector_metadata`` sets acts on the previous step's (StepViewPersistConnector, sixth
        blind round)."""
        for facts in self._reached(cls, owner, "handle_preemptions"):
            bound = sorted(facts.self_calls & {"_get_connector_metadata", "has_connector_metadata"})
            if bound:
                return (f"{facts.owner}.{facts.name} (run by {owner}.handle_preemptions) reads the bound metadata "
                        f"(self.{bound[0]}()): vLLM 0.32 calls handle_preemptions before it binds the step's "
                        "metadata (gpu_model_runner.py ~3971, kv_connector_model_runner_mixin.py ~77), so it sees "
                        "the previous step's, or none (BoundMetaPropertyConnector, seventh blind round)",)
        binder = self.hierarchy.lookup(cls, "bind_connector_metadata")
        if binder is None or self.hierarchy.classes[binder].external:
            return ()
        stored = {attr for facts in self._reached(cls, binder, "bind_connector_metadata")
                  for attr in (*facts.attr_stores, *(a for a, ops in facts.attr_ops if ops & {"add", "assign"}))}
        loaded = {attr for facts in self._reached(cls, owner, "handle_preemptions") for attr in facts.attr_loads}
        stale = sorted((loaded & stored) - {"_connector_metadata"})
        if not stale:
            return ()
        return (f"{owner}.handle_preemptions reads self.{stale[0]}, which bind_connector_metadata sets: vLLM 0.32 "
                "calls handle_preemptions before it binds the step's metadata (gpu_model_runner.py ~3968-3971), so "
                "it sees the previous step's",)

    def _only_switched_waits(self, cls: str, owner: str, facts: MethodFacts,
                             stack: tuple[str, ...] = ()) -> str | None:
        """The switch (a test of ``self``'s state alone) under which every wait ``facts`` reaches runs, when
        there is one: no store wait, nor a call of a ``self`` helper that waits, runs outside such a switch (a
        helper whose own waits all run under a switch counts as switched)."""
        tests: list[str] = []
        for test, callee in facts.switched_waits:
            if callee != "wait":
                target = self.hierarchy.lookup(cls, callee)
                if target is None or self.hierarchy.classes[target].external or callee in stack \
                        or not self._effect(cls, target, callee, True, ()).calls & WAIT_CALLS:
                    continue
                test = test or self._only_switched_waits(cls, target, self.hierarchy.method(target, callee),
                                                         (*stack, callee)) or ""
            if not test:
                return None
            tests.append(test)
        return tests[0] if tests else None

    def _unselected_waits(self, cls: str, owner: str, method: str, stack: tuple[tuple[str, str], ...]) -> list[str]:
        """Where ``owner``'s ``method`` (and the waiting helpers it calls without naming the preempted
        requests) waits store tasks chosen by nothing named for preemption."""
        if (owner, method) in stack or self.hierarchy.classes[owner].external:
            return []
        found: list[str] = []
        for line, callee in self.hierarchy.method(owner, method).unselected_waits:
            if callee == "wait":
                found.append(f"{owner}.{method} {line}")
                continue
            target = self.hierarchy.lookup(cls, callee)
            if target is None or self.hierarchy.classes[target].external:
                continue
            if self._effect(cls, target, callee, True, ()).calls & WAIT_CALLS:
                found += self._unselected_waits(cls, target, callee, (*stack, (owner, method)))
        return found

    def _report_gate(self, cls: str, owner: str) -> tuple[str, ...]:
        """A ``get_finished`` that waits nothing but reports only requests a ``self`` table no longer holds
        (``rid not in self._open``), where the method that removes them waits store tasks or calls what the
        reader does not follow (a batch's ``close()``, run on a timer thread): the report may come after the
        dumps ended (TimerGraceConnector, seventh blind round), which no label says."""
        reached = list(self._reached(cls, owner, "get_finished"))
        tested = {a for facts in reached for a, ops in facts.attr_ops if "test" in ops}
        for other, name, facts in self._resolved_definitions(cls):
            if name == "get_finished":
                continue
            removed = {a for a, ops in facts.attr_ops if "remove" in ops} & tested
            if not removed:
                continue
            calls = self._effect(cls, other, name, True, ()).calls
            unfollowed = sorted(calls - NEVER_WAIT - WAIT_CALLS)
            waiting_callers = self._waiting_callers(cls, name)
            if calls & WAIT_CALLS or waiting_callers or unfollowed:
                does = ("waits store tasks" if calls & WAIT_CALLS else
                        f"is called by {waiting_callers[0]}, which waits store tasks" if waiting_callers else
                        f"calls {unfollowed[0]}(), not followed")
                return (f"{owner}.get_finished reports only requests self.{sorted(removed)[0]} no longer holds, "
                        f"and {other}.{name}, which removes them, {does}: whether a reported request's dumps "
                        "have ended is not read",)
        return self._credited_gate(cls, owner, reached)

    def _waits_before_submits(self, cls: str, facts: MethodFacts, effect: Effect) -> bool:
        """Does every statement of the definition that reaches a store wait (itself or through a ``self`` helper)
        come before the first one that reaches a submit, with no submitted task waited in the call? Then the waits
        are of older tasks, and the save is not synchronous."""
        if any(f.waited_here for f in effect.flows) or effect.submits_waited:
            return False
        waits: list[int] = []
        submits: list[int] = []
        for _, path, line in facts.attr_calls:
            name = path.rsplit(".", 1)[-1]
            (waits if name in WAIT_CALLS else submits if name in SUBMIT_CALLS else []).append(line)
        for helper, line in facts.self_call_sites:
            where = self.hierarchy.lookup(cls, helper)
            if where is None or self.hierarchy.classes[where].external:
                continue
            calls = self._effect(cls, where, helper, True, ()).calls
            if calls & WAIT_CALLS:
                waits.append(line)
            if calls & SUBMIT_CALLS:
                submits.append(line)
        return bool(waits) and bool(submits) and max(waits) < min(submits)

    def _shared_dumps(self, cls: str, owner: str, method: str) -> list[str]:
        """A save that skips keys a ``self`` table already holds and records its own dump there by key after
        submitting it: deduplication across requests (a prompt block another request's task is already dumping
        is not dumped again), so one request's blocks may be read by another's task, and which tasks a request's
        waits find depends on the other requests. The model gives each request its own dumps
        (HashScopedPrefixDumpConnector, twenty-seventh blind round: judged safe with one group, truth unsafe:
        a request dropping the shared hashes takes the owner's in-flight entries with it)."""
        found = []
        for facts in self._reached(cls, owner, method):
            if not facts.keyed_after_submit:
                continue
            asked = set(facts.member_tests)
            for helper in facts.self_calls:
                where = self.hierarchy.lookup(cls, helper)
                if where is not None and not self.hierarchy.classes[where].external:
                    asked |= self.hierarchy.method(where, helper).member_tests
            shared = sorted(asked & facts.keyed_after_submit)
            if shared:
                found.append(f"{facts.owner}.{facts.name} skips keys self.{shared[0]} already holds and records its own "
                             f"dump there after submitting it: a dump shared by several requests (deduplicated by "
                             "key), whose waits then depend on the other requests")
        return found

    def _credited_gate(self, cls: str, owner: str, reached: Sequence[MethodFacts]) -> tuple[str, ...]:
        """A ``get_finished`` that waits nothing but asks a ``self`` helper about each request (``if
        self._gate_open(r)``, answering ``self._completed[r] >= self._submitted[r]``), where the state the helper
        reads is written by a method that only runs after a wait (``_credit``, called by the poll and the drain
        right after ``store.wait``): the report may wait for the dumps to end through that state
        (CounterGatedDumpConnector, twenty-seventh blind round: read report_before_wait, unsafe, truth safe).
        Writes in the save methods, the finish and ``__init__`` are left out: they are not completions."""
        helpers = [facts for facts in reached if facts.name != "get_finished"]
        read = {a for facts in helpers for a, ops in facts.attr_ops if ops & {"read", "test"}}
        if not read:
            return ()
        skipped = {"get_finished", "__init__", "build_connector_meta", "request_finished",
                   "request_finished_all_groups", *SAVE_METHODS}
        for other, name, facts in self._resolved_definitions(cls):
            if name in skipped:
                continue
            written = sorted({a for a, ops in facts.attr_ops if ops & {"add", "remove", "assign"}} & read)
            if not written:
                continue
            waits = bool(self._effect(cls, other, name, True, ()).calls & WAIT_CALLS)
            waiting_callers = [] if waits else self._waiting_callers(cls, name)
            if waits or waiting_callers:
                asked = sorted(f.name for f in helpers)
                does = "waits store tasks" if waits else f"is called by {waiting_callers[0]}, which waits store tasks"
                return (f"{owner}.get_finished reports requests by what self.{asked[0]}() answers from "
                        f"self.{written[0]}, and {other}.{name}, which changes it, {does}: whether the answer "
                        "holds a request until its dumps have ended is not read",)
        return ()

    def _waiting_callers(self, cls: str, callee: str) -> list[str]:
        """``Class.method`` of each method ``cls`` resolves that calls ``self.<callee>()`` and waits store tasks
        (a drain thread's loop retiring what it waited)."""
        return [f"{owner}.{name}" for owner, name, facts in self._resolved_definitions(cls)
                if callee in facts.self_calls and self._effect(cls, owner, name, True, ()).calls & WAIT_CALLS]

    def _resolved_definitions(self, cls: str) -> Iterator[tuple[str, str, MethodFacts]]:
        """``(owner, name, facts)`` of every analysed definition an instance of ``cls`` runs (the one its MRO
        resolves for each name), in MRO order."""
        for owner in self.hierarchy.mro[cls]:
            facts_of = self.hierarchy.classes[owner]
            if facts_of.external:
                continue
            for name, facts in facts_of.methods.items():
                if self.hierarchy.lookup(cls, name) == owner:
                    yield owner, name, facts

    def _standing_guard(self, cls: str, facts: MethodFacts, seen: tuple[str, ...]) -> tuple[int, str] | None:
        """The first condition of ``facts.delay_guards`` that may make a tracked request's answer False on an
        instance of ``cls``: one reading anything but the tracking set, the request's id, class constants
        (``DELAY_FREE = True``, never assigned on the instance) and ``self`` helpers answering from those alone."""
        for guard in facts.delay_guards:
            if guard.foreign:
                return guard.line, guard.text
            for helper in sorted(guard.helpers):
                owner = self.hierarchy.lookup(cls, helper)
                if owner is None or self.hierarchy.classes[owner].external or helper in seen or len(seen) > 3:
                    return guard.line, guard.text
                target = self.hierarchy.method(owner, helper)
                if not target.answers_read or target.generator or target.opaque \
                        or self._standing_guard(cls, target, (*seen, helper)) is not None:
                    return guard.line, guard.text
            loading = _membership_set(guard)
            if loading is not None and self._async_load_set(cls, loading):
                continue
            constants = {flag: self._class_constant(cls, flag) for flag in guard.flags}
            if _guard_value(guard, constants) == "other":
                return guard.line, guard.text
        helper = facts.returned_self_call
        if helper is not None:
            # ``return self._finish(request, (block_ids,))``: the answer is the helper's, guards and all, as ``cls``
            # resolves it (CompactSpanDump, a blind round's: its ``_finish`` answers False when the tables are
            # empty, for a request its set still holds); a chain not followed to its end is a guard of its own
            owner = self.hierarchy.lookup(cls, helper)
            if owner is None or self.hierarchy.classes[owner].external or helper in seen or len(seen) > 3:
                return facts.lineno, f"self.{helper}(...)"
            return self._standing_guard(cls, self.hierarchy.method(owner, helper), (*seen, helper))
        return None

    def _async_load_set(self, cls: str, attr: str) -> bool:
        """Is ``self.<attr>`` the set of requests whose asynchronous load runs, as the reference connector keeps
        it: every method that puts a request in also takes it out of the tracking set (its dumps were waited at
        the preemption before the load, as the model's ``AsyncAdmit`` untracks it), and a method takes requests
        out by ``finished_recving`` (before vLLM runs them again, scheduler.py ~3222-3231)? While a request waits
        for its load vLLM holds its blocks itself (``finish_requests`` ~2702-2708), so a finish answering False for
        it frees nothing a dump reads."""
        adders, emptied = [], False
        for owner in self.hierarchy.mro[cls]:
            facts = self.hierarchy.classes[owner]
            if facts.external:
                continue
            for name, method in facts.methods.items():
                if self.hierarchy.lookup(cls, name) != owner:
                    continue
                ops = dict(method.attr_ops).get(attr, frozenset())
                if ops & {"add"}:
                    adders.append(method)
                if ops & {"remove"} and "finished_recving" in method.words:
                    emptied = True
        return bool(adders) and emptied and all("remove" in method.tracking_ops for method in adders)

    def _class_constant(self, cls: str, name: str) -> object:
        """``name``'s literal value as a class attribute of ``cls`` (the first class in the MRO binding it), when no
        analysed method assigns ``self.<name>``; ``_NOT_CONSTANT`` otherwise."""
        for owner in self.hierarchy.mro[cls]:
            facts = self.hierarchy.classes[owner]
            if facts.external:
                continue
            if any(name in m.attr_stores for m in facts.methods.values()):
                return _NOT_CONSTANT
        for owner in self.hierarchy.mro[cls]:
            facts = self.hierarchy.classes[owner]
            if facts.external:
                return _NOT_CONSTANT
            if name in facts.bound_names:
                value = dict(facts.constants).get(name)
                return ast.literal_eval(value) if value is not None else _NOT_CONSTANT
        return _NOT_CONSTANT

    def _replaced_in_helpers(self, cls: str, effect: Effect) -> set[tuple[str, frozenset[str]]]:
        """Tasks a save hands to a ``self`` helper (``self._track(rid, task)``) that keeps its parameter one per
        key (``self._tasks[rid] = [task]``): replaced like a task the save keeps so itself."""
        found: set[tuple[str, frozenset[str]]] = set()
        for flow in effect.flows:
            for helper, position in flow.passed:
                owner = self.hierarchy.lookup(cls, helper)
                if owner is None or self.hierarchy.classes[owner].external:
                    continue
                facts = self.hierarchy.method(owner, helper)
                if isinstance(position, int):
                    if position >= len(facts.param_names):
                        continue
                    param = facts.param_names[position]
                else:
                    param = position
                found |= {(attr, names) for kept, attr, names in facts.replacing_params if kept == param}
        return found

    @staticmethod
    def _replacing(owner: str, method: str, label: str, replacing: list[tuple[str, frozenset[str]]]) -> DefinitionLabel:
        """A save keeping one task per key loses the earlier task when a key comes again; the model keeps
        every task, so ``label`` is better than the code (DeferredSlotStore of the second blind round:
        ``self._inflight[req_id]`` written once per layer, judged safe with two layers)."""
        attr, names = replacing[0]
        return DefinitionLabel(owner, method, label, beyond_model=(
            f"{owner}.{method} keeps its dump tasks one per key (self.{attr}[{', '.join(sorted(names)) or '...'}] "
            "= task): a later dump under the same key (another layer of the same step, or the same request in a "
            "later step) replaces the earlier task, which nothing then waits; the model keeps every task",))

    def _reported_waits(self, cls: str, owner: str, method: str) -> bool:
        """Does ``owner``'s definition wait tasks selected by what it reports? Followed into a ``super()``
        the body only passes through."""
        facts = self.hierarchy.method(owner, method)
        if facts.reported_waits is not None:
            return facts.reported_waits
        for delegation in facts.delegations:
            target = self.hierarchy.delegation_target(cls, delegation) if delegation.anchor in self.hierarchy.mro else None
            if target is not None and not self.hierarchy.classes[target].external:
                return self._reported_waits(cls, target, delegation.method)
        return True  # no wait here at all: the label says so (report_before_wait)

    def _layer_pair(self, cls: str, owner: str, method: str, effect: Effect) -> DefinitionLabel | None:
        """A layer-wise save that keeps each layer's task on ``self`` and a ``wait_for_save`` (as ``cls``
        resolves it) that waits every kept task in a loop: together a synchronous save of the step. A loop
        that can stop before the last task (``break``/``return``) leaves the other layers' dumps unwaited
        when one wait fails: not a synchronous save, and not a deferred dump the model has a label for."""
        if method not in ("save_kv_layer", "wait_for_save") or effect.reasons:
            return None
        save_owner = owner if method == "save_kv_layer" else self.hierarchy.lookup(cls, "save_kv_layer")
        wait_owner = owner if method == "wait_for_save" else self.hierarchy.lookup(cls, "wait_for_save")
        if save_owner is None or wait_owner is None:
            return None
        if self.hierarchy.classes[save_owner].external or self.hierarchy.classes[wait_owner].external:
            return None
        save = self.effect(cls, save_owner, "save_kv_layer")
        wait = self.effect(cls, wait_owner, "wait_for_save")
        kept = save.kept_in
        if not kept or save.reasons or save.submits_waited or _pending_hints(save):
            return None
        if not kept <= wait.waits_each:
            return None
        if wait.reasons and not kept & wait.stops_early:
            return None
        if kept & wait.stops_early:
            attr = sorted(kept & wait.stops_early)[0]
            return DefinitionLabel(owner, method, UNKNOWN, (
                f"{wait_owner}.wait_for_save waits the per-layer tasks in self.{attr} in a loop that can stop "
                f"before the last one ({save_owner}.save_kv_layer keeps one per layer): with two or more layers "
                "and a failing wait, the other layers' dumps are left unwaited while their blocks may be freed; "
                "the model has no label for a partial wait",))
        if sum(f.submits for f in wait.flows):
            return None  # it submits too: each classified on its own
        records = (save.records | wait.records) - kept
        if not save.tracking_ops and not wait.tracking_ops and not records:  # the waiting is the sync save's
            return DefinitionLabel(owner, method, "sync_save" if method == "save_kv_layer" else "base")
        # The pair also keeps request records. As a synchronous save it would drop them, and with them the
        # reports they feed (WriteBackManifestConnector reports requests it never delayed: judged safe so);
        # as a deferred dump it would leave tasks the loop waits. Per-layer tasks, and a wait_for_save the
        # model reads as its benign readings (wait_all among them).
        if method == "save_kv_layer":
            return DefinitionLabel(owner, method, "submit_layer")
        return DefinitionLabel(owner, method, UNKNOWN, (
            f"{wait_owner}.wait_for_save waits every per-layer task {save_owner}.save_kv_layer keeps, and the two "
            "also keep request records: which requests the model should track for the reports is not read",))

    def _settled_across_helpers(self, cls: str, owner: str, method: str, effect: Effect,
                                reasons: tuple[str, ...]) -> bool:
        """A save the per-definition flow could not read as synchronous (it tracks nothing and submits in one helper,
        waits in another) whose every task settled_paths.py follows into a container a later helper of the same call
        waits entry by entry (StepBatchConnector, thirtieth blind round: ``_submit_batch(batch)`` appends to
        ``batch.tasks``, ``_settle(batch.tasks)`` waits each)."""
        if method not in ("wait_for_save", "save_kv_layer") or effect.reasons or effect.tracking_ops:
            return False
        if effect.calls & CHECK_CALLS or _pending_hints(effect) or effect.kept_in \
                or any(f.waited_if for f in effect.flows):
            return False
        readable = (f"{owner}.{method} {UNTRACKED_SAVE}", f"{owner}.{method} {SPLIT_SAVE_WAIT}")
        return bool(reasons) and all(r in readable for r in reasons) \
            and settled_across_helpers(self, cls, owner, method)

    def saves_async(self, cls: str) -> bool:
        """Does anything ``cls`` runs visibly keep dumps in flight (the tracking set, a store submit)? Only
        then is a ``build_connector_meta`` that tracks nothing known to leave a dump untracked."""
        for owner in self.hierarchy.mro[cls]:
            facts = self.hierarchy.classes[owner]
            if facts.external:
                continue
            for method in facts.methods.values():
                if method.tracking_ops or method.calls & SUBMIT_CALLS:
                    return True
        return False

    def forward_label(self, owner: str, method: str, inner: str) -> DefinitionLabel:
        """The label of ``owner``'s forwarding definition of ``method`` when it wraps an ``inner`` instance:
        the inner method it actually calls (``isinstance`` guards decided by ``inner``'s MRO), resolved along
        ``inner``'s MRO; ``unknown`` when it calls several, or one ``inner`` lacks."""
        facts = self.hierarchy.method(owner, method)
        related = (method, *FORWARD_ALIASES.get(method, ()))
        forwards = [f for f in facts.forwards if f.method in related]
        inner_mro = set(self.hierarchy.mro[inner])
        taken = [f for f in forwards if all((cls in inner_mro) == positive for cls, positive in f.guards)]
        where = f"{owner}.{method}"
        targets = list(dict.fromkeys(f.method for f in taken))
        if not targets:
            return DefinitionLabel(owner, method, UNKNOWN, (
                f"{where} forwards only under isinstance tests an {inner} instance fails",))
        if len(targets) > 1:
            calls = " or ".join(f"self.{f.attr}.{f.method}()" for f in taken)
            return DefinitionLabel(owner, method, UNKNOWN, (
                f"{where} calls {calls} depending on run-time state",))
        target = targets[0]
        attr = taken[0].attr
        if self.hierarchy.lookup(inner, target) is None:
            dynamic = self.hierarchy.lookup(inner, "__getattr__")
            why = (f"{where} calls self.{attr}.{target}(), which {inner} supplies only through "
                   f"{dynamic}.__getattr__") if dynamic else (
                f"{where} calls self.{attr}.{target}(), which {inner} does not define (AttributeError at run time)")
            return DefinitionLabel(owner, method, UNKNOWN, (why,))
        if target == method:
            return DefinitionLabel(owner, method, "forward")
        return DefinitionLabel(owner, method, CROSS_FORWARD_LABELS[(method, target)])


def _callback_text(target: str, name: str, receiver: str, back: str) -> str:
    """How a hand-off of ``self`` reaches back into the connector, in a reason's words."""
    if target == MODULE_FUNCTION:
        return f"hands self to {name}(), a function of the module that calls .{back}() on its parameters"
    return f"hands self to {target}.{name}(), which calls back {receiver}.{back}()"


def _read_by_name(name: str) -> str:
    """The end of a misread call's reason: what the reader would take a call named ``name`` to do."""
    return (f"the reader reads that call by its name ({', '.join(sorted(_store_acts_named(name))) or 'no store work'}), "
            "not by what it does")


def _store_acts_named(name: str) -> frozenset[str]:
    """What the reader takes a call named ``name`` to do to store tasks (:func:`named_store_acts`), a
    synchronous write (``save_file``) included, whatever it is called on."""
    return named_store_acts(name) | ({"a synchronous write"} if name in SYNC_SAVE_CALLS else frozenset())


def _store_acts(effect: Effect) -> frozenset[str]:
    """What a call's effect does to store tasks, in the words of :func:`_store_acts_named`."""
    acts = set().union(*(_store_acts_named(c) for c in effect.calls))
    if _pending_hints(effect):
        acts.add("a hand-off to another thread or stream")
    return frozenset(acts)


_NOT_CONSTANT = object()


def _membership_set(guard: DelayGuard) -> str | None:
    """``x`` when the guard is exactly ``<the request's id> in self.x``."""
    try:
        expr = ast.parse(guard.text, mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], ast.In)):
        return None
    left, right = expr.left, expr.comparators[0]
    ident = (isinstance(left, ast.Attribute) and left.attr in ("request_id", "req_id")) or (
        isinstance(left, ast.Name) and left.id in guard.plain)
    if ident and isinstance(right, ast.Attribute) and isinstance(right.value, ast.Name) and right.value.id == "self":
        return right.attr
    return None


def _guard_value(guard: DelayGuard, constants: dict[str, object]) -> str:
    """A guard with its flags replaced by their class constants: ``"const"`` (it no longer depends on the request),
    ``"track"`` (it reads only the tracking set, the request's id and helpers already found to do so) or
    ``"other"``."""
    def value(node: ast.expr) -> tuple[str, bool | None]:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and node.attr in constants:
            constant = constants[node.attr]
            return ("other", None) if constant is _NOT_CONSTANT else ("const", bool(constant))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            kind, truth = value(node.operand)
            return (kind, None if truth is None else not truth)
        if isinstance(node, ast.BoolOp):
            stop = isinstance(node.op, ast.Or)  # the operand value that decides the whole
            rest = []
            for operand in node.values:
                kind, truth = value(operand)
                if kind == "const" and truth is stop:
                    return "const", stop
                if kind != "const":
                    rest.append(kind)
            if not rest:
                return "const", not stop
            return ("track", None) if all(k == "track" for k in rest) else ("other", None)
        reads = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                 and n.value.id == "self"} & set(constants)
        return ("other", None) if reads else ("track", None)
    try:
        expr = ast.parse(guard.text, mode="eval").body
    except SyntaxError:
        return "other"
    return value(expr)[0]


def _pending_hints(effect: Effect) -> list[str]:
    """Hand-offs that may still run after the call returns: a ``non_blocking`` copy counts only when no
    synchronising call (``.cpu()``, ``synchronize()``) in the same call waits for it."""
    synced = bool(effect.calls & SYNC_POINT_CALLS)
    return [h for h in effect.async_hints if not (synced and "non_blocking" in h)]


def _reads(effect: Effect) -> bool:
    return bool(effect.tracking_ops & {"read", "remove"})


def classify(
    method: str,
    owner: str,
    effect: Effect,
    saves_async: bool = True,
    reported_waits: bool = True,
    own_unconditional: bool = False,
) -> tuple[str, tuple[str, ...]]:
    """Map a definition's full effect to the label the spec gives that kind of body; ``(unknown, why)``
    when the effect matches none of them or part of it could not be followed. ``saves_async``: the class
    visibly keeps dumps in flight, so not tracking them is a definite ``notrack``."""
    if effect.reasons:
        return UNKNOWN, effect.reasons
    where = f"{owner}.{method}"
    if effect.abstract:
        return UNKNOWN, (f"{where} {ABSTRACT_REASON}",)
    waits = bool(effect.calls & WAIT_CALLS)
    submits = bool(effect.calls & SUBMIT_CALLS)
    hints = _pending_hints(effect)
    synchronous = bool(effect.calls & SYNC_SAVE_CALLS) and not submits and not hints
    if effect.submits_waited and not hints and method in ("save_kv_layer", "wait_for_save"):
        if not effect.tracking_ops and not effect.calls & CHECK_CALLS:
            return "sync_save", ()  # submit, then wait that very task: nothing outlives the call
    if method in ("build_connector_meta", "wait_for_save") and "add" in effect.tracking_ops \
            and effect.guarded_adds and not effect.plain_adds:
        return UNKNOWN, (f"{where} {GUARDED_TRACKING} ({effect.guarded_adds[0]}) "
                         "while the rest of the call runs either way: a request whose dump it emits may stay "
                         "untracked, and its finish then frees blocks the dump reads",)
    if method == "build_connector_meta":
        if "add" in effect.tracking_ops:
            return "track", ()
        nested = sorted((f"self.{attr}.{path}()" for _, attr, path in effect.attr_calls
                         if path.count(".") == 1 and path.rsplit(".", 1)[1] in ("add", "update")),
                        key=lambda call: not call.endswith(".add()"))
        if saves_async and nested:
            # LifecycleDumpConnector (twenty-eighth blind round) tracks in ``self._state.delayed``, a set on a
            # state object its finish consults: "tracks nothing" gave a counterexample the class never runs
            return UNKNOWN, (f"{where} calls {nested[0]}, on a set an object of the class keeps, which the reader "
                             "does not follow as a tracking set: whether it tracks the requests it dumps is not read",)
        if saves_async:
            return "notrack", ()
        return UNKNOWN, (f"{where} tracks nothing, and no dump of this class is visibly asynchronous: "
                         "whether anything needs tracking is not known",)
    if method in ("request_finished", "request_finished_all_groups") and effect.delay_answer is not None:
        # every answer is the same literal, whatever else the body reads or returns (kv_transfer_params)
        return ("delay_all" if effect.delay_answer else "base"), ()
    if method == "request_finished":
        if _reads(effect) and effect.constant is None:
            return "delay_if_tracked", ()
        if effect.constant == "(False, None)" or effect.noop:
            return "base", ()
        if effect.constant == "(True, None)":
            return "delay_all", ()  # every finished request's free waits for its finished_sending
        return UNKNOWN, (f"{where} decides the delay without consulting the tracking set",)
    if method == "request_finished_all_groups":
        if "request_finished" in effect.self_calls:
            return "call_request_finished", ()
        if _reads(effect) and effect.constant is None:
            # deciding itself, as request_finished would (FullAttentionDumpConnector, thirtieth blind round: a
            # membership test on the set its build path fills; vLLM calls this method on an HMA connector)
            return "delay_if_tracked", ()
        if effect.constant == "(False, None)" or effect.noop:
            return "base", ()
        if effect.constant == "(True, None)":
            return "delay_all", ()
        return UNKNOWN, (f"{where} does not delegate to request_finished",)
    if method == "handle_preemptions":
        if waits and any(f.drains for f in effect.flows) and own_unconditional:
            return "wait_all_always", ()  # drains every pending task before each forward, whatever was freed
        kept = sorted(w for w in effect.words - effect.foreign_words if "freed" in w.lower())
        if waits and any("freed" in w.lower() for w in effect.foreign_words):
            return "wait_freed", ()  # the fence: also waits tasks reading blocks freed since the last schedule
        if waits and kept:
            # RetiringSaveConnector (eighteenth blind round) kept every task in ``self._freed`` and waited only
            # the preempted requests' ones: a name the class chose says nothing of vLLM's frees
            return UNKNOWN, (f"{where} selects the tasks it waits by `{kept[0]}`, which the class keeps itself: "
                             "whether that names the blocks vLLM freed (a fence) or something else is not read",)
        if waits and any("block" in w.lower() for w in effect.words):
            return AMBIGUOUS_PREEMPT, ()
        if waits:
            return "wait_preempted", ()
        if effect.noop:
            return "base", ()
        return UNKNOWN, (f"{where} does not visibly wait on a store task",)
    if method in ("save_kv_layer", "wait_for_save") and any(f.waited_if for f in effect.flows):
        return UNKNOWN, (f"{where} waits the dumps it submits only under a condition (a configuration switch, a "
                         "test of the task): a synchronous save on one branch, a deferred one on the other",)
    if method in ("save_kv_layer", "wait_for_save") and not submits and effect.value_calls:
        # a save with no visible submit that calls a value (a transition table's lambda, a callback it was handed):
        # read as submitting nothing, the class was judged with no dumps, so nothing could be overwritten
        where_call, call = effect.value_calls[0].rsplit(": ", 1)
        return UNKNOWN, (f"{where} calls {call} ({where_call}), a callable the reader does not resolve: it may submit a "
                         f"dump that outlives the call ({HIDDEN_SUBMIT})",)
    if method == "save_kv_layer":
        if submits and waits and not effect.submits_waited:
            # ResyncSlotStore: ``_persist`` submits and keeps the task under the request id, then ``_settle``
            # pops that id and waits it; a per-layer task it was called ``submit_layer`` (unsafe on hybrid)
            return UNKNOWN, (f"{where} {SPLIT_SAVE_WAIT}",)
        if submits:
            return "submit_layer", ()
        if hints:
            return UNKNOWN, (f"{where} may leave a save running after it returns: {hints[0]}",)
        if synchronous and not effect.tracking_ops:
            return "sync_save", ()
        if effect.noop or not effect.relevant:
            return "pass", ()
        return UNKNOWN, (f"{where} does protocol work other than submitting a dump",)
    if method == "wait_for_save":
        if hints and not submits:  # a pool/thread/stream hand-off: the model's labels do not cover it
            return UNKNOWN, (f"{where} may leave a save running after it returns: {hints[0]}",)
        if "add" in effect.tracking_ops:
            if not submits:
                return "poll_track", ()
            submitted = sum(f.submits for f in effect.flows)
            waited = sum(f.waited_here for f in effect.flows)
            partial = bool(effect.kept_in) and waited < submitted
            if 0 < waited < submitted and not effect.kept_in and not any(f.waits_each for f in effect.flows) \
                    and not effect.calls & CHECK_CALLS:
                # FrozenRecordStatsConnector (eleventh blind round): one dump waited in the call (an inline
                # group), the other's task handed to a helper (``self._record(rid, store.dump(...))``): neither
                # every dump waited (blocking) nor visibly kept for a later wait
                return UNKNOWN, (f"{where} waits {waited} of the {submitted} dumps it submits in the call; where the "
                                 "others' tasks go (a helper it hands them to) is not read",)
            blocking = waits and not effect.calls & CHECK_CALLS and not partial  # a kept task is still pending
            return ("blocking" if blocking else "poll_track_submit"), ()
        if effect.noop:
            return "base", ()
        if synchronous and not effect.tracking_ops and not waits:
            return "sync_save", ()
        if hints:
            return UNKNOWN, (f"{where} may leave a save running after it returns: {hints[0]}",)
        return UNKNOWN, (f"{where} {UNTRACKED_SAVE}",)
    if method == "get_finished":
        if _reads(effect) and effect.constant is None:
            if waits and not reported_waits:
                return UNKNOWN, (f"{where} {UNSELECTED_REPORT_WAITS}: "
                                 "a reported request's dump may still be running when vLLM frees its blocks",)
            if not waits and effect.calls & CHECK_CALLS:
                # ``if all(store.check(t) for t in tasks): done.add(r)`` reports completed dumps only; the model has
                # no label for a report gated by polling (ChunkSaveConnector of the sixth blind round)
                return UNKNOWN, (f"{where} polls store tasks ({', '.join(sorted(effect.calls & CHECK_CALLS))}()) and "
                                 "reports requests without waiting: whether it reports only requests whose every "
                                 "dump has ended is not modelled",)
            if not waits and effect.calls & COMPLETION_QUERIES:
                # ``if all(f.done() for f in self._inflight[r])`` over futures of a coroutine or thread that waits
                # the store task, ``entry.event.is_set()`` set by a completion thread after its wait: the report
                # may follow the dumps' end (AsyncioLoopDumpConnector, EventTrackedDumpConnector, 28th blind round)
                return UNKNOWN, (f"{where} asks whether futures or events are done "
                                 f"({', '.join(f'{c}()' for c in sorted(effect.calls & COMPLETION_QUERIES))}) and reports "
                                 "requests without waiting: whether they end only after the requests' dumps is not "
                                 "read",)
            unfollowed = sorted(effect.calls - NEVER_WAIT - WAIT_CALLS)
            if not waits and unfollowed:
                return UNKNOWN, (f"{where} reports requests and calls {', '.join(f'{c}()' for c in unfollowed[:3])}, "
                                 "which the reader does not follow: one may wait their dumps",)
            return ("wait_finished" if waits else "report_before_wait"), ()
        if effect.constant == "(None, None)" and waits:
            # DeferredTrackerStore (a blind round's): waits the finished requests' dumps, reports nothing (its finish
            # answers False); as a MultiConnector child those waits come before its sibling's report can free the
            # blocks. Read as base (nothing waited), the model found an overwrite the class never lets happen
            return UNKNOWN, (f"{where} {SILENT_WAITS}: waits the model's get_finished without a report does not "
                             "make",)
        if effect.constant == "(None, None)" or effect.noop:
            return "base", ()
        return UNKNOWN, (f"{where} reports without consulting the tracking set",)
    if method == "_wait_pending_dump_task":
        if not waits:
            return UNKNOWN, (f"{where} does not wait on a store task",)
        if effect.finally_calls:
            return "release_finally", ()
        released = effect.calls - NEVER_WAIT - WAIT_CALLS
        if not released:
            # PrefetchDirectConnector (twenty-sixth blind round) keeps the PR's helper name for a plain store wait
            # with no handle at all: read as releasing on success only, its failed waits "leaked" a handle that
            # does not exist, an unsafe verdict on a safe class
            return UNKNOWN, (f"{where} waits its task and releases nothing after it: whether the class holds a "
                             "device event per task, which the PR's helper releases here, is not read (with none, "
                             "a failed wait leaks nothing; with one, it is never released)",)
        if released & effect.handler_calls:
            return UNKNOWN, (f"{where} calls {', '.join(sorted(released & effect.handler_calls))}() in an except "
                             "handler: a release on both paths or on a failure only, which the reader does not "
                             "tell apart without a finally",)
        return "release_on_success", ()
    raise ValueError(f"{method!r} is not a method the spec dispatches")
