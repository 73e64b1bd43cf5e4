"""Facts about connector classes read from Python source with `ast`, never by importing it.

Real connector files import vLLM, CUDA and C++ stores, so they cannot be imported here. What the MRO judge
needs is syntactic: the classes and their bases, and for each method it defines whether it delegates up the
MRO, touches the async-dump tracking set, forwards to an inner connector, or returns a constant.
"""
from __future__ import annotations

import ast
import dataclasses
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Literal, Mapping, Sequence

from deferdump.tools.mro.errors import DuplicateClassError, SourceParseError
from deferdump.tools.mro.ast_helpers import attribute_reads, derived_names, is_self as _is_self, loop_bodies
from deferdump.tools.mro.ast_helpers import names_in as _names_in
from deferdump.tools.mro.ast_helpers import target_names as _target_names
from deferdump.tools.mro.block_tables import BlockCall, TableExtension, block_calls, table_extensions
from deferdump.tools.mro.settled_paths import PathEvents, builds_bounded_deque, path_events
from deferdump.tools.mro.super_results import super_rewrites
from deferdump.tools.mro.dropped_handoffs import dropped_params, task_handoffs
from deferdump.tools.mro.victim_flow import VictimFlow, metadata_fields, victim_flow
from deferdump.tools.mro.task_holders import (
    CopyRecord,
    copied_sweeps,
    copy_records,
    dropped_submits,
    entry_visits,
    helper_keeps,
    param_fills,
    returns_task,
)

log = logging.getLogger(__name__)

DEFAULT_TRACKING_ATTR = "_async_dump_req_ids"

#: One tracking attribute, or several (found by data flow: :func:`discover_tracking_attrs`).
TrackingAttrs = str | frozenset[str]


def _attr_set(tracking: TrackingAttrs) -> frozenset[str]:
    return frozenset({tracking}) if isinstance(tracking, str) else frozenset(tracking)

#: Methods of vLLM's ``KVConnectorBase_V1`` (and ``SupportsHMA``) a connector may define or inherit.
CONNECTOR_METHODS: tuple[str, ...] = (
    "register_kv_caches",
    "bind_connector_metadata",
    "clear_connector_metadata",
    "has_connector_metadata",
    "handle_preemptions",
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
    "get_finished",
    "get_transfer_results",
    "get_block_ids_with_load_errors",
    "build_connector_worker_meta",
    "shutdown",
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "request_finished",
    "request_finished_all_groups",
)

TrackingOp = Literal["add", "remove", "read", "assign"]
BodyKind = Literal["noop", "abstract", "code"]

_ADDING_CALLS = frozenset({"add", "update", "__ior__"})
_REMOVING_CALLS = frozenset(
    {"discard", "remove", "pop", "popleft", "popitem", "clear", "difference_update", "intersection_update",
     "__isub__"}
)


@dataclass(frozen=True)
class Delegation:
    """A call from a method to a definition further up the hierarchy.

    ``kind="super"``: ``super().m()`` in class C (anchor C) or ``super(X, self).m()`` (anchor X); the lookup
    runs in ``type(self).__mro__`` *after* the anchor. ``kind="explicit"``: ``Anchor.m(self, ...)``; the
    lookup runs in ``Anchor.__mro__`` starting *at* the anchor.
    """

    kind: Literal["super", "explicit"]
    method: str
    anchor: str


@dataclass(frozen=True)
class Forward:
    """``self.<attr>.<method>(...)``: a call into an inner (wrapped) connector. ``guards`` are the
    ``isinstance(self.<attr>, X)`` tests the call sits under: ``(X, True)`` inside the test's body,
    ``(X, False)`` in its ``else`` or after an ``if`` whose body always returns."""

    attr: str
    method: str
    guards: tuple[tuple[str, bool], ...] = ()


@dataclass(frozen=True)
class DelayGuard:
    """A condition deciding an answer (see ``MethodFacts.delay_guards``): its text, the locals holding the
    request's id or tracking-only values there, the ``self`` attributes it reads beyond the tracking set (flags a
    class may fix as constants), the ``self`` helpers it calls with tracking-only arguments, and whether it reads
    anything else (a parameter like ``block_ids``, the request's params or status, a call)."""

    line: int
    text: str
    plain: frozenset[str]
    flags: frozenset[str]
    helpers: frozenset[str]
    foreign: bool


@dataclass(frozen=True)
class MethodFacts:
    """What one method definition does, as far as its syntax shows."""

    name: str
    owner: str
    lineno: int
    body: BodyKind
    delegations: tuple[Delegation, ...] = ()
    self_calls: frozenset[str] = frozenset()
    tracking_ops: frozenset[str] = frozenset()
    forwards: tuple[Forward, ...] = ()
    constant_return: str | None = None
    delay_answer: bool | None = None  # the literal bool every return's first element is (a finish's delay)
    calls: frozenset[str] = frozenset()  # methods called on objects other than self (``store.wait`` -> "wait")
    finally_calls: frozenset[str] = frozenset()  # every method called inside a ``finally:`` block
    handler_calls: frozenset[str] = frozenset()  # every method called inside an ``except`` handler
    # release-like calls (a name containing ``release``) a ``try`` body makes after a store wait, where the ``try``
    # catches (``except``) and neither a handler nor a ``finally`` makes the same call: released only on success
    success_releases: tuple[tuple[int, str], ...] = ()
    # in-place extensions of a kept block table with ids from ``new_block_ids`` (block_tables.py)
    table_extensions: tuple[TableExtension, ...] = ()
    block_calls: tuple[BlockCall, ...] = ()  # ``self.<m>(...)`` handed ids from ``new_block_ids`` (block_tables.py)
    # task_holders.py: does a ``return`` hand back a store submit's result; (helper, container) for each helper result
    # put into a ``self`` container; loops over a ``self`` container's entries (attribute, waits, helpers called)
    returns_task: bool = False
    helper_keeps: tuple[tuple[str, str], ...] = ()
    entry_visits: tuple[tuple[str, bool, frozenset[str]], ...] = ()
    copy_records: tuple[CopyRecord, ...] = ()  # copies filled with tasks that the definition keeps to itself
    param_fills: tuple[tuple[int, int, str], ...] = ()  # (i, j, f): parameter j's value put into field f of parameter i
    # loops over a copy of a ``self`` container or entry: (attribute, line, waits, ``self`` helpers called)
    copied_sweeps: tuple[tuple[str, int, bool, frozenset[str]], ...] = ()
    # ``m`` where the whole body is ``return self.m(...)``: its answer is that helper's, as the class resolves it
    returned_self_call: str | None = None
    # where its store tasks go and which containers it waits entry by entry, over container paths (settled_paths.py)
    path_events: PathEvents | None = None
    # reads of ``preempted_req_ids``: (line, only its length is used) (own_victims.py)
    preempted_reads: tuple[tuple[int, bool], ...] = ()
    # where every entry of ``preempted_req_ids`` goes: returned, or put in a field of a handed-in object
    # (victim_flow.py); the fields a ``handle_preemptions`` reads off its metadata (None: any)
    victim_flow: VictimFlow = VictimFlow()
    metadata_fields: "frozenset[str] | None" = None
    # (line, what) where a definition vLLM reads the return of changes what its ``super()`` call returned
    super_rewrites: tuple[tuple[int, str], ...] = ()
    # (line, test) of each ``if`` that waits (a store wait or a ``self`` helper) on one side and adds to a ``self``
    # container on the other: some tasks waited at once, others kept, by a test the reader does not evaluate
    wait_or_keep: tuple[tuple[int, str], ...] = ()
    opaque: tuple[str, ...] = ()  # constructs the analysis could not follow, each as a short reason
    lost_tasks: tuple[str, ...] = ()  # where a kept store task can be dropped unwaited (beyond the model)
    # update_connector_output only: (line, what) where it may change the ids vLLM then frees
    report_rewrites: tuple[tuple[int, str], ...] = ()
    attr_stores: frozenset[str] = frozenset()  # ``self.<x> = ...``: runs a property setter if one exists
    attr_loads: frozenset[str] = frozenset()  # ``self.<x>`` read (not called): runs a property getter
    is_property: bool = False  # a ``@property`` getter (stored under its name; setters as ``<x>.setter``)
    async_hints: tuple[str, ...] = ()  # calls that hand work to another thread/stream (``submit``, ``non_blocking=True``)
    task_flow: "TaskFlow | None" = None  # where the store tasks this definition submits go (data flow)
    attr_ops: tuple[tuple[str, frozenset[str]], ...] = ()  # self.<x> -> add/remove/read/assign (tracking discovery)
    words: frozenset[str] = frozenset()  # every attribute and name the body reads (fence recognition)
    # attributes read on objects other than ``self`` (``meta.freed_block_ids``, ``getattr(meta, "freed")``)
    foreign_words: frozenset[str] = frozenset()
    reported_waits: "bool | None" = None  # get_finished-style: does a wait depend on what the call returns?
    has_condition: bool = False  # any if/while/conditional expression in the body
    generator: bool = False  # the body yields: calling it runs nothing until the result is iterated
    self_call_uses: tuple[tuple[str, str], ...] = ()  # (helper, "dropped"/"consumed"/"held") per self.<m>() call
    # (m, line) per ``self.<m>(...)`` call: where no class defines a method ``m``, ``self.<m>`` is an attribute
    # holding a callable (a helper object's ``__call__``, a bound method, a partial), called there
    self_call_sites: tuple[tuple[str, int], ...] = ()
    attr_calls: tuple[tuple[str, str, int], ...] = ()  # self.<attr>[.<x>].<m>(...) as (attr, "x.m", line)
    # ``x.<m>(...)`` on a local the body binds to ``C(...)`` (``batch = DumpBatch(store)``) as (C, m, line)
    other_calls: tuple[tuple[str, str, int], ...] = ()
    # ``<x>.<m>(...)`` on a receiver whose class is not read (a container's element, a loop variable, a parameter,
    # a call's result) as (receiver as written, m, line); receivers bound by a module's imports are left out
    loose_calls: tuple[tuple[str, str, int], ...] = ()
    # calls that hand ``self`` (the connector) to an object's method, which may call back into it
    # (``plan.execute(self)`` whose ``execute`` calls ``connector._dump(...)``), as (kind, what, method, line): kind
    # "attr" (what: the self attribute), "class" (a local built by name: what is its class) or "loose" (the receiver)
    handoffs: tuple[tuple[str, str, str, int], ...] = ()
    # a ``return`` of an answer the body builds itself (a tuple, a literal, a comparison), not a value that may be a
    # call's result: such a body does not "only delegate" even where its one call is ``super().<m>(...)``
    own_returns: bool = False
    # loops (and comprehensions) whose body waits, polls, submits or calls a ``self`` method, over an object that may
    # be a helper with its own ``__iter__``, as (kind, what, line): ("class", C) for ``C(...)`` or a local bound to
    # one, ("attr", a) for ``self.a``, ("attr_item", a) for an entry of ``self.a`` (``self.a[k]``, ``self.a.pop(k)``),
    # ("self_call", m) for ``self.m(...)``, ("loose", text) for any other receiver
    iterations: tuple[tuple[str, str, int], ...] = ()
    plain_calls: frozenset[str] = frozenset()  # ``f(...)`` by a bare name (a builtin, an import, a module function)
    # calls of a value the reader does not resolve (a parameter or local, an item, a call's result), as written
    value_calls: tuple[str, ...] = ()
    # (helper, position or keyword, line) per ``self.<helper>(...)`` given a store submit's task (dropped_handoffs.py)
    task_handoffs: "tuple[tuple[str, int | str, int], ...]" = ()
    dropped_params: frozenset[str] = frozenset()  # parameters the body lets go nowhere (dropped_handoffs.py)
    attr_values: tuple[tuple[str, str], ...] = ()  # self.<attr> = v as (attr, value_kind(v)); None values left out
    counted_waits: tuple[tuple[str, str], ...] = ()  # (why, "wait" or the self helper) run only when a count allows
    # (why, "wait" or the self helper) in a place that may stop before every entry is waited (a loop's early
    # exit, ``all``/``any`` short-circuits, ``zip``, lazy ``map``): which tasks a call leaves running is not read
    partial_waits: tuple[tuple[str, str], ...] = ()
    # (line, "wait" or the self helper) of waits whose selection reads nothing named for preemption (a
    # handle_preemptions that waits these may be a fence over running requests' blocks, not a preemption wait)
    unselected_waits: tuple[tuple[str, str], ...] = ()
    rank_guards: tuple[tuple[str, frozenset[str]], ...] = ()  # (test, what it guards) for tests reading a rank
    # (test, self attributes it reads, what it guards) for the other tests that read self attributes: a rank test
    # when one of them holds a rank (``rank_attrs`` of the class)
    attr_guards: tuple[tuple[str, frozenset[str], frozenset[str]], ...] = ()
    # (line, test) of each addition to the tracking set made only under ``test``, in a branch doing nothing else:
    # the rest of the body (its dumps) runs whether or not the request is tracked
    guarded_adds: tuple[tuple[int, str], ...] = ()
    plain_adds: bool = False  # an addition to the tracking set under no such guard
    rank_attrs: frozenset[str] = frozenset()  # ``self.<x> = <expr reading the rank>`` (``self._is_writer = rank == 0``)
    branch_waits: tuple[tuple[str, frozenset[str], frozenset[str]], ...] = ()
    member_tests: frozenset[str] = frozenset()  # ``k in self.<x>`` / ``not in``: tables asked about a key
    # ``self.<x>[k] = ...`` after a store submit of the body: tables keeping what the dump covers, by its keys
    keyed_after_submit: frozenset[str] = frozenset()
    # ``if r in self.<x>: ... return False, ...``: a finish answering "free now" for a request a self set holds
    # (the tests, as source text)
    false_when_member: tuple[str, ...] = ()
    # each condition on the way to an answer that may be False (an ``if`` around or before a return, a
    # ``not``/``and``/``or``/``if-else`` in the answer or in what the answer's name is bound to) reading more than
    # the tracking set and the request's id, as a DelayGuard: a finish's delay (or a helper's answer it returns)
    # then rests on something else too, unless that is a class constant or a helper answering from the set alone
    delay_guards: tuple["DelayGuard", ...] = ()
    answers_read: bool = False  # every return's answer is one ``delay_guards`` was computed from
    # ``self.<m>()`` calls that always run (statements of the body, of ``with`` and ``try`` bodies, not under a
    # test or loop): a preemption handler's unconditional extra work
    top_self_calls: frozenset[str] = frozenset()
    # ``targets = list(self._pending) if self._fence_all else meta.preempted`` (or the same in the two branches of
    # an ``if``): a local chosen by a test between state ``self`` holds and what the call was given (the tests)
    switched_selections: tuple[str, ...] = ()  # (test, if-side, else-side) waits
    # (test, "wait" or the self helper) for waits that run only under an ``if`` testing nothing but ``self``'s
    # state (``if self._sync:``, ``if self._layout.windowed:``): a switch, not a test of the task; and the same
    # for waits under no such switch, with an empty test
    switched_waits: tuple[tuple[str, str], ...] = ()
    # parameters whose values the body keeps in ``self`` state (``self.x[r] = list(block_ids)``,
    # ``self.x.append(block_ids)``, through locals): a finish that keeps its block ids dumps them later
    kept_params: frozenset[str] = frozenset()
    # (parameter, attribute, names the key reads) where a parameter's value is stored as ``self.x[key] = ...p...``
    # or ``self.x = ...p...`` without the old value: one per key, a later call replaces what the earlier kept
    replacing_params: tuple[tuple[str, str, frozenset[str]], ...] = ()
    param_names: tuple[str, ...] = ()  # the positional parameters after ``self``, in order
    # ``self`` helpers (or ``"wait"``) called with the loop variable of an unconditional loop over every entry of a
    # ``self`` attribute (``for r in list(self._tasks): self._wait_req(r)``): a sweep of the whole table
    full_sweeps: frozenset[str] = frozenset()
    # ``self.<d>`` given ``self.<k>``'s entries, as (d, k, how): "copy" (a new container holding them: ``list(self.k)``,
    # ``self.k.copy()``, ``self.d.extend(self.k)``), "moved" (``self.d = self.k``, then ``self.k`` rebound to a new
    # container and never emptied in place in that function), "alias" (``self.d = self.k`` otherwise: one
    # container, which emptying either empties for both)
    attr_transfers: tuple[tuple[str, str, str], ...] = ()


#: Store calls that submit a dump (a task comes back) and that block on one.
STORE_SUBMITS = frozenset({"dump_data", "dump"})
#: A store's poll of a task (the judge's ``CHECK_CALLS``): no wait, so one passed as a value is read as called.
_POLLS = frozenset({"check"})
#: Logger methods: a statement calling one only writes a line.
LOG_CALLS = frozenset({"debug", "info", "warning", "error", "critical", "exception", "log", "debug_once", "info_once",
                       "warning_once"})
STORE_WAITS = frozenset({"wait", "wait_dump"})


_ALL_ENTRIES = {"items", "values", "copy"}  # ``self.x.<these>()`` iterates every entry of ``self.x``
_WHOLE = {"list", "tuple", "sorted", "set"}  # ``list(self.x)`` likewise


#: Calls that iterate an argument to its end (a generator passed to them runs its whole body).
_EXHAUSTING_FUNCTIONS = frozenset({"list", "tuple", "set", "frozenset", "sorted", "dict", "sum", "max", "min",
                                   "deque", "Counter"})
_EXHAUSTING_METHODS = frozenset({"update", "extend", "join", "difference_update", "intersection_update",
                                 "symmetric_difference_update", "union", "difference", "intersection",
                                 "writelines", "extendleft"})


def _call_use(call: ast.Call, parents: dict[ast.AST, ast.AST]) -> str:
    """What the caller does with a call's value: ``dropped`` (a bare statement), ``consumed`` (iterated to
    its end: a ``for`` loop, a comprehension, ``list(...)``, ``x.update(...)``, ``yield from``) or ``held``
    (kept, returned or passed on: when, or how far, it is iterated is not followed)."""
    parent = parents.get(call)
    if isinstance(parent, ast.Expr):
        return "dropped"
    if isinstance(parent, (ast.For, ast.AsyncFor)) and parent.iter is call:
        return "consumed"
    if isinstance(parent, ast.comprehension) and parent.iter is call:
        grand = parents.get(parent)
        # a list/set/dict comprehension runs to the end; a generator expression is itself lazy
        return "held" if isinstance(grand, ast.GeneratorExp) else "consumed"
    if isinstance(parent, ast.YieldFrom):
        return "consumed"
    if isinstance(parent, ast.Call) and call in parent.args:
        if isinstance(parent.func, ast.Name) and parent.func.id in _EXHAUSTING_FUNCTIONS:
            return "consumed"
        if isinstance(parent.func, ast.Attribute) and parent.func.attr in _EXHAUSTING_METHODS:
            return "consumed"
    return "held"


def _iterated_attr(node: ast.expr) -> str | None:
    """The ``self`` attribute whose every entry a loop over ``node`` visits, if it visits them all:
    ``self.x``, ``self.x.items()``/``.values()``, ``list(self.x)``; never ``self.x.pop(k)`` or ``self.x[k]``
    (one entry, chosen by a key)."""
    if _self_attr(node):
        return _self_attr(node)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _ALL_ENTRIES:
        return _self_attr(node.func.value)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _WHOLE
            and len(node.args) == 1):
        return _iterated_attr(node.args[0])
    return None


def _taken_entries(nodes: list[ast.AST]) -> dict[str, str]:
    """Locals that hold every entry of a ``self`` attribute: ``tasks, self.x = self.x, []`` (take the list
    and leave an empty one), ``tasks = self.x`` or ``tasks = list(self.x)``; a loop over such a local visits
    every entry of ``self.x``. A local assigned more than once is left out (which binding a loop sees is not
    read)."""
    bound: dict[str, list[str | None]] = {}
    for node in nodes:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            pairs: list[tuple[ast.expr, ast.expr | None]] = [(target, node.value)]
            if isinstance(target, ast.Tuple):
                values = node.value.elts if isinstance(node.value, ast.Tuple) and len(node.value.elts) == len(
                    target.elts) else [None] * len(target.elts)
                pairs = list(zip(target.elts, values))
            for name, value in pairs:
                if isinstance(name, ast.Name):
                    bound.setdefault(name.id, []).append(None if value is None else _iterated_attr(value))
    return {name: attrs[0] for name, attrs in bound.items() if len(attrs) == 1 and attrs[0] is not None}


@dataclass(frozen=True)
class TaskFlow:
    """The data flow of store tasks in one definition, read from its assignments and loops.

    ``submits``: store submits it makes; ``waited_here``: how many of them are waited in the same call (the
    task, a local holding it, or a local list it was appended to, reaches a ``wait``); ``kept_in``: ``self``
    attributes a task is put into (``append``, item assignment, a wrapping constructor); ``waits_each``:
    ``self`` attributes whose every entry a loop waits; ``stops_early``: those of them whose waiting loop can
    leave before the last entry (``break``/``return``, or an ``except`` that leaves the loop); ``clears``:
    ``self`` attributes emptied (``.clear()``, ``= []``/``{}``, ``del x[:]``)."""

    submits: int = 0
    waited_here: int = 0
    kept_in: frozenset[str] = frozenset()
    waits_each: frozenset[str] = frozenset()
    stops_early: frozenset[str] = frozenset()
    clears: frozenset[str] = frozenset()
    drains: frozenset[str] = frozenset()  # waits_each loops with no condition around the loop or the wait
    # ``self.x[key] = task`` (one task per key) or ``self.x = task`` (one in all), for tasks not waited in the
    # call: a later submit replaces (loses) the earlier one; each entry is (attribute, the names the key reads).
    replaced: frozenset[tuple[str, frozenset[str]]] = frozenset()
    # submits waited in the call only under a condition (``if self._sync: wait(t)``): neither a synchronous save
    # nor a deferred one, depending on a value the reader does not evaluate
    waited_if: int = 0
    # tasks not waited in the call that it hands to a ``self.<m>(...)`` helper, as (m, position after self, or the
    # keyword): the helper may keep them one per key (its ``replacing_params``)
    passed: frozenset[tuple[str, int | str]] = frozenset()

    @property
    def synchronous(self) -> bool:
        """Every task submitted here is waited before the call returns (and none is kept)."""
        return self.submits > 0 and self.waited_here == self.submits and not self.kept_in


@dataclass(frozen=True)
class ClassFacts:
    """One class: where it is, its bases (simple names, in order) and the methods its body defines."""

    name: str
    file: str
    lineno: int
    bases: tuple[str, ...]
    base_exprs: tuple[str, ...]
    methods: dict[str, MethodFacts] = field(default_factory=dict)
    inner_classes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # attr -> classes __init__ may assign
    unresolved_inits: frozenset[str] = frozenset()  # attrs __init__ also assigns from a call naming no class
    external: bool = False
    opaque: tuple[str, ...] = ()
    bound_names: frozenset[str] = frozenset()  # every name the class body binds (defs, assignments, classes)
    abstract_names: frozenset[str] = frozenset()  # names whose last binding is a def marked @abstractmethod
    # what may change Python's abstract-method check for the class (a metaclass, a class decorator that is not
    # benign, ``__init_subclass__``, ``__new__``): where any is present, an abstract method left proves nothing
    construct_hooks: tuple[str, ...] = ()
    # ``NAME = <literal>`` in the class body (its last binding), as (name, the literal's repr): a flag a finish tests
    constants: tuple[tuple[str, str], ...] = ()
    bounded_deques: bool = False  # its module builds a deque with a bound (settled_paths.py)


def _dotted(node: ast.expr) -> str | None:
    """``a.b.C`` for a Name/Attribute chain, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _simple(dotted: str) -> str:
    return dotted.rsplit(".", 1)[-1]


def _rebinding(node: ast.AST) -> tuple[set[str], ast.AST] | None:
    """An assignment's rebound names and the value they get (``x = v``, ``x += v``, ``x: T = v``, ``(x := v)``)."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return set().union(*(_target_names(t) for t in targets)), node.value
    return None


def _own_nodes(func: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """Every node of a function body, without descending into nested functions, lambdas or classes."""
    return _statement_nodes(func.body)


def _statement_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of ``body``'s statements, without descending into nested functions, lambdas or classes."""
    stack: list[ast.AST] = [stmt for stmt in reversed(body)
                            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    while stack:
        node = stack.pop()
        yield node
        for child in reversed(list(ast.iter_child_nodes(node))):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            stack.append(child)


#: Container methods that put an entry in (``self.x.append(task)``, ``self._q.put(t)``): where a save path may keep
#: its tasks, or add to a tracking set (the tracking set's own operations are ``_ADDING_CALLS``).
FILLING_CALLS = frozenset({"append", "appendleft", "extend", "insert", "add", "update", "setdefault", "put",
                           "put_nowait"})

#: ``self`` helpers that only read the step's metadata (vLLM's base class): they track nothing.
_METADATA_READERS = frozenset({"_get_connector_metadata", "has_connector_metadata"})


def _may_track(statements: Sequence[ast.stmt]) -> bool:
    """May one of ``statements`` add requests to a tracking set: a call of a container's adding method, a
    ``|=``, an item assignment, a ``self`` helper other than the metadata readers, or ``super()``?"""
    for node in (n for statement in statements for n in ast.walk(statement)):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.BitOr):
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) for t in node.targets):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            if node.func.attr in FILLING_CALLS:
                return True
            if _is_self(receiver) and node.func.attr not in _METADATA_READERS:
                return True
            if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
                return True
    return False


def _block_waits(block: list[ast.stmt]) -> bool:
    """Does ``block`` call a store ``wait`` or a ``self`` helper (which the reader may find waits)?"""
    return any(act == "wait" or act.startswith("self.") for act in _block_acts(block))


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[1:]
    return body


#: Calls that hand work to another thread, process, stream or event loop: a save method making one may
#: still be reading the blocks when it returns.
ASYNC_CALLS = frozenset(
    {"submit", "start", "apply_async", "map_async", "run_in_executor", "create_task", "ensure_future",
     "run_coroutine_threadsafe", "put", "put_nowait", "Thread", "Process", "start_new_thread", "record_stream"}
)


#: Decorators that leave a method's body as it is (or only declare what kind of attribute it is).
BENIGN_DECORATORS = frozenset({"property", "setter", "deleter", "cached_property", "staticmethod", "classmethod",
                               "abstractmethod", "override", "final", "no_grad", "inference_mode"})


def _returned_function(func: ast.FunctionDef) -> ast.FunctionDef | None:
    """The function ``func`` defines and returns (``def deco(fn): def wrapper(...): ...; return wrapper``)."""
    nested = [s for s in func.body if isinstance(s, ast.FunctionDef)]
    returns = [n for n in _own_nodes(func) if isinstance(n, ast.Return)]
    if len(nested) == 1 and returns and all(isinstance(r.value, ast.Name) and r.value.id == nested[0].name
                                            for r in returns):
        return nested[0]
    return None


def _transparent_decorator(func: ast.FunctionDef) -> bool:
    """Is ``func`` (a module-level decorator, or a factory of one) a wrapper that calls the decorated function
    exactly once, straight in its body or in a ``try`` whose handlers re-raise, and returns what it returns?
    Timing and counting wrappers are; a retry loop, a thread, a swallowed error or a skipped call are not."""
    wrapper = _returned_function(func)
    if wrapper is None:
        return False
    deeper = _returned_function(wrapper)  # a factory: ``def timed(name): def decorate(fn): def wrapper...``
    if deeper is not None:
        func, wrapper = wrapper, deeper
    if len(func.args.args) != 1:
        return False
    fn = func.args.args[0].arg
    calls = [n for n in ast.walk(wrapper) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == fn]
    named = {id(c.func) for c in calls}  # the call itself, ``fn.__name__`` and ``functools.wraps(fn)`` are fine
    named |= {id(n.value) for n in ast.walk(wrapper) if isinstance(n, ast.Attribute)}
    named |= {id(a) for n in ast.walk(wrapper) if isinstance(n, ast.Call)
              and _simple(_dotted(n.func) or "") == "wraps" for a in n.args}
    passed = [n for n in ast.walk(wrapper) if isinstance(n, ast.Name) and n.id == fn and id(n) not in named]
    if len(calls) != 1 or passed or any(_call_name(n) in ASYNC_CALLS for n in ast.walk(wrapper)):
        return False  # ``fn`` handed on (a thread's target, a pool) or called more than once
    places: list[ast.stmt] = []
    for stmt in wrapper.body:
        places.append(stmt)
        if isinstance(stmt, ast.Try):
            if not all(h.body and isinstance(h.body[-1], ast.Raise) for h in stmt.handlers):
                return False  # an error of the body may be swallowed
            places += stmt.body
    # the call is the statement's whole value: ``return fn(...) if ready else None`` may skip the body
    holder = next((stmt for stmt in places
                   if isinstance(stmt, (ast.Return, ast.Assign, ast.Expr)) and stmt.value is calls[0]), None)
    return holder is not None and not _may_leave_early(wrapper, holder)


def _may_leave_early(wrapper: ast.FunctionDef, holder: ast.stmt) -> bool:
    """Can ``wrapper`` end without reaching ``holder``, the statement that calls the decorated function? A
    ``return`` before it (``if key in seen: return None``: a once-per-request or flag guard), a ``raise`` before it
    that is not a handler's re-raise, or a ``yield`` anywhere (the body runs only when someone iterates) can."""
    before: list[ast.stmt] = []
    for stmt in wrapper.body:
        if stmt is holder:
            break
        if isinstance(stmt, ast.Try) and holder in stmt.body:
            before += stmt.body[:stmt.body.index(holder)]
            break
        before.append(stmt)
    reraise = {id(handler.body[-1]) for node in _statement_nodes(before) if isinstance(node, ast.Try)
               for handler in node.handlers}
    return (any(isinstance(node, (ast.Return, ast.Raise)) and id(node) not in reraise
                for node in _statement_nodes(before))
            or any(isinstance(node, (ast.Yield, ast.YieldFrom)) for node in _own_nodes(wrapper)))


#: The fields of vLLM's KVConnectorOutput whose ids the scheduler acts on after update_connector_output.
_REPORT_FIELDS = frozenset({"finished_sending", "finished_recving"})
_MUTATORS = frozenset({"add", "discard", "remove", "update", "clear", "pop", "difference_update",
                       "intersection_update", "symmetric_difference_update", "__ior__", "__isub__", "__iand__"})
#: Calls that look at an object without changing it: builtins, logging, and container methods that take it as
#: an element or an iterable (``self._recving.difference_update(finished)``).
_LOOKS = frozenset({"isinstance", "getattr", "hasattr", "len", "bool", "repr", "str", "id", "type", "print", "set",
                    "frozenset", "list", "sorted", "tuple", "debug", "info", "warning", "error", "exception",
                    "add", "discard", "remove", "append", "extend", "update", "difference_update",
                    "intersection_update", "symmetric_difference_update", "union", "difference", "intersection",
                    "issubset", "issuperset", "isdisjoint", "get", "setdefault"})


def _report_rewrites(func: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[tuple[int, str], ...]:
    """Where ``update_connector_output(self, connector_output)`` may change what vLLM frees: vLLM frees the ids
    left in ``connector_output.finished_sending`` after the call (scheduler.py ~3218-3235), so a class that
    reassigns or mutates that set (or a name bound to it), or hands the output object to other code, decides
    frees the model's ``get_finished`` does not. Copies (``set(out.finished_sending or ())``) and reads are not."""
    params = [a.arg for a in func.args.args[1:]]
    if not params:
        return ()
    output = params[0]
    aliases = {t.id for n in ast.walk(func) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute)
               and n.value.attr in _REPORT_FIELDS for t in n.targets if isinstance(t, ast.Name)}
    why: list[tuple[int, str]] = []
    for node in ast.walk(func):
        where = getattr(node, "lineno", func.lineno)
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in _REPORT_FIELDS:
                why.append((where, f"assigns {ast.unparse(target)}"))
            elif isinstance(node, ast.AugAssign) and isinstance(target, ast.Name) and target.id in aliases:
                why.append((where, f"changes {target.id}, a report set it took"))
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id == output:
            why.append((where, f"keeps {output} under another name"))
        if not isinstance(node, ast.Call):
            continue
        callee = node.func
        if isinstance(callee, ast.Attribute) and callee.attr in _MUTATORS and (
                (isinstance(callee.value, ast.Attribute) and callee.value.attr in _REPORT_FIELDS)
                or (isinstance(callee.value, ast.Name) and callee.value.id in aliases)):
            why.append((where, f"calls {ast.unparse(callee)}"))
        name = callee.attr if isinstance(callee, ast.Attribute) else _simple(_dotted(callee) or "")
        if name == "setattr" or (name not in _LOOKS and name != "update_connector_output" and any(
                isinstance(a, ast.Name) and a.id == output for a in [*node.args, *(k.value for k in node.keywords)])):
            why.append((where, f"hands {output} to {ast.unparse(callee)}"))
    return tuple(dict.fromkeys(why))


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _body_kind(func: ast.FunctionDef | ast.AsyncFunctionDef) -> BodyKind:
    body = _strip_docstring(func.body)
    is_abstract = any(_simple(_dotted(d) or "") == "abstractmethod" for d in func.decorator_list)
    trivial = all(
        isinstance(s, ast.Pass)
        or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        or (isinstance(s, ast.Return) and (s.value is None or _is_none(s.value)))  # ``return [None]`` neither
        for s in body
    )
    if trivial:
        return "abstract" if is_abstract else "noop"
    if len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None:
        return "abstract"  # raises whatever it is given (NotImplementedError or any other): it cannot run
    return "code"


class _MethodReader:
    """Walks one method body and collects its facts."""

    def __init__(self, func: ast.FunctionDef | ast.AsyncFunctionDef, owner: str, tracking_attr: TrackingAttrs,
                 transparent: frozenset[str] = frozenset(), value_equal: frozenset[str] = frozenset()) -> None:
        self.func = func
        self.owner = owner
        self.transparent = transparent  # the module's decorators that call the body once, as it is
        self.value_equal = value_equal  # the module's classes whose instances compare equal without being the same
        self.tracking_attrs = _attr_set(tracking_attr)
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in _own_nodes(func):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.tracking_aliases: set[str] = set()
        self.inner_aliases: dict[str, str] = {}  # local name -> self attribute it holds
        self.delegations: list[Delegation] = []
        self.self_calls: set[str] = set()
        self.self_call_sites: list[tuple[str, int]] = []
        self.tracking_ops: set[str] = set()
        self.forwards: list[Forward] = []
        self.calls: set[str] = set()
        self.opaque: list[str] = []
        self.lost_tasks: list[str] = []  # places where a kept store task can be dropped unwaited
        self.attr_stores: set[str] = set()
        self.attr_loads: set[str] = set()
        self.async_hints: list[str] = []
        self.attr_ops: dict[str, set[str]] = {}  # every self attribute -> tracking-style ops on it
        self.self_call_uses: list[tuple[str, str]] = []
        self.other_calls: list[tuple[str, str, int]] = []
        self.loose_calls: list[tuple[str, str, int]] = []
        self.handoffs: list[tuple[str, str, str, int]] = []
        self.plain_calls: set[str] = set()
        self.local_classes = _local_instances(func)
        self.local_data = _local_data(func)
        self.attr_calls: list[tuple[str, str, int]] = []
        self.guarded_adds: list[tuple[int, str]] = []
        self.plain_adds = False

    def _read_add_guard(self, node: ast.expr) -> None:
        """Record whether this addition to the tracking set is made only under a test, in an ``if`` branch that does
        nothing but tracking (TieredCacheWarmStartConnector, twenty-sixth blind round: ``if spec.hold_blocks:
        self._holding.add(rid)``, the dump emitted after it either way, and ``hold_blocks`` False for requests warmed
        from the store). A test reading only the tracking set (``if rid not in self._t: self._t.add(rid)``) guards
        nothing."""
        stmt: ast.AST | None = node
        while stmt is not None and not isinstance(stmt, ast.stmt):
            stmt = self.parents.get(stmt)
        parent = self.parents.get(stmt) if stmt is not None else None
        if isinstance(parent, ast.If) and stmt is not None:
            branch = parent.body if stmt in parent.body else parent.orelse
            if all(self._tracking_only(part) for part in branch):
                read = {sub.attr for sub in ast.walk(parent.test) if isinstance(sub, ast.Attribute) and _is_self(sub.value)}
                names = {sub.id for sub in ast.walk(parent.test) if isinstance(sub, ast.Name)}
                if not (read and read <= self.tracking_attrs) and not names & self.tracking_aliases \
                        and not self._filtering(parent) and not self._over_tracked(parent):
                    test = ast.unparse(parent.test)
                    self.guarded_adds.append((node.lineno, test if stmt in parent.body else f"not ({test})"))
                    return
        self.plain_adds = True

    def _filtering(self, guard: ast.If) -> bool:
        """Is ``guard`` all its loop body (or function body) does: a loop choosing which requests to track (PR #989:
        ``for req_id, meta in ...: if meta.dump_block_ids[0]: self._async_dump_req_ids.add(req_id)``), with no other
        work for the request beside it that could emit a dump either way?"""
        scope: ast.AST | None = self.parents.get(guard)
        while scope is not None and not isinstance(scope, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef,
                                                           ast.AsyncFunctionDef)):
            if isinstance(scope, ast.If):
                return False  # nested under another test: the rest of that branch is not read here
            scope = self.parents.get(scope)
        if not all(self._tracking_only(stmt) for stmt in guard.orelse):
            return False  # ``if hold: add(r) else: emit(r)``: the other branch works for the request untracked
        if scope is None and self.func.name not in CONNECTOR_METHODS:
            # a helper whose whole body tracks under a test (``def _register_chunk(self, plan): if plan.last_chunk:
            # self._delayed.add(plan.req_id)``, twenty-eighth blind round): its caller goes on with the request either
            # way, so the test chooses nothing the caller's dump follows
            return False
        body = _strip_docstring((scope or self.func).body)  # a statement of the body itself has no parent here
        return all(stmt is guard or isinstance(stmt, ast.Pass) for stmt in body)

    def _over_tracked(self, guard: ast.If) -> bool:
        """Is ``guard`` inside a loop over the tracking set itself (``for req_id, tasks in list(self._table.items()):
        ... if running: self._table[req_id] = running else: del self._table[req_id]``)? Then the entry it writes is
        one already tracked: a prune, not a request tracked under a test (``DrainTableConnector``)."""
        node: ast.AST | None = self.parents.get(guard)
        while node is not None:
            if isinstance(node, (ast.For, ast.AsyncFor)) and any(
                    isinstance(sub, ast.Attribute) and _is_self(sub.value) and sub.attr in self.tracking_attrs
                    for sub in ast.walk(node.iter)):
                return True
            node = self.parents.get(node)
        return False

    def _tracking_only(self, stmt: ast.stmt) -> bool:
        """A statement that only changes the tracking set (or logs, or passes)."""
        if isinstance(stmt, ast.Pass):
            return True
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            func = stmt.value.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) and _is_self(func.value.value):
                return func.value.attr in self.tracking_attrs
            return _call_name(stmt.value) in LOG_CALLS
        if isinstance(stmt, ast.AugAssign):
            target = stmt.target
            return isinstance(target, ast.Attribute) and _is_self(target.value) and target.attr in self.tracking_attrs
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript):
            value = stmt.targets[0].value
            submits = any(isinstance(sub, ast.Call) and _call_name(sub) in STORE_SUBMITS for sub in ast.walk(stmt.value))
            return isinstance(value, ast.Attribute) and _is_self(value.value) and value.attr in self.tracking_attrs \
                and not submits  # ``self._tasks[r] = store.dump(...)``: the branch dumps too
        return False

    def read(self) -> MethodFacts:
        self._collect_aliases()
        for decorator in self.func.decorator_list:
            name = _simple(_dotted(decorator.func if isinstance(decorator, ast.Call) else decorator) or "")
            if name not in BENIGN_DECORATORS and name not in self.transparent:
                self.opaque.append(f"line {decorator.lineno}: @{ast.unparse(decorator)} wraps the body, and its "
                                   "wrapper is not read (it may run the body later, again, or not at all)")
        self._value_equal_sets()
        self._deferred_store_calls()
        for node in _own_nodes(self.func):
            for receiver, special in _special_calls(node):
                self._read_special(receiver, special, node)
            if isinstance(node, ast.Call):
                self._read_call(node)
            elif isinstance(node, ast.Attribute) and _is_self(node.value) and node.attr in self.tracking_attrs:
                self.tracking_ops.add(op := self._tracking_op(node))
                if op == "add":
                    self._read_add_guard(node)
                self._record_attr_op(node)  # a tracking set is a self table too (a report gated on it)
            elif isinstance(node, ast.Attribute) and _is_self(node.value):
                parent = self.parents.get(node)
                self._record_attr_op(node)
                if isinstance(node.ctx, ast.Store):
                    self.attr_stores.add(node.attr)
                elif not (isinstance(parent, ast.Call) and parent.func is node):
                    self.attr_loads.add(node.attr)
            elif isinstance(node, ast.Name) and node.id in self.tracking_aliases:
                if not isinstance(node.ctx, ast.Store):
                    self.tracking_ops.add(self._tracking_op(node))
        own = list(_own_nodes(self.func))  # read once by the fact modules below
        return MethodFacts(
            name=self.func.name,
            owner=self.owner,
            lineno=self.func.lineno,
            body=_body_kind(self.func),
            delegations=tuple(dict.fromkeys(self.delegations)),
            self_calls=frozenset(self.self_calls),
            self_call_sites=tuple(dict.fromkeys(self.self_call_sites)),
            tracking_ops=frozenset(self.tracking_ops),
            forwards=tuple(dict.fromkeys(self.forwards)),
            constant_return=self._constant_return(),
            delay_answer=self._delay_answer(),
            false_when_member=self._false_when_member(),
            delay_guards=self._delay_guards(),
            answers_read=self._answers_read(),
            top_self_calls=frozenset(_top_self_calls(self.func.body, _param_derived(self.func))),
            switched_selections=self._switched_selections(),
            switched_waits=self._switched_waits(),
            kept_params=self._kept_params(),
            replacing_params=self._replacing_params(),
            param_names=tuple(a.arg for a in self.func.args.args[1:]),
            full_sweeps=self._full_sweeps(),
            calls=frozenset(self.calls),
            finally_calls=self._finally_calls(),
            handler_calls=self._handler_calls(),
            success_releases=self._success_releases(),
            table_extensions=table_extensions(self.func, own),
            block_calls=block_calls(self.func, own),
            returns_task=returns_task(own, STORE_SUBMITS),
            helper_keeps=helper_keeps(own),
            entry_visits=entry_visits(own, STORE_WAITS, ITERATION_BUILTINS),
            copy_records=copy_records(self.func, own, STORE_SUBMITS),
            param_fills=param_fills(self.func, own),
            copied_sweeps=copied_sweeps(own, STORE_WAITS),
            preempted_reads=attribute_reads(own, "preempted_req_ids"),
            victim_flow=victim_flow(self.func),
            metadata_fields=metadata_fields(self.func),
            super_rewrites=super_rewrites(self.func),
            path_events=path_events(self.func, own, STORE_SUBMITS, STORE_WAITS),
            returned_self_call=_returned_self_call(self.func),
            wait_or_keep=self._wait_or_keep(),
            opaque=tuple(dict.fromkeys((*self.opaque, *self._named_at_run_time(), *self._rebound_aliases(),
                                        *self._subset_waits()))),
            lost_tasks=tuple(dict.fromkeys((*self.lost_tasks, *(
                f"line {line}: the task {call} returns is dropped (a statement of its own, or bound to names "
                "nothing reads), so no wait reaches it" for line, call in dropped_submits(self.func, own, STORE_SUBMITS))))),
            attr_stores=frozenset(self.attr_stores),
            attr_loads=frozenset(self.attr_loads),
            is_property=any(_simple(_dotted(d) or "") == "property" for d in self.func.decorator_list),
            report_rewrites=_report_rewrites(self.func) if self.func.name == "update_connector_output" else (),
            async_hints=tuple(dict.fromkeys(self.async_hints)),
            task_flow=_task_flow(self.func),
            attr_ops=tuple(sorted((a, frozenset(o)) for a, o in self.attr_ops.items())),
            words=frozenset(
                [n.attr for n in _own_nodes(self.func) if isinstance(n, ast.Attribute)]
                + [n.id for n in _own_nodes(self.func) if isinstance(n, ast.Name)]
            ),
            foreign_words=_foreign_words(self.func),
            reported_waits=self._reported_waits(),
            has_condition=any(isinstance(n, (ast.If, ast.While, ast.IfExp)) for n in _own_nodes(self.func)),
            generator=any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in _own_nodes(self.func)),
            self_call_uses=tuple(dict.fromkeys(self.self_call_uses)),
            attr_calls=tuple(dict.fromkeys(self.attr_calls)),
            other_calls=tuple(dict.fromkeys(self.other_calls)),
            loose_calls=tuple(dict.fromkeys(self.loose_calls)),
            handoffs=tuple(dict.fromkeys(self.handoffs)),
            own_returns=any(isinstance(n, ast.Return) and n.value is not None and not isinstance(
                n.value, (ast.Call, ast.Name, ast.Attribute, ast.Subscript, ast.Await)) and not (
                isinstance(n.value, ast.Constant) and n.value.value is None) for n in _own_nodes(self.func)),
            iterations=self._iterations(),
            plain_calls=frozenset(self.plain_calls),
            value_calls=_value_calls(self.func),
            task_handoffs=task_handoffs(self.func, own, STORE_SUBMITS),
            dropped_params=dropped_params(self.func),
            attr_values=_attr_values(self.func),
            attr_transfers=_attr_transfers(self.func),
            counted_waits=self._counted_waits(),
            partial_waits=self._partial_waits(),
            unselected_waits=self._unselected_waits(),
            rank_guards=self._rank_guards(),
            guarded_adds=tuple(dict.fromkeys(self.guarded_adds)),
            plain_adds=self.plain_adds,
            attr_guards=self._attr_guards(),
            rank_attrs=self._rank_attrs(),
            branch_waits=self._branch_waits(),
            member_tests=self._member_tests(),
            keyed_after_submit=self._keyed_after_submit(),
        )

    def _branch_waits(self) -> tuple[tuple[str, frozenset[str], frozenset[str]], ...]:
        """Each ``if`` whose two sides both may wait: the store waits (``wait``) and ``self.<m>`` helpers each
        side calls (the reader decides whether those helpers wait). Which side runs is decided by a test the
        reader does not evaluate (a flag in the metadata, a layout check)."""
        def waits(block: list[ast.stmt]) -> frozenset[str]:
            return frozenset(a for a in _block_acts(block) if a == "wait" or a.startswith("self."))
        found = []
        for node in _own_nodes(self.func):
            if isinstance(node, ast.If) and node.orelse:
                body, orelse = waits(node.body), waits(node.orelse)
                if body and orelse:
                    found.append((ast.unparse(node.test), body, orelse))
        return tuple(found)

    def _rank_guards(self) -> tuple[tuple[str, frozenset[str]], ...]:
        """Tests that read the worker's rank (a name containing ``rank``, ``leader`` or ``driver``), with what
        the statements they guard do: ``return`` (bare) or ``return_value``, ``break`` (or ``continue``),
        ``wait``/``submit``, ``super``, and
        ``self.<m>`` for each helper called (the reader decides whether that helper waits or submits). An
        ``if <rank test>: return`` at the top level of the body is ``early_return`` (the MLA early return of
        UCM's saves, after the step's requests are tracked at #989); in ``wait_for_save`` only where a statement before
        it may track (an ``add``/``update``/``|=``, a ``self`` helper or ``super()``): one before anything that may
        track returns before the rank tracks, PR #989's ``track_after_mla_return`` mutant, and stays ``return``."""
        found: list[tuple[str, frozenset[str]]] = []
        body = _strip_docstring(self.func.body)
        for node in _own_nodes(self.func):
            if not isinstance(node, (ast.If, ast.While, ast.IfExp)) or not _reads_rank(node.test):
                continue
            guarded = [*node.body, *node.orelse] if isinstance(node.body, list) else [node.body, node.orelse]
            does = set(_block_acts(guarded))
            if isinstance(node, ast.If) and node in body and not node.orelse and len(node.body) == 1 \
                    and isinstance(node.body[0], ast.Return) and node.body[0].value is None \
                    and (self.func.name != "wait_for_save" or _may_track(body[:body.index(node)])):
                does = {"early_return"}
            found.append((ast.unparse(node.test), frozenset(does)))
        return tuple(dict.fromkeys(found))

    def _attr_guards(self) -> tuple[tuple[str, frozenset[str], frozenset[str]], ...]:
        """Tests that read ``self`` attributes but no rank by name, with the attributes and what they guard (as
        ``_rank_guards``): the class decides which attributes hold a rank (TieredCacheMLAConnector, twenty-sixth
        blind round: ``if not self._is_writer:`` reports without its bookkeeping on MLA's other ranks)."""
        found: list[tuple[str, frozenset[str], frozenset[str]]] = []
        for node in _own_nodes(self.func):
            if not isinstance(node, (ast.If, ast.While, ast.IfExp)) or _reads_rank(node.test):
                continue
            attrs = frozenset(sub.attr for sub in ast.walk(node.test)
                              if isinstance(sub, ast.Attribute) and _is_self(sub.value))
            if not attrs:
                continue
            guarded = [*node.body, *node.orelse] if isinstance(node.body, list) else [node.body, node.orelse]
            found.append((ast.unparse(node.test), attrs, frozenset(_block_acts(guarded))))
        return tuple(dict.fromkeys(found))

    def _rank_attrs(self) -> frozenset[str]:
        """``self`` attributes this body assigns from an expression reading the rank, directly or through a local
        assigned from one (``tp = get_tensor_model_parallel_rank()``, ``self._is_writer = not use_mla or tp == 0``)."""
        ranked_locals: set[str] = set()
        found: set[str] = set()
        for node in ast.walk(self.func):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            reads = _rank_value(node.value, ranked_locals)
            if not reads:
                continue
            for target in targets:
                if isinstance(target, ast.Name):
                    ranked_locals.add(target.id)
                elif isinstance(target, ast.Attribute) and _is_self(target.value):
                    found.add(target.attr)
        return frozenset(found)

    def _iterations(self) -> tuple[tuple[str, str, int], ...]:
        """Loops over objects whose iteration may be a helper's own ``__iter__`` (a ``Retired(store, table, ids)``
        that yields only the tasks a poll found done), where the loop's body waits, polls, submits or calls a
        ``self`` method: which entries it sees is decided by that ``__iter__``. Plain names and fields of parameters
        (``metadata.preempted_req_ids``), literals and builtins' results are read as data, as before."""
        found: list[tuple[str, str, int]] = []
        for iterable, body in loop_bodies(_own_nodes(self.func)):
            if not any(_acts_on_tasks(call) for part in body for call in ast.walk(part)
                       if isinstance(call, ast.Call)):
                continue
            kind = self._iterated(iterable)
            if kind is not None:
                found.append((*kind, iterable.lineno))
        return tuple(dict.fromkeys(found))

    def _iterated(self, iterable: ast.expr) -> tuple[str, str] | None:
        """What a loop iterates, where it may be a helper object (see :meth:`_iterations`)."""
        if isinstance(iterable, ast.Call):
            name = _dotted(iterable.func)
            if name is not None and _simple(name)[:1].isupper():
                return ("class", _simple(name))
            if isinstance(iterable.func, ast.Name) and iterable.func.id in ITERATION_BUILTINS:
                return None  # sorted(x), list(x), range(n), zip(a, b): a builtin's result
            if isinstance(iterable.func, ast.Attribute) and iterable.func.attr in DICT_VIEWS:
                return None  # d.items(), d.values(): a container's view
            if isinstance(iterable.func, ast.Attribute) and _is_self(iterable.func.value):
                return ("self_call", iterable.func.attr)  # a generator method's (its own rule) or any object
            if isinstance(iterable.func, ast.Attribute) and iterable.func.attr in ITEM_GETTERS:
                held = self._held_attr(iterable.func.value)
                if held is not None and len(held) == 1:
                    return ("attr_item", held[0])  # self._pending.pop(rid, []): an entry of a self container
        if isinstance(iterable, ast.Subscript):
            held = self._held_attr(iterable.value)
            if held is not None and len(held) == 1:
                return ("attr_item", held[0])  # self._tables[rid]
        if isinstance(iterable, (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.BinOp, ast.BoolOp,
                                 ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            return None
        if isinstance(iterable, ast.Name):
            if iterable.id in self.local_classes:
                return ("class", sorted(self.local_classes[iterable.id])[0])
            return None  # a local or a parameter: read as a collection (a helper handed in is a loose call's case)
        held = self._held_attr(iterable) if isinstance(iterable, ast.Attribute) else None
        if held is not None and len(held) == 1:
            return ("attr", held[0])
        if isinstance(iterable, (ast.Call, ast.Subscript)):
            return ("loose", ast.unparse(iterable))  # a call's result, an item of something not self's
        return None  # a field of a parameter or of the metadata (``metadata.preempted_req_ids``): read as data

    def _counted_waits(self) -> tuple[tuple[str, str], ...]:
        """Store waits and ``self`` helper calls that run only under an ``if``/``while`` whose test reads a
        counter this body steps with ``+= n``/``-= n`` (a reference count reaching zero, a budget, an age):
        whether a request's task is waited then depends on other requests, which no label says. Each as
        (why, ``"wait"`` or the helper's name); the reader keeps the helpers that wait."""
        nodes = list(_own_nodes(self.func))
        counted = {t.attr if isinstance(t, ast.Attribute) else t.id for n in nodes
                   if isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Add, ast.Sub))
                   and isinstance(n.value, ast.Constant) and isinstance(n.value.value, int)
                   for t in [n.target] if isinstance(t, (ast.Attribute, ast.Name))}
        if not counted:
            return ()
        found: list[tuple[str, str]] = []
        for call in nodes:
            callee = _wait_callee(call) if isinstance(call, ast.Call) else None
            if callee is None:
                continue
            child, parent = call, self.parents.get(call)
            while parent is not None:
                if isinstance(parent, (ast.If, ast.While)) and child is not parent.test:
                    read = {n.attr for n in ast.walk(parent.test) if isinstance(n, ast.Attribute)} | {
                        n.id for n in ast.walk(parent.test) if isinstance(n, ast.Name)}
                    if read & counted:
                        found.append((f"line {call.lineno}: {ast.unparse(call.func)}() runs only when "
                                      f"{ast.unparse(parent.test)}, a count this method steps: whether a request's "
                                      "task is waited depends on the others'", callee))
                        break
                child, parent = parent, self.parents.get(parent)
        return tuple(dict.fromkeys(found))

    def _deferred_store_calls(self) -> None:
        """A store dump or wait inside a lambda or a nested function of this body runs when, whether and as often
        as whoever holds that callable calls it: ``self._file(rid, lambda ids: self._store.dump(ids, key))``
        submits in a helper's loop (GroupTreeConnector, fourteenth blind round, whose dumps were not seen at all
        and the class read safe). The reader follows no callable, so the method is opaque."""
        kinds = (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)
        callables = [child for node in _own_nodes(self.func) for child in ast.iter_child_nodes(node)
                     if isinstance(child, kinds)]
        callables += [stmt for stmt in self.func.body if isinstance(stmt, kinds)]  # not among _own_nodes
        for made in callables:
            names = sorted({name for n in ast.walk(made) if (name := _call_name(n)) in STORE_SUBMITS | STORE_WAITS})
            if names:
                kind = "a lambda" if isinstance(made, ast.Lambda) else f"nested function {made.name}()"
                self.opaque.append(
                    f"line {made.lineno}: store {'/'.join(names)}() inside {kind}, which runs when, whether and as "
                    "often as whoever holds it calls it: the reader does not follow callables")

    def _member_tests(self) -> frozenset[str]:
        """The ``self`` tables the body asks whether they hold a key (``k in self.x``, ``k not in self.x``)."""
        return frozenset(attr for node in _own_nodes(self.func) if isinstance(node, ast.Compare)
                         for op, right in zip(node.ops, node.comparators)
                         if isinstance(op, (ast.In, ast.NotIn)) and (attr := _self_attr(right)) is not None)

    def _keyed_after_submit(self) -> frozenset[str]:
        """The ``self`` tables the body writes by key (``self.x[k] = ...``) after a store submit: where a dump is
        recorded under what it covers (an in-flight table of block hashes)."""
        nodes = list(_own_nodes(self.func))
        submits = [n.lineno for n in nodes if isinstance(n, ast.Call) and _call_name(n) in STORE_SUBMITS]
        if not submits:
            return frozenset()
        first = min(submits)
        return frozenset(attr for node in nodes if isinstance(node, ast.Assign) and node.lineno > first
                         for target in node.targets
                         if isinstance(target, ast.Subscript) and (attr := _self_attr(target.value)) is not None)

    def _value_equal_sets(self) -> None:
        """``self.x.add(Hook(req, layer, task))`` where ``Hook`` instances compare equal without being the same
        (a dataclass whose task field is ``compare=False``): a set already holding an equal entry keeps it and
        drops the new task, which nothing then waits (LayerHookSetConnector, seventh blind round)."""
        nodes = list(_own_nodes(self.func))
        submitted = {t.id for n in nodes if isinstance(n, ast.Assign) and _call_name(n.value) in STORE_SUBMITS
                     for t in n.targets if isinstance(t, ast.Name)}
        for call in nodes:
            if not (_call_name(call) == "add" and call.args and isinstance(call.args[0], ast.Call)  # type: ignore[attr-defined]
                    and _func_name(call.args[0]) in self.value_equal):  # type: ignore[attr-defined]
                continue
            made = call.args[0]  # type: ignore[attr-defined]
            if any(_call_name(n) in STORE_SUBMITS for n in ast.walk(made)) or _names_in(made) & submitted:
                self.lost_tasks.append(
                    f"line {call.lineno}: {ast.unparse(call.func)}({_func_name(made)}(...)) keeps a store task in a set "
                    f"of {_func_name(made)} objects that compare equal without being the same: an equal entry "
                    "already there stays, and the new task is dropped unwaited")

    def _partial_waits(self) -> tuple[tuple[str, str], ...]:
        """Store waits and ``self`` helper calls placed where they may stop before the last entry of what
        they wait (round 7 of the blind connectors): a ``while`` whose test is more than "the container is not
        empty" (``while heap and heap[0].step < now`` stops at the first newer entry), a ``for`` loop the body
        can leave (``break``, ``return``, also in a ``finally``), a loop over ``zip(...)`` (stops at the
        shortest), ``islice`` or a slice, a generator consumed by ``all``/``any``/``next`` (short-circuits) or
        not visibly consumed, the right side of ``and``/``or``, and ``map``/``filter`` over a wait (lazy).
        Each as (why, ``"wait"`` or the helper's name); the reader keeps the helpers that wait."""
        found: list[tuple[str, str]] = []
        for call in _own_nodes(self.func):
            target = call.args[0] if isinstance(call, ast.Call) and call.args else None  # the function mapped
            if _func_name(call) in ("map", "filter", "reduce") and isinstance(target, ast.Attribute) \
                    and (target.attr in STORE_WAITS or _is_self(target.value)):
                found.append((f"line {call.lineno}: {ast.unparse(call)} applies {ast.unparse(target)} lazily: how far "
                              "its result is consumed, so which tasks are waited, is not followed",
                              "wait" if target.attr in STORE_WAITS else target.attr))
                continue
            callee = _wait_callee(call) if isinstance(call, ast.Call) else None
            if callee is None:
                continue
            why = self._partial_place(call)
            if why:
                found.append((f"line {call.lineno}: {ast.unparse(call.func)}() {why}: which of the tasks it "
                              "should wait are left running is not read", callee))
        return tuple(dict.fromkeys(found))

    def _unselected_waits(self) -> tuple[tuple[str, str], ...]:
        """Store waits and ``self`` helper calls whose selection (arguments, enclosing ``if`` tests and ``for``
        iterables, closed backwards over local assignments) reads no name or attribute containing ``preempt``."""
        nodes = list(_own_nodes(self.func))
        assigned: dict[str, set[str]] = {}
        for node in nodes:
            rebinding = _rebinding(node)  # `x = …` rebinds x; `self._flags[x] = …` stores into self, not into x
            if rebinding is not None:
                for name in rebinding[0]:
                    assigned.setdefault(name, set()).update(_words_in(rebinding[1]))
            elif isinstance(node, (ast.For, ast.comprehension)):
                for name in _target_names(node.target):
                    assigned.setdefault(name, set()).update(_words_in(node.iter))

        def closed(words: set[str], bound: dict[str, set[str]] | None = None) -> set[str]:
            pending, seen = list(words), set(words)
            while pending:
                name = pending.pop()
                for word in (bound or {}).get(name, assigned.get(name, ())):
                    if word not in seen:
                        seen.add(word)
                        pending.append(word)
            return seen
        found: list[tuple[str, str]] = []
        for call in nodes:
            callee = _wait_callee(call) if isinstance(call, ast.Call) else None
            if callee is None:
                continue
            bound = self._loop_bindings(call)
            # a test `a or b` selects by preemption only if each side does: a side that does not (a layout flag,
            # StepLedgerConnector of the tenth blind round) runs the wait with no preempted request at all
            selectors = [e for e in self._selectors(call) if not (
                isinstance(e, ast.BoolOp) and isinstance(e.op, ast.Or)
                and any(not any("preempt" in w.lower() for w in closed(_words_in(v), bound)) for v in e.values))]
            deps = set().union(*(_words_in(e) for e in selectors))
            polled = any(_requires_poll(test) for test in self._enclosing_tests(call, guarding=True))
            if not polled and not any("preempt" in w.lower() for w in closed(deps, bound)):
                found.append((f"line {call.lineno}", callee))  # a wait under a poll (UCM's) waits ended tasks only
        return tuple(dict.fromkeys(found))

    def _loop_bindings(self, call: ast.Call) -> dict[str, set[str]]:
        """The words each name bound by a loop around ``call`` holds there: its own loop's iterable (and what
        the loop body assigns to it), not another loop's that reuses the name (EagerFlagStateConnector of the
        twelfth blind round: ``for rid in meta.preempted`` marks flags, then ``for rid, state in
        self._flags.items()`` waits every tracked request's tasks; the first binding made the wait look chosen
        by preemption). The innermost loop binding a name wins."""
        bound: dict[str, set[str]] = {}
        child, parent = call, self.parents.get(call)
        while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            loops: list[tuple[ast.AST, ast.AST, list[ast.AST]]] = []
            if isinstance(parent, (ast.For, ast.AsyncFor)) and child is not parent.iter:
                loops.append((parent.target, parent.iter, [*parent.body, *parent.orelse]))
            if isinstance(parent, (ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)):
                loops += [(gen.target, gen.iter, []) for gen in parent.generators]
            for target, iterable, body in loops:
                rebinds = [r for stmt in body for node in ast.walk(stmt) if (r := _rebinding(node)) is not None]
                for name in _target_names(target) - set(bound):
                    bound[name] = set(_words_in(iterable)).union(
                        *(_words_in(value) for names, value in rebinds if name in names))
            child, parent = parent, self.parents.get(parent)
        return bound

    def _partial_place(self, call: ast.Call) -> str | None:
        """Why the place of ``call`` may skip entries of what it waits, or None."""
        child, parent = call, self.parents.get(call)
        while parent is not None:
            if isinstance(parent, ast.While) and child is not parent.test and not _drains_while(parent):
                return f"runs in `while {ast.unparse(parent.test)}`, which may end with entries left"
            if isinstance(parent, ast.For) and child is not parent.iter:
                mutated = _removed_attrs(parent)
                if mutated and _live_iterable(parent.iter, mutated):
                    return (f"runs in a loop over `{ast.unparse(parent.iter)}` while the body removes entries from "
                            f"self.{sorted(mutated)[0]} (a live view skips the entry after each removal)")
                if _leaves_loop(parent):
                    return "runs in a loop its body can leave early (break/return)"
                if _stops_short(parent.iter):
                    return f"runs in a loop over `{ast.unparse(parent.iter)}`, which can stop before the longest input ends"
            if isinstance(parent, ast.BoolOp) and child is not parent.values[0]:
                return "runs only when the other side of `and`/`or` lets it (short-circuit)"
            if isinstance(parent, ast.GeneratorExp):
                consumer = self.parents.get(parent)
                if not (isinstance(consumer, ast.Call) and _func_name(consumer) in CONSUMING_CALLS
                        and parent in consumer.args):
                    name = _func_name(consumer) if isinstance(consumer, ast.Call) else None
                    return (f"runs in a generator passed to {name}(), which can stop early" if name else
                            "runs in a generator the method does not visibly consume to its end")
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                break
            child, parent = parent, self.parents.get(parent)
        return None

    def _reported_waits(self) -> bool | None:
        """Is some store wait (or a ``self`` helper call) of this body selected by the value it returns?
        The returned names are closed backwards over local assignments; a wait depends on a name through its
        arguments or the ``if``/``for`` it sits in. None when the body makes no wait and calls no helper."""
        nodes = list(_own_nodes(self.func))
        returned: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.Return) and node.value is not None:
                value = node.value.elts[0] if isinstance(node.value, ast.Tuple) and node.value.elts else node.value
                returned |= _names_in(value)
        changed = True
        while changed:
            changed = False
            for node in nodes:
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(_names_in(t) & returned for t in targets if isinstance(t, (ast.Name, ast.Tuple))):
                        new = _names_in(node.value) - returned - {"self"}
                        if new:
                            returned |= new
                            changed = True
        waits = [n for n in nodes if isinstance(n, ast.Call) and _wait_callee(n) is not None]
        if not waits:
            return None
        return any(set().union(*(_names_in(e) for e in self._selectors(call))) & returned for call in waits)

    def _enclosing_tests(self, call: ast.Call, *, guarding: bool = False) -> list[ast.expr]:
        """The tests of the ``if``/``while``/conditional expressions ``call`` runs under; with ``guarding``, only
        those that must hold for it to run (it is in their body, not their ``else``)."""
        found: list[ast.expr] = []
        child, parent = call, self.parents.get(call)
        while parent is not None:
            if isinstance(parent, (ast.If, ast.While, ast.IfExp)) and child is not parent.test:
                in_body = child is parent.body if isinstance(parent, ast.IfExp) else child in parent.body
                if in_body or not guarding:
                    found.append(parent.test)
            child, parent = parent, self.parents.get(parent)
        return found

    def _selectors(self, call: ast.Call) -> list[ast.AST]:
        """What decides which task a wait ``call`` waits: its arguments, the tests of the ``if``/``while``/
        conditional expressions it sits in, the iterables and targets of its loops and comprehensions."""
        found: list[ast.AST] = [*call.args, *(k.value for k in call.keywords), *self._enclosing_tests(call)]
        child, parent = call, self.parents.get(call)
        while parent is not None:
            if isinstance(parent, ast.For) and child is not parent.iter:
                found += [parent.iter, parent.target]
            if isinstance(parent, (ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)):
                found += parent.generators
            child, parent = parent, self.parents.get(parent)
        return found

    def _collect_aliases(self) -> None:
        for node in _own_nodes(self.func):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = node.value
                if isinstance(value, ast.Attribute) and _is_self(value.value):
                    if value.attr in self.tracking_attrs:
                        self.tracking_aliases.add(node.targets[0].id)
                    else:
                        self.inner_aliases[node.targets[0].id] = value.attr

    def _decides(self, node: ast.AST) -> bool:
        """Is this read part of a decision: a membership test, a set intersection or difference, the test of
        an ``if``/``while``/conditional, or a comprehension filtering over it?"""
        child, parent = node, self.parents.get(node)
        while parent is not None and not isinstance(parent, ast.stmt):
            if isinstance(parent, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in parent.ops):
                return True
            if isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.BitAnd, ast.Sub)):
                return True
            if isinstance(parent, ast.IfExp) and child is parent.test:
                return True
            if isinstance(parent, ast.comprehension):
                return True
            child, parent = parent, self.parents.get(parent)
        if isinstance(parent, (ast.If, ast.While)) and child is parent.test:
            return True
        if isinstance(parent, ast.AugAssign) and isinstance(parent.op, (ast.BitAnd, ast.Sub)):
            return True
        return isinstance(parent, ast.For) and child is parent.iter

    def _record_attr_op(self, node: ast.Attribute) -> None:
        """``self.<attr>`` used (not called): what is done to it, and whether a branch tests it."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            return
        ops = self.attr_ops.setdefault(node.attr, set())
        ops.add(self._tracking_op(node))
        if self._decides(node):
            ops.add("test")

    def _tracking_op(self, node: ast.expr) -> str:
        parent = self.parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node:  # a dict keyed by request (or tuple)
            if isinstance(parent.ctx, ast.Store):
                return "read" if self._rekeys(node, parent) else "add"
            if isinstance(parent.ctx, ast.Del):
                return "remove"
            return "read"
        if isinstance(parent, ast.Attribute) and parent.value is node:
            call = self.parents.get(parent)
            if isinstance(call, ast.Call) and call.func is parent:
                if parent.attr in _ADDING_CALLS:
                    return "add"
                if parent.attr in _REMOVING_CALLS:
                    return "remove"
            return "read"
        if isinstance(parent, ast.AugAssign) and parent.target is node:
            if isinstance(parent.op, ast.BitOr):
                return "add"
            if isinstance(parent.op, (ast.Sub, ast.BitAnd)):
                return "remove"
            return "assign"
        if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.Delete)) and node is not getattr(parent, "value", None):
            return "assign"
        return "read"

    def _rekeys(self, node: ast.Attribute, store: ast.Subscript) -> bool:
        """``self.<attr>[k] = v`` inside ``for k, ... in self.<attr>.items()`` (or ``.keys()``, ``list(...)`` of
        either, the attribute itself): the key is one the container already holds, so nothing new is tracked.
        StageLocalTrackingConnector (twenty-ninth blind round) keeps a request's remaining copies under its id
        in ``_reap``; read as tracking, its ``wait_for_save`` passed for the model's tracking ``wait_for_save``
        although the class tracks only in ``save_kv_layer``, after a replica rank's return."""
        if not isinstance(store.slice, ast.Name):
            return False
        key = store.slice.id
        parent = self.parents.get(store)
        while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(parent, ast.For):
                target = parent.target
                first = target.elts[0] if isinstance(target, (ast.Tuple, ast.List)) and target.elts else target
                source = parent.iter
                if isinstance(source, ast.Call) and isinstance(source.func, ast.Name) \
                        and source.func.id in ("list", "tuple", "sorted") and len(source.args) == 1:
                    source = source.args[0]
                if isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute) \
                        and source.func.attr in ("items", "keys") and not source.args:
                    source = source.func.value
                if isinstance(first, ast.Name) and first.id == key:
                    return isinstance(source, ast.Attribute) and _is_self(source.value) and source.attr == node.attr \
                        and not any(key in (_rebinding(n) or ((), None))[0] or isinstance(n, ast.For)
                                    and key in _target_names(n.target) for b in parent.body for n in ast.walk(b))
            parent = self.parents.get(parent)
        return False

    def _read_call(self, call: ast.Call) -> None:
        func = call.func
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            if isinstance(arg, ast.Attribute) and arg.attr in _POLLS and not _is_self(arg.value):
                # ``all(map(self._store.check, rec.tasks))``: the store's poll, passed as a value, runs as a call
                # (SlottedRecordConnector, a blind round's, read as reporting before any wait)
                self.calls.add(arg.attr)
        if any(k.arg == "non_blocking" and not (isinstance(k.value, ast.Constant) and not k.value.value)
               for k in call.keywords):
            self.async_hints.append(f"line {call.lineno}: {ast.unparse(func)}(..., non_blocking=...)")
        callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if callee in ASYNC_CALLS and not (isinstance(func, ast.Attribute) and _is_self(func.value)):
            self.async_hints.append(f"line {call.lineno}: {ast.unparse(func)}()")
        if isinstance(func, ast.Name) and func.id == "getattr" and call.args and _is_self(call.args[0]):
            self.opaque.append(f"line {call.lineno}: getattr(self, ...) call")
            return
        if isinstance(func, ast.Name):
            self.calls.add(func.id)  # a plain function: ``save_file(...)`` imported by name
            self.plain_calls.add(func.id)
            if any(_is_self(a) for a in [*call.args, *(k.value for k in call.keywords)]):
                self.handoffs.append(("function", func.id, "", call.lineno))  # its callbacks: read_source fills them
            return
        if not isinstance(func, ast.Attribute):
            return
        target = func.value
        if not _is_self(target) and not (isinstance(target, ast.Call) and _dotted(target.func) == "super"):
            self.calls.add(func.attr)
        held = self._held_attr(target)
        hands_self = any(_is_self(a) for a in [*call.args, *(k.value for k in call.keywords)])
        if held is not None:
            self.attr_calls.append((held[0], ".".join((*held[1:], func.attr)), call.lineno))
            if hands_self and len(held) == 1:
                self.handoffs.append(("attr", held[0], func.attr, call.lineno))
        elif isinstance(target, ast.Name) and target.id in self.local_classes:
            for cls in self.local_classes[target.id]:
                self.other_calls.append((cls, func.attr, call.lineno))
                if hands_self:
                    self.handoffs.append(("class", cls, func.attr, call.lineno))
        elif not _is_self(target) and not isinstance(target, ast.Constant) and not (
                isinstance(target, ast.Call) and _dotted(target.func) == "super"):
            self.loose_calls.append((ast.unparse(target), func.attr, call.lineno))
            if hands_self:
                self.handoffs.append(("loose", ast.unparse(target), func.attr, call.lineno))
        if isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "super":
            self._read_super(call, func.attr, target)
        elif _is_self(target):
            self.self_calls.add(func.attr)
            self.self_call_uses.append((func.attr, _call_use(call, self.parents)))
            self.self_call_sites.append((func.attr, call.lineno))
        elif isinstance(target, ast.Attribute) and _is_self(target.value) and target.attr not in self.tracking_attrs:
            if func.attr in CONNECTOR_METHODS:
                self.forwards.append(Forward(target.attr, func.attr, self._guards(call, target.attr)))
        elif isinstance(target, ast.Name) and target.id in self.inner_aliases:
            if func.attr in CONNECTOR_METHODS:
                attr = self.inner_aliases[target.id]
                self.forwards.append(Forward(attr, func.attr, self._guards(call, attr)))
        elif call.args and _is_self(call.args[0]):
            anchor = _dotted(target)
            if anchor is not None:
                self.delegations.append(Delegation("explicit", func.attr, _simple(anchor)))

    def _read_special(self, receiver: ast.expr, special: str, node: ast.AST) -> None:
        """A special method Python calls for syntax (``t[k] = v`` calls ``t.__setitem__``), recorded as a call on
        its receiver like any other: a helper class of the analysed files may define it with store work (the
        twenty-first blind round's ``PolledDumpTable``, a ``dict`` whose ``__setitem__`` submits a dump). It never
        counts as a store call by its name (``calls`` is left alone); builtins' special methods are not analysed."""
        if _is_self(receiver) or isinstance(receiver, _LITERALS) or (
                isinstance(receiver, ast.Name) and receiver.id in self.local_data) or (
                isinstance(receiver, ast.Call) and _dotted(receiver.func) == "super"):
            return
        line = getattr(node, "lineno", receiver.lineno)
        held = self._held_attr(receiver)
        if held is not None:
            self.attr_calls.append((held[0], ".".join((*held[1:], special)), line))
        elif isinstance(receiver, ast.Name) and receiver.id in self.local_classes:
            for cls in self.local_classes[receiver.id]:
                self.other_calls.append((cls, special, line))
        else:
            self.loose_calls.append((ast.unparse(receiver), special, line))

    def _held_attr(self, target: ast.expr) -> tuple[str, ...] | None:
        """``self.<a>.<b>`` (or a local alias of ``self.<a>``, then ``.<b>``) as ``(a, b)``: the attribute a
        call's receiver is reached from; None for any other receiver (``self`` itself, a subscript, a call)."""
        path: list[str] = []
        while isinstance(target, ast.Attribute) and not _is_self(target.value):
            path.append(target.attr)
            target = target.value
        if isinstance(target, ast.Attribute) and _is_self(target.value):
            return (target.attr, *reversed(path))
        if isinstance(target, ast.Name) and target.id in self.inner_aliases:
            return (self.inner_aliases[target.id], *reversed(path))
        return None

    def _isinstance_test(self, test: ast.expr, attr: str) -> tuple[str, bool] | None:
        """``isinstance(self.<attr>, X)`` (or a local alias of it, or its ``not``) as (X, polarity)."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self._isinstance_test(test.operand, attr)
            return None if inner is None else (inner[0], not inner[1])
        if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance"):
            return None
        if len(test.args) != 2:
            return None
        subject, cls = test.args
        held = (isinstance(subject, ast.Attribute) and _is_self(subject.value) and subject.attr == attr) or (
            isinstance(subject, ast.Name) and self.inner_aliases.get(subject.id) == attr
        )
        name = _dotted(cls)
        return (_simple(name), True) if held and name else None

    def _guards(self, node: ast.AST, attr: str) -> tuple[tuple[str, bool], ...]:
        """The isinstance tests on ``self.<attr>`` that decide whether ``node`` runs: enclosing ``if``s,
        and earlier ``if``s in the same block whose body always returns (an early return)."""
        guards: list[tuple[str, bool]] = []
        child: ast.AST = node
        parent = self.parents.get(child)
        while parent is not None:
            if isinstance(parent, ast.If):
                test = self._isinstance_test(parent.test, attr)
                if test is not None and child in parent.body:
                    guards.append(test)
                elif test is not None and child in parent.orelse:
                    guards.append((test[0], not test[1]))
            for field_name in ("body", "orelse", "finalbody"):
                block = getattr(parent, field_name, None)
                if isinstance(block, list) and child in block:
                    for earlier in block[: block.index(child)]:
                        if isinstance(earlier, ast.If) and earlier.body and not earlier.orelse:
                            if isinstance(earlier.body[-1], (ast.Return, ast.Raise)):
                                test = self._isinstance_test(earlier.test, attr)
                                if test is not None:
                                    guards.append((test[0], not test[1]))
            child, parent = parent, self.parents.get(parent)
        top = self.func.body
        if child in top:
            for earlier in top[: top.index(child)]:
                if isinstance(earlier, ast.If) and earlier.body and not earlier.orelse:
                    if isinstance(earlier.body[-1], (ast.Return, ast.Raise)):
                        test = self._isinstance_test(earlier.test, attr)
                        if test is not None:
                            guards.append((test[0], not test[1]))
        return tuple(dict.fromkeys(guards))

    def _read_super(self, call: ast.Call, method: str, sup: ast.Call) -> None:
        if not sup.args:
            self.delegations.append(Delegation("super", method, self.owner))
            return
        anchor = _dotted(sup.args[0])
        if len(sup.args) == 2 and _is_self(sup.args[1]) and anchor is not None:
            self.delegations.append(Delegation("super", method, _simple(anchor)))
        else:
            self.opaque.append(f"line {call.lineno}: super({ast.unparse(sup.args[0])}, ...) with a dynamic class")

    def _handler_calls(self) -> frozenset[str]:
        """Every method called in an ``except`` handler: a release there as well as after the wait is not the
        release-on-success mutant (PR #989's helper releases in ``finally``)."""
        names: set[str] = set()
        for node in _own_nodes(self.func):
            if isinstance(node, ast.ExceptHandler):
                for stmt in node.body:
                    for sub in ast.walk(stmt):
                        if isinstance(sub, ast.Call) and (name := _dotted(sub.func)):
                            names.add(_simple(name))
        return frozenset(names)

    def _success_releases(self) -> tuple[tuple[int, str], ...]:
        """(line, call) of each release-like call a ``try`` body makes after a store wait (``wait``/``wait_dump``)
        where the ``try`` has an ``except`` that does not make the call and no ``finally``: a wait that raises skips
        it, PR #989's release-on-success bug in a helper of any name (EventFencedStageLeanConnector, twenty-ninth
        blind round)."""
        found: list[tuple[int, str]] = []
        for node in _own_nodes(self.func):
            if not isinstance(node, ast.Try) or not node.handlers or node.finalbody:
                continue
            handled = {_simple(name) for handler in node.handlers for sub in ast.walk(handler)
                       if isinstance(sub, ast.Call) and (name := _dotted(sub.func))}
            waited = False
            for stmt in node.body:
                calls = [sub for sub in ast.walk(stmt) if isinstance(sub, ast.Call) and _dotted(sub.func)]
                if waited:
                    found += [(sub.lineno, simple) for sub in calls
                              if "release" in (simple := _simple(_dotted(sub.func) or "")).lower()
                              and simple not in handled]
                if any(_simple(_dotted(sub.func) or "") in ("wait", "wait_dump") for sub in calls):
                    waited = True
        return tuple(dict.fromkeys(found))

    def _wait_or_keep(self) -> tuple[tuple[int, str], ...]:
        """Each ``if`` that waits on one side (a store ``wait`` or a ``self`` helper call) and adds to a ``self``
        container on the other (``append``/``extend``/``add``/an item): the twenty-ninth blind round's
        ``RecordStoreConnector._record`` settles a record at once when it reads a sliding-window group and keeps it
        otherwise, which read as a save that waits what it submits (blocking)."""
        def keeps(block: list[ast.stmt]) -> bool:
            for node in (n for stmt in block for n in ast.walk(stmt)):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in FILLING_CALLS and isinstance(node.func.value, ast.Attribute) \
                        and _is_self(node.func.value.value):
                    return True
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute)
                                                        and _is_self(t.value.value) for t in node.targets):
                    return True
            return False
        return tuple((node.lineno, ast.unparse(node.test)) for node in _own_nodes(self.func)
                     if isinstance(node, ast.If) and node.orelse
                     and (_block_waits(node.body) and keeps(node.orelse) or _block_waits(node.orelse) and keeps(node.body)))

    def _subset_waits(self) -> list[str]:
        """A wait (a store ``wait``, or a ``self`` helper) made only when a set is a subset of another
        (``if rec.req_ids <= done:``, ``.issubset()``, ``.issuperset()``): a task shared by several requests is waited
        only once all of them are finished, where the model waits every task of each finished request (the
        twenty-ninth blind round's ``DetachingRecordConnector`` reports a finished request whose shared task runs
        on for its running neighbour)."""
        def set_like(side: ast.expr) -> bool:  # a set by its spelling: set()/frozenset(), or a name of ids
            if isinstance(side, ast.Call):
                return _func_name(side) in ("set", "frozenset")
            name = side.attr if isinstance(side, ast.Attribute) else side.id if isinstance(side, ast.Name) else ""
            return name.endswith("_ids") and not name.startswith(("num_", "n_")) or name in ("done", "finished")

        def subset(test: ast.expr) -> bool:
            for node in ast.walk(test):
                if isinstance(node, ast.Compare) and any(isinstance(op, (ast.LtE, ast.GtE)) for op in node.ops) \
                        and all(set_like(side) for side in (node.left, *node.comparators)):
                    return True
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in ("issubset", "issuperset"):
                    return True
            return False
        return [f"line {node.lineno}: waits under `if {ast.unparse(node.test)}`, a test of one set within another: a "
                "task serving several requests may be waited only once all are finished, where the model waits "
                "every task of each finished request"
                for node in _own_nodes(self.func)
                if isinstance(node, ast.If) and subset(node.test) and _block_waits(node.body)]

    def _rebound_aliases(self) -> list[str]:
        """A local that names an entry of a ``self`` container (``tasks = self._by_req.setdefault(r, [])``) and is
        bound again in the same function (``tasks = []``) before entries are added through it: on one path the
        additions reach the class's container, on the other a new one nothing keeps (the twenty-ninth blind round's
        ``ResumeAwareStoreConnector`` loses the first dump after a resume that way)."""
        def self_entry(node: ast.expr) -> bool:  # ``self.a[k]``, ``self.a.setdefault(k, [])``, a ``self`` target
            return isinstance(node, (ast.Subscript, ast.Call, ast.Attribute)) \
                and any(isinstance(n, ast.Attribute) and _is_self(n.value) for n in ast.walk(node))

        kept: dict[str, list[bool]] = {}  # per local: whether each binding names a container the class keeps
        filled: dict[str, tuple[int, str]] = {}
        for node in _own_nodes(self.func):
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                keeps = self_entry(node.value) or any(self_entry(t) for t in node.targets)  # ``x = self.a[k] = []``
                for name in names:
                    kept.setdefault(name, []).append(keeps)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.attr in FILLING_CALLS:
                filled.setdefault(node.func.value.id, (node.lineno, node.func.attr))
        return [f"line {filled[name][0]}: {name}.{filled[name][1]}() adds to a local that names an entry of a self "
                f"container on one path and is bound anew on another: {UNSEEN_KEEPING}"
                for name, bindings in kept.items() if name in filled and any(bindings) and not all(bindings)]

    def _named_at_run_time(self) -> list[str]:
        """``self`` attributes reached by names computed at run time: ``vars(self)``, ``self.__dict__``,
        ``setattr(self, <expression>, ...)``. Which containers such code fills or walks is not the reader's (the
        twenty-ninth blind round's ``ReflectiveStoreConnector`` finds its task tables by ``vars(self)``; a subclass
        declaring one in ``__slots__`` hides it there, and its dumps are never waited)."""
        found: list[str] = []
        for node in _own_nodes(self.func):
            if isinstance(node, ast.Attribute) and node.attr == "__dict__" and _is_self(node.value):
                found.append(f"line {node.lineno}: self.__dict__: attributes named at run time are not read")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args and _is_self(node.args[0]):
                if node.func.id == "vars":
                    found.append(f"line {node.lineno}: vars(self): attributes named at run time are not read")
                elif node.func.id == "setattr" and len(node.args) > 1 and not isinstance(node.args[1], ast.Constant):
                    found.append(f"line {node.lineno}: setattr(self, {ast.unparse(node.args[1])}, ...): attributes "
                                 "named at run time are not read")
        return found

    def _finally_calls(self) -> frozenset[str]:
        names: set[str] = set()
        for node in _own_nodes(self.func):
            if isinstance(node, ast.Try) and node.finalbody:
                for stmt in node.finalbody:
                    for sub in ast.walk(stmt):
                        if isinstance(sub, ast.Call):
                            name = _dotted(sub.func)
                            if name:
                                names.add(_simple(name))
        return frozenset(names)

    def _delay_answer(self) -> bool | None:
        """``True``/``False`` when the body ends in a return and every return is a tuple whose first element
        is that literal (``return False, {"key": k}``: whatever the rest, a finish that never delays)."""
        returns = self._every_return()
        if returns is None:
            return None
        answers: set[bool] = set()
        for ret in returns:
            first = ret.value.elts[0] if isinstance(ret.value, ast.Tuple) and ret.value.elts else None
            if not (isinstance(first, ast.Constant) and isinstance(first.value, bool)):
                return None
            answers.add(first.value)
        return answers.pop() if len(answers) == 1 else None

    def _full_sweeps(self) -> frozenset[str]:
        """See the field: loops not under any ``if``/``while``/``try``, left by no ``break``/``return``."""
        found: set[str] = set()
        for loop in _own_nodes(self.func):
            if not isinstance(loop, ast.For) or _iterated_attr(loop.iter) is None:
                continue
            up, guarded = self.parents.get(loop), False
            while up is not None and not guarded:
                guarded = isinstance(up, (ast.If, ast.While, ast.Try, ast.For, ast.IfExp))
                up = self.parents.get(up)
            body = [n for stmt in loop.body for n in ast.walk(stmt)]
            if guarded or any(isinstance(n, (ast.Break, ast.Return, ast.If, ast.Try)) for n in body):
                continue
            names = _names_in(loop.target)
            for call in body:
                callee = _wait_callee(call) if isinstance(call, ast.Call) else None
                if callee and any(_names_in(a) & names for a in call.args):
                    found.add(callee)
        return frozenset(found)

    def _kept_params(self) -> frozenset[str]:
        """Parameters whose values reach a store into ``self`` state (see the field), followed through locals."""
        params = {a.arg for a in self.func.args.args[1:]} | {a.arg for a in self.func.args.kwonlyargs}
        nodes = list(_own_nodes(self.func))
        derived: dict[str, set[str]] = {p: {p} for p in params}
        for _ in range(3):  # locals of locals
            for node in nodes:
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    sources = set().union(*(derived.get(n, set()) for n in _names_in(node.value)))
                    for target in targets:
                        if isinstance(target, ast.Name):
                            derived.setdefault(target.id, set()).update(sources)
                elif isinstance(node, (ast.For, ast.comprehension)):
                    sources = set().union(*(derived.get(n, set()) for n in _names_in(node.iter)))
                    for name in _names_in(node.target):
                        derived.setdefault(name, set()).update(sources)
        kept: set[str] = set()

        def reached(expr: ast.AST) -> set[str]:
            return set().union(*(derived.get(n, set()) for n in _names_in(expr))) & params
        for node in nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(_self_attr(t if not isinstance(t, ast.Subscript) else t.value) for t in targets
                       if isinstance(t, (ast.Attribute, ast.Subscript))):
                    kept |= reached(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("append", "add", "update", "extend", "setdefault", "insert", "appendleft") \
                    and _self_attr(node.func.value if not isinstance(node.func.value, ast.Subscript) else node.func.value.value):
                kept |= set().union(set(), *(reached(a) for a in [*node.args, *(k.value for k in node.keywords)]))
        return frozenset(kept)

    def _replacing_params(self) -> tuple[tuple[str, str, frozenset[str]], ...]:
        """See the field (KeyedChunkSaveConnector, twenty-fifth blind round: ``_track_task(rid, task)`` storing
        ``self._tasks[rid] = [task]`` keeps only a request's newest dump)."""
        params = [a.arg for a in self.func.args.args[1:]] + [a.arg for a in self.func.args.kwonlyargs]
        bound = _local_bindings(self.func)
        found: list[tuple[str, str, frozenset[str]]] = []
        for node in _own_nodes(self.func):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for param in params:
                if not _reaches(node.value, param, bound):
                    continue
                for target in targets:
                    note = _note_replacing(target, node.value, set())
                    if note is None or param in _names_in(getattr(target, "slice", ast.Constant(None))):
                        continue
                    # the new value built from the old one through a local (``old = self.x.get(k)``) keeps it
                    olds = [v for name in _names_in(node.value) for v in bound.get(name, ())]
                    if any(_self_attr(n) == note[0] for v in olds for n in ast.walk(v)):
                        continue
                    found.append((param, *note))
        return tuple(dict.fromkeys(found))

    def _switched_waits(self) -> tuple[tuple[str, str], ...]:
        """Each wait (store wait or ``self`` helper call) with the first switch it runs under (see the field)."""
        found: list[tuple[str, str]] = []
        for call in _own_nodes(self.func):
            callee = _wait_callee(call) if isinstance(call, ast.Call) else None
            if callee is None:
                continue
            switches = [t for t in self._enclosing_tests(call)
                        if _names_in(t) == {"self"} and not isinstance(self.parents.get(t), ast.While)]
            found.append((ast.unparse(switches[0]) if switches else "", callee))
        return tuple(dict.fromkeys(found))

    def _switched_selections(self) -> tuple[str, ...]:
        """Tests choosing a local between a ``self`` attribute and a parameter's value (see the field)."""
        params = {a.arg for a in self.func.args.args[1:]}

        def side(expr: ast.AST) -> str | None:
            # the call's own values first: the preempted requests filtered by what self holds are still those
            if _names_in(expr) & params:
                return "param"
            if any(_self_attr(n) for n in ast.walk(expr) if isinstance(n, (ast.Attribute, ast.Subscript))):
                return "self"
            return None

        found: list[str] = []
        for node in _own_nodes(self.func):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.IfExp):
                sides = {side(node.value.body), side(node.value.orelse)}
                if sides == {"self", "param"}:
                    found.append(ast.unparse(node.value.test))
            elif isinstance(node, ast.If) and node.orelse:
                def bound(stmts: list[ast.stmt]) -> dict[str, ast.AST]:
                    return {t.id: s.value for stmt in stmts for s in ast.walk(stmt) if isinstance(s, ast.Assign)
                            for t in s.targets if isinstance(t, ast.Name)}
                here, there = bound(node.body), bound(node.orelse)
                for name in here.keys() & there.keys():
                    if {side(here[name]), side(there[name])} == {"self", "param"}:
                        found.append(ast.unparse(node.test))
                        break
        return tuple(found)

    def _false_when_member(self) -> tuple[str, ...]:
        """Tests ``x in self.<attr>`` (not ``not in``) that an ``if`` opens whose branch returns ``(False, ...)``."""
        found: list[str] = []
        for node in _own_nodes(self.func):
            if not isinstance(node, ast.If):
                continue
            members = [c for c in ast.walk(node.test) if isinstance(c, ast.Compare)
                       and any(isinstance(op, ast.In) for op in c.ops)
                       and any(_self_attr(r) in self.tracking_attrs for r in c.comparators)]
            if not members or any(isinstance(u, ast.UnaryOp) and isinstance(u.op, ast.Not)
                                  for u in ast.walk(node.test)):
                continue
            false_returns = [r for stmt in node.body for r in ast.walk(stmt) if isinstance(r, ast.Return)
                             and isinstance(r.value, ast.Tuple) and r.value.elts
                             and isinstance(r.value.elts[0], ast.Constant) and r.value.elts[0].value is False]
            if false_returns:
                found.append(ast.unparse(node.test))
        return tuple(found)

    def _answers(self) -> list[tuple[ast.Return, ast.expr]] | None:
        """Each return with the answer it gives: a finish's first tuple element, another method's value; None when
        a return gives none or the body may end without one."""
        returns = self._every_return()
        if returns is None:
            return None
        finish = self.func.name in FINISH_METHODS
        found: list[tuple[ast.Return, ast.expr]] = []
        for ret in returns:
            if finish:
                if not (isinstance(ret.value, ast.Tuple) and ret.value.elts):
                    return None
                found.append((ret, ret.value.elts[0]))
            elif ret.value is None:
                return None
            else:
                found.append((ret, ret.value))
        return found

    def _answers_read(self) -> bool:
        return self._answers() is not None

    def _delay_guards(self) -> tuple[DelayGuard, ...]:
        """See the field. A finish that answers ``held = rid in self._saving and params.get("remote")`` (the
        twenty-fifth blind round's ``FirstTokenChunkSaveConnector``) or returns ``(False, ...)`` early under a flag
        frees some tracked requests at once; read as "delay if tracked" it was judged safe. A helper's parameters
        count as the request's id (the caller's arguments are checked where it is called)."""
        answers = self._answers()
        if not answers:
            return ()
        bound = _local_bindings(self.func)
        plain = self._request_id_names(bound)
        if self.func.name not in FINISH_METHODS:
            plain |= {a.arg for a in self.func.args.args[1:]}
        tests: list[ast.expr] = []
        for ret, answer in answers:
            if isinstance(answer, ast.Constant) and answer.value is True:
                continue
            tests += self._path_tests(ret)
            if not isinstance(answer, ast.Constant):
                tests += _decisions(answer, bound, set())
        found: list[DelayGuard] = []
        for test in tests:
            flags, helpers, foreign = self._guard_reads(test, plain)
            if flags or helpers or foreign:
                found.append(DelayGuard(test.lineno, ast.unparse(test), frozenset(plain), frozenset(flags),
                                        frozenset(helpers), foreign))
        return tuple(dict.fromkeys(found))

    def _guard_reads(self, expr: ast.expr, plain: set[str]) -> tuple[set[str], set[str], bool]:
        """What ``expr`` reads beyond the tracking set and the request's id: ``self`` attributes (flags), ``self``
        helpers called with such arguments, and whether anything else."""
        flags: set[str] = set()
        helpers: set[str] = set()
        foreign = False
        calls = {id(n.func) for n in ast.walk(expr) if isinstance(n, ast.Call)}
        for node in ast.walk(expr):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_self(node.func.value) \
                    and node.func.attr not in self.tracking_attrs:
                helpers.add(node.func.attr)
            elif isinstance(node, ast.Attribute):
                if _is_self(node.value):
                    if node.attr not in self.tracking_attrs and id(node) not in calls:
                        flags.add(node.attr)
                elif node.attr not in ("request_id", "req_id") and not (isinstance(node.value, ast.Attribute) and _is_self(
                        node.value.value) and node.value.attr in self.tracking_attrs) and id(node) not in calls:
                    foreign = True
                elif id(node) in calls and not (_is_self(node.value) or (isinstance(node.value, ast.Attribute)
                                                and _is_self(node.value.value)
                                                and node.value.attr in self.tracking_attrs)):
                    foreign = True
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id not in plain and node.id not in self.tracking_aliases and node.id not in _ID_BUILTINS \
                        and node.id not in ("self", "request", "req", "request_id", "req_id"):
                    foreign = True
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in _ID_BUILTINS:
                foreign = True
            elif isinstance(node, (ast.Subscript, ast.Lambda, ast.NamedExpr, ast.Await)):
                foreign = True
        return flags, helpers, foreign

    def _only_tracking(self, expr: ast.expr, plain: set[str]) -> bool:
        flags, helpers, foreign = self._guard_reads(expr, plain)
        return not (flags or helpers or foreign)

    def _request_id_names(self, bound: dict[str, list[ast.expr]]) -> set[str]:
        """Locals that hold the request's id or a tracking-only value (``rid = request.request_id``,
        ``held = rid in self._saving``), to a fixpoint."""
        names: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, values in bound.items():
                if name not in names and values and all(self._only_tracking(v, names) for v in values):
                    names.add(name)
                    changed = True
        return names

    def _path_tests(self, node: ast.AST) -> list[ast.expr]:
        """The tests of the ``if``/``while`` statements and conditional expressions around ``node``, and of the
        ``if`` statements before it (at each enclosing level) whose body or ``else`` returns."""
        tests: list[ast.expr] = []
        child, up = node, self.parents.get(node)
        while up is not None:
            if isinstance(up, (ast.If, ast.While, ast.IfExp)) and child is not up.test:
                tests.append(up.test)
            for field_name in ("body", "orelse", "finalbody"):
                block = getattr(up, field_name, None)
                if isinstance(block, list) and child in block:
                    for earlier in block[:block.index(child)]:
                        if isinstance(earlier, ast.If) and any(isinstance(n, ast.Return) for n in ast.walk(earlier)):
                            tests.append(earlier.test)
            child, up = up, self.parents.get(up)
        return tests

    def _every_return(self) -> list[ast.Return] | None:
        """The body's returns, when it cannot end without one (its last statement returns); else None."""
        returns = [n for n in _own_nodes(self.func) if isinstance(n, ast.Return)]
        body = _strip_docstring(self.func.body)
        if not returns or not body or not isinstance(body[-1], ast.Return):
            return None
        return returns

    def _constant_return(self) -> str | None:
        returns = self._every_return()
        if returns is None:
            return None
        values: set[str] = set()
        for ret in returns:
            if ret.value is None:
                values.add(repr(None))
                continue
            try:
                values.add(repr(ast.literal_eval(ret.value)))
            except ValueError:
                return None
        return values.pop() if len(values) == 1 else None


#: The finish methods whose first answer is the delay.
FINISH_METHODS = frozenset({"request_finished", "request_finished_all_groups"})
#: Builtins a test may apply to the tracking set or the request's id without reading anything else.
_ID_BUILTINS = frozenset({"bool", "len", "str", "set", "frozenset", "tuple", "list", "any", "all", "True", "False",
                          "None", "isinstance"})


def _reaches(expr: ast.AST, name: str, bound: dict[str, list[ast.expr]], seen: frozenset[str] = frozenset()) -> bool:
    """Does ``expr`` read ``name``, directly or through locals bound from it?"""
    for used in _names_in(expr):
        if used == name:
            return True
        if used in bound and used not in seen and any(
                _reaches(v, name, bound, seen | {used}) for v in bound[used]):
            return True
    return False


def _local_bindings(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, list[ast.expr]]:
    """Every value a plain local name is bound to by ``=`` (one target) or ``:=`` in the body."""
    bound: dict[str, list[ast.expr]] = {}
    for node in _own_nodes(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            bound.setdefault(node.targets[0].id, []).append(node.value)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name) and node.value:
            bound.setdefault(node.target.id, []).append(node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            bound.setdefault(node.target.id, []).append(node.value)
    return bound


def _decisions(answer: ast.expr, bound: dict[str, list[ast.expr]], seen: set[str]) -> list[ast.expr]:
    """The conditions inside a delay answer that can make it False: operands of ``and``, ``not`` and comparisons,
    a conditional expression's test and branches, followed through the locals it names."""
    if isinstance(answer, ast.Name):
        if answer.id in seen or answer.id not in bound:
            return []
        seen.add(answer.id)
        return [d for value in bound[answer.id] for d in _decisions(value, bound, seen)]
    if isinstance(answer, ast.BoolOp) and isinstance(answer.op, ast.And):
        return [d for value in answer.values for d in (_decisions(value, bound, seen) or [value])]
    if isinstance(answer, ast.BoolOp) and isinstance(answer.op, ast.Or):
        # False only when every operand is; which operand delays every tracked request is not read (an ``or``
        # of ``and``s may not), so every operand's conditions count: an ``or`` that only delays more stays unknown
        return [d for value in answer.values for d in (_decisions(value, bound, seen) or [value])]
    if isinstance(answer, ast.IfExp):
        return [answer.test, *(_decisions(answer.body, bound, seen) or [answer.body]),
                *(_decisions(answer.orelse, bound, seen) or [answer.orelse])]
    if isinstance(answer, ast.Call) and isinstance(answer.func, ast.Name) and answer.func.id == "bool" and answer.args:
        return _decisions(answer.args[0], bound, seen) or [answer.args[0]]
    return [answer]


def _block_acts(nodes: Sequence[ast.AST]) -> set[str]:
    """What statements (or expressions) do that a wait rule cares about: ``return`` (bare) or
    ``return_value``, ``break`` (``continue`` too), store ``wait`` or ``submit``, a ``super`` call, and
    ``self.<m>`` for each helper they call (whether that helper waits is the reader's to decide)."""
    acts: set[str] = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Return):
                acts.add("return" if sub.value is None else "return_value")
            elif isinstance(sub, (ast.Break, ast.Continue)):
                acts.add("break")
            elif isinstance(sub, ast.Call):
                name = _call_name(sub)
                if name in STORE_WAITS:
                    acts.add("wait")
                elif name in STORE_SUBMITS:
                    acts.add("submit")
                elif isinstance(sub.func, ast.Attribute) and isinstance(sub.func.value, ast.Call) \
                        and _dotted(sub.func.value.func) == "super":
                    acts.add("super")
                elif isinstance(sub.func, ast.Attribute) and _is_self(sub.func.value):
                    acts.add(f"self.{sub.func.attr}")
    return acts


_RANK_WORDS = ("rank", "leader", "driver")


def _reads_rank(test: ast.expr) -> bool:
    """Does an ``if``/``while`` test read the worker's rank (by a name, an attribute or a call)?"""
    for node in ast.walk(test):
        word = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if word is not None and any(w in word.lower() for w in _RANK_WORDS):
            return True
    return False


def _rank_value(value: ast.expr, ranked: set[str]) -> bool:
    """Is ``value`` the rank, or a test of it (``tp == 0``, ``not use_mla or get_tensor_model_parallel_rank() == 0``,
    a local in ``ranked``)? An argument of another call is not (``Worker(cpu_capacity_per_rank)``: vLLM's
    ``SimpleCPUOffloadConnector`` passes a per-rank size to its worker)."""
    if isinstance(value, ast.Call):
        return _rank_value(value.func, ranked)
    if isinstance(value, ast.Name):
        return value.id in ranked or any(w in value.id.lower() for w in _RANK_WORDS)
    if isinstance(value, ast.Attribute):
        return any(w in value.attr.lower() for w in _RANK_WORDS)
    if isinstance(value, ast.Compare):
        return any(_rank_value(v, ranked) for v in (value.left, *value.comparators))
    if isinstance(value, ast.BoolOp):
        return any(_rank_value(v, ranked) for v in value.values)
    if isinstance(value, ast.UnaryOp):
        return _rank_value(value.operand, ranked)
    if isinstance(value, ast.IfExp):
        return _rank_value(value.body, ranked) or _rank_value(value.orelse, ranked)
    return False


def _wait_callee(call: ast.Call) -> str | None:
    """``"wait"`` for a store wait, the helper's name for a ``self.<helper>()`` call (which may wait), else None."""
    if _call_name(call) in STORE_WAITS:
        return "wait"
    if isinstance(call.func, ast.Attribute) and _is_self(call.func.value):
        return call.func.attr
    return None


def _func_name(node: ast.AST) -> str | None:
    """The called name: ``f(...)`` -> ``f``, ``x.f(...)`` -> ``f``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id
    return _call_name(node)


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def _foreign_words(func: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    """Attribute names ``func`` reads on objects other than ``self`` (``meta.freed_block_ids``; the name string of
    ``getattr(meta, "freed_block_ids", ...)``): what it learns from its arguments, not what the class keeps."""
    found: set[str] = set()
    for node in _own_nodes(func):
        if isinstance(node, ast.Attribute) and not _is_self(node.value):
            found.add(node.attr)
        elif (isinstance(node, ast.Call) and _func_name(node) == "getattr" and len(node.args) >= 2
              and not _is_self(node.args[0]) and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            found.add(node.args[1].value)
    return frozenset(found)


def _words_in(node: ast.AST) -> set[str]:
    """Every name and attribute name in ``node``."""
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def _self_attr(node: ast.AST) -> str | None:
    """``self.x`` (or ``self.x[...]``) -> ``x``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and _is_self(node.value):
        return node.attr
    return None


def _param_derived(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The parameters (``self`` left out) and every local bound, on some path, from one of them."""
    bindings = [(set().union(*(_names_in(t) for t in ([n.target] if isinstance(n, (ast.For, ast.AnnAssign))
                                                       else n.targets))), n.iter if isinstance(n, ast.For) else n.value)
                for n in _own_nodes(func) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.For))
                and (n.iter if isinstance(n, ast.For) else n.value) is not None]
    return derived_names(bindings, {a.arg for a in (*func.args.args[1:], *func.args.kwonlyargs)},
                         lambda value, derived: bool(_names_in(value) & derived))


def _returned_self_call(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """``m`` where the body (its docstring aside) is the one statement ``return self.m(...)``."""
    body = _strip_docstring(func.body)
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        call = body[0].value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and _is_self(call.func.value):
            return call.func.attr
    return None


def _top_self_calls(body: list[ast.stmt], params: set[str]) -> set[str]:
    """``self.<m>(...)`` statements in ``body`` that run whenever the body does (through ``with``/``try``) and are
    given nothing of the call's own arguments ``params`` (``self._drain()``, not ``self._flush(meta.preempted)``)."""
    found: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
                and isinstance(stmt.value.func, ast.Attribute) and _is_self(stmt.value.func.value):
            given = set().union(*(_names_in(a) for a in (*stmt.value.args, *stmt.value.keywords)))
            if not given & params:
                found.add(stmt.value.func.attr)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            found |= _top_self_calls(stmt.body, params)
        elif isinstance(stmt, ast.Try):
            found |= _top_self_calls(stmt.body, params) | _top_self_calls(stmt.finalbody, params)
    return found


def _self_aliases(nodes: list[ast.AST]) -> dict[str, str]:
    """Locals bound to an object ``self`` holds: ``state = self.x.get(k)`` / ``self.x[k]`` / ``self.x.setdefault(k,
    ...)``, or ``state = self.x[k] = Obj()``. A task put into such an object (``state.tasks[key] = task``) is
    kept in ``self.x``; local -> ``x``."""
    aliases: dict[str, str] = {}
    for node in nodes:
        if not isinstance(node, ast.Assign):
            continue
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if not names:
            continue
        held = next((a for t in node.targets if isinstance(t, ast.Subscript) and (a := _self_attr(t))), None)
        value = node.value
        if held is None and isinstance(value, ast.Subscript):
            held = _self_attr(value)
        if held is None and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and value.func.attr in ("get", "setdefault") and isinstance(value.func.value, ast.Attribute) \
                and _is_self(value.func.value.value):
            held = value.func.value.attr
        if held is not None:
            for name in names:
                aliases[name] = held
    return aliases


def _kept_attr(node: ast.AST, aliases: Mapping[str, str]) -> str | None:
    """The ``self`` attribute an lvalue or a container expression lives in: ``self.x[...]`` -> ``x``, and through
    an alias (:func:`_self_aliases`) ``state.tasks[...]`` / ``state.tasks`` -> what ``state`` aliases."""
    direct = _self_attr(node)
    if direct:
        return direct
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return aliases.get(node.id) if isinstance(node, ast.Name) else None


def _note_replacing(target: ast.AST, value: ast.AST, fresh: set[str]) -> tuple[str, frozenset[str]] | None:
    """``self.x[key] = <task>`` keeps one task per key, ``self.x = <task>`` one in all: a later submit replaces
    the earlier task. The attribute and the names the key reads (none for a plain attribute); None when the
    key is fresh each time (``next(counter)``, or a local bound only to one: ``fresh``) or the new value is
    built from the old one (``self.x = self.x + [task]``)."""
    if isinstance(target, ast.Attribute) and _is_self(target.value):
        if any(_self_attr(n) == target.attr for n in ast.walk(value)):
            return None
        return target.attr, frozenset()
    if not (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
            and _is_self(target.value.value)) or _fresh_key(target.slice, fresh):
        return None
    return target.value.attr, frozenset(_names_in(target.slice))


def _self_helper_args(call: ast.AST, names: set[str], nodes: Sequence[ast.AST],
                      parents: Mapping[ast.AST, ast.AST]) -> set[tuple[str, int | str]]:
    """Where a submit's task (the call itself, or a local in ``names`` holding it) is an argument of a
    ``self.<m>(...)`` call: (m, position after ``self``, or the keyword)."""
    found: set[tuple[str, int | str]] = set()
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_self(node.func.value)):
            continue
        for index, arg in enumerate(node.args):
            if _holds(arg, call, names):
                found.add((node.func.attr, index))
        for keyword in node.keywords:
            if keyword.arg and _holds(keyword.value, call, names):
                found.add((node.func.attr, keyword.arg))
    return found


def _holds(arg: ast.AST, call: ast.AST, names: set[str]) -> bool:
    return any(n is call for n in ast.walk(arg)) or bool(_names_in(arg) & names)


def _fresh_key(key: ast.AST, fresh: set[str]) -> bool:
    """A key new each time: ``next(counter)`` in it, or a local bound only to one (``fresh``)."""
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "next" for n in ast.walk(key)):
        return True
    return isinstance(key, ast.Name) and key.id in fresh


def _note_aliased_replacing(target: ast.AST, aliases: Mapping[str, str],
                            fresh: set[str]) -> tuple[str, frozenset[str]] | None:
    """``state.tasks[key] = <task>``, ``state`` an object ``self.x`` holds: one task per key of that object's
    table, lost when the key comes again (the attribute is ``x``)."""
    if not isinstance(target, ast.Subscript) or _self_attr(target):
        return None
    attr = _kept_attr(target, aliases)
    if attr is None or _fresh_key(target.slice, fresh):
        return None
    return attr, frozenset(_names_in(target.slice))


#: Builtins that iterate a generator argument to its end.
CONSUMING_CALLS = frozenset({"sum", "min", "max", "list", "set", "tuple", "sorted", "dict", "frozenset", "deque"})


def _emptiness_test(test: ast.expr) -> bool:
    """Is ``test`` only "the container is (not) empty": ``x``, ``self.x``, ``not x``, ``len(x)``, ``len(x) > 0``,
    ``x.empty()``, ``x.qsize()``?"""
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if isinstance(test, (ast.Name, ast.Attribute, ast.Subscript)):
        return True
    if isinstance(test, ast.Call) and _func_name(test) in ("len", "empty", "qsize") and len(test.args) <= 1:
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant) \
            and test.comparators[0].value in (0, 1):
        return _emptiness_test(test.left)
    return False


def _loop_exits(loop: ast.For | ast.While) -> list[ast.stmt]:
    """The ``break``s of this loop and the ``return``s anywhere in its body (nested loops' breaks excluded)."""
    found: list[ast.stmt] = []
    pending: list[ast.AST] = [*loop.body]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return) or isinstance(node, ast.Break):
            found.append(node)
        if isinstance(node, (ast.For, ast.While)):
            pending += [r for stmt in [*node.body, *node.orelse] for r in ast.walk(stmt) if isinstance(r, ast.Return)]
            pending += node.orelse
            continue
        pending += list(ast.iter_child_nodes(node))
    return found


def _leaves_loop(loop: ast.For | ast.While) -> bool:
    return bool(_loop_exits(loop))


def _drains_while(loop: ast.While) -> bool:
    """A ``while`` that runs until its container is empty: ``while x:`` (any exit only on emptiness), or
    ``while True:`` whose every exit sits under an emptiness test or in an ``except`` (``queue.Empty``)."""
    if isinstance(loop.test, ast.Constant) and loop.test.value is True:
        parents = {c: n for n in ast.walk(loop) for c in ast.iter_child_nodes(n)}
        for exit_ in _loop_exits(loop):
            up, ok = parents.get(exit_), False
            while up is not None and up is not loop:
                if isinstance(up, ast.ExceptHandler) or (isinstance(up, ast.If) and _emptiness_test(up.test)):
                    ok = True
                    break
                up = parents.get(up)
            if not ok:
                return False
        return True
    if _until_done_test(loop.test):
        return not _loop_exits(loop)  # ``while not fut.done(): wait(...)``: runs until the task has ended
    if not _emptiness_test(loop.test):
        return False
    container = _tested_container(loop.test)
    parents = {c: n for n in ast.walk(loop) for c in ast.iter_child_nodes(n)}
    return all(_after_full_pass(exit_, parents, container) for exit_ in _loop_exits(loop))


def _until_done_test(test: ast.expr) -> bool:
    """``not x.done()``, ``not x.is_set()``, ``not store.check(t)``: a loop on it runs until the task has ended."""
    return isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Call) \
        and _call_name(test.operand) in ("done", "is_set", "check")


def _tested_container(test: ast.expr) -> str:
    while isinstance(test, ast.UnaryOp):
        test = test.operand
    if isinstance(test, ast.Compare):
        test = test.left
    if isinstance(test, ast.Call):
        test = test.args[0] if test.args else test.func.value if isinstance(test.func, ast.Attribute) else test
    return ast.unparse(test)


def _after_full_pass(exit_: ast.stmt, parents: Mapping[ast.AST, ast.AST], container: str) -> bool:
    """Does ``exit_`` follow, in its own block, a ``for`` loop over the whole ``container`` the ``while``
    tests (``while pending: ... for t in pending: wait(t); break``): every entry was waited before it leaves?"""
    block_owner = parents.get(exit_)
    if block_owner is None:
        return False
    for field in ("body", "orelse", "finalbody"):
        block = getattr(block_owner, field, None)
        if isinstance(block, list) and exit_ in block:
            earlier = block[:block.index(exit_)]
            return any(isinstance(stmt, ast.For) and ast.unparse(stmt.iter) == container and not _loop_exits(stmt)
                       for stmt in earlier)
    return False


#: calls that take entries out of the container a loop walks (``_removed_attrs``); ``_REMOVING_CALLS`` above
#: is the tracking-set reading (``clear`` and the in-place set differences too)
_ENTRY_REMOVING_CALLS = frozenset({"remove", "pop", "discard", "popleft", "popitem"})
_SNAPSHOT_CALLS = frozenset({"list", "tuple", "sorted", "set", "frozenset", "dict", "copy", "deepcopy"})


def _removed_attrs(loop: ast.For) -> set[str]:
    """``self`` attributes the loop's body removes entries from (``self.x.remove(e)``, ``del self.x[k]``)."""
    found: set[str] = set()
    for stmt in loop.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and _call_name(node) in _ENTRY_REMOVING_CALLS:
                attr = _self_attr(node.func.value)  # type: ignore[attr-defined]
                if attr:
                    found.add(attr)
            elif isinstance(node, ast.Delete):
                found.update(a for a in (_self_attr(t) for t in node.targets if isinstance(t, ast.Subscript)) if a)
    return found


def _live_iterable(iterable: ast.expr, mutated: set[str]) -> bool:
    """May ``iterable`` walk one of the ``mutated`` containers itself (not a copy): ``self.x``, its ``items()``
    / ``values()`` / ``keys()``, a generator over it, or a ``self`` helper's result (which may be either)?"""
    if isinstance(iterable, (ast.ListComp, ast.SetComp, ast.DictComp, ast.List, ast.Tuple, ast.Set)):
        return False
    if isinstance(iterable, ast.Call) and _func_name(iterable) in _SNAPSHOT_CALLS:
        return False
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) and _is_self(iterable.func.value):
        return True  # ``for e in self._pick(meta)``: a list, or a generator over the table being emptied
    if isinstance(iterable, ast.Call) and _call_name(iterable) in ("items", "values", "keys"):
        iterable = iterable.func.value  # type: ignore[attr-defined]
    if isinstance(iterable, ast.GeneratorExp):
        return any(_self_attr(g.iter) in mutated for g in iterable.generators)
    return _self_attr(iterable) in mutated


def _requires_poll(test: ast.expr) -> bool:
    """Does ``test`` hold only where a store poll (``check``/``done``) said the task ended? A poll that one side
    of an ``or`` can bypass does not: ``if not only_ended or store.check(t): wait(t)`` blocks on every task when
    ``only_ended`` is False (UCMStyleLayerWiseConnector, fourteenth blind round: a drain mixin passing
    ``only_ended=False`` was read as the poll of ended tasks it is with True)."""
    if isinstance(test, ast.Call):
        return _call_name(test) in ("check", "done")
    if isinstance(test, ast.BoolOp):
        if isinstance(test.op, ast.And):
            return any(_requires_poll(v) for v in test.values)
        return all(_requires_poll(v) for v in test.values)
    if isinstance(test, ast.NamedExpr):
        return _requires_poll(test.value)
    return False


def _stops_short(iterable: ast.expr) -> bool:
    """An iterable that may end before the collection it walks: ``zip`` (not ``strict=True``), ``islice``, a slice."""
    if isinstance(iterable, ast.Call) and _func_name(iterable) == "zip":
        return not any(k.arg == "strict" and isinstance(k.value, ast.Constant) and k.value.value is True
                       for k in iterable.keywords) and len(iterable.args) > 1
    if isinstance(iterable, ast.Call) and _func_name(iterable) in ("islice", "takewhile"):
        return True
    return isinstance(iterable, ast.Subscript) and isinstance(iterable.slice, ast.Slice)


def _ancestors(node: ast.AST, parents: Mapping[ast.AST, ast.AST]) -> set[ast.AST]:
    found, up = set(), parents.get(node)
    while up is not None:
        found.add(up)
        up = parents.get(up)
    return found


def _under_condition(node: ast.AST, parents: Mapping[ast.AST, ast.AST], shared: set[ast.AST] = frozenset()) -> bool:  # type: ignore[assignment]
    """Is ``node`` inside an ``if``/``while``/conditional expression's branch of its function, other than those in
    ``shared`` (the conditions the submit it waits is under too: ``if is_save: t = dump(...); wait(t)``)?
    A test that only checks the wait's own result (``if store.wait(t) != 0``) does not count: the wait runs."""
    child, up = node, parents.get(node)
    while up is not None:
        if up in shared:
            child, up = up, parents.get(up)
            continue
        if isinstance(up, (ast.If, ast.While, ast.IfExp)) and child is not up.test:
            return True
        if isinstance(up, (ast.BoolOp,)) and child is not up.values[0]:
            return True  # ``a and wait(t)``: short-circuited
        child, up = up, parents.get(up)
    return False


def _task_flow(func: ast.FunctionDef | ast.AsyncFunctionDef) -> TaskFlow:
    """Follow store tasks through one body: which are waited here, which are kept on ``self``."""
    nodes = list(_own_nodes(func))
    submits = [n for n in nodes if _call_name(n) in STORE_SUBMITS]
    if not submits and not any(isinstance(n, ast.For) for n in nodes):
        return TaskFlow()
    parents: dict[ast.AST, ast.AST] = {}
    for node in nodes:
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    holders: dict[ast.AST, set[str]] = {}  # submit call -> local names that hold it (or a list of it)
    kept: set[str] = set()
    replacing_of: dict[ast.AST, set[tuple[str, frozenset[str]]]] = {}  # submit call -> where it replaces a task
    bindings: dict[str, list[ast.expr]] = {}
    for node in nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bindings.setdefault(target.id, []).append(node.value)
    fresh = {name for name, values in bindings.items() if all(
        isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "next" for v in values)}
    aliases = _self_aliases(nodes)
    for call in submits:
        names: set[str] = set()
        node: ast.AST = call
        while True:  # climb through wrapping constructors / tuples to the statement that stores it
            parent = parents.get(node)
            if isinstance(parent, (ast.Call, ast.Tuple, ast.List, ast.keyword, ast.Dict)) and not (
                isinstance(parent, ast.Call) and _call_name(parent) in STORE_WAITS | {"append", "extend", "add"}
            ):
                node = parent
                continue
            break
        parent = parents.get(node)
        if isinstance(parent, (ast.Assign, ast.AnnAssign)):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif _self_attr(target):
                    kept.add(_self_attr(target))  # type: ignore[arg-type]
                    note = _note_replacing(target, parent.value, fresh)  # type: ignore[arg-type]
                    if note:
                        replacing_of.setdefault(call, set()).add(note)
                elif _kept_attr(target, aliases):
                    kept.add(_kept_attr(target, aliases))  # type: ignore[arg-type]
                    note = _note_aliased_replacing(target, aliases, fresh)
                    if note:
                        replacing_of.setdefault(call, set()).add(note)
        elif isinstance(parent, ast.Call) and _call_name(parent) in {"append", "extend", "add"}:
            holder = parent.func.value  # type: ignore[attr-defined]
            if isinstance(holder, ast.Name) and holder.id not in aliases:
                names.add(holder.id)
            elif _kept_attr(holder, aliases):
                kept.add(_kept_attr(holder, aliases))  # type: ignore[arg-type]
        holders[call] = names
    # a local holding a task, appended or assigned to ``self``: kept beyond the call
    for node in nodes:
        if isinstance(node, ast.Call) and _call_name(node) in {"append", "extend", "add", "__setitem__"}:
            holder = _kept_attr(node.func.value, aliases)  # type: ignore[attr-defined]
            used = set().union(*(_names_in(a) for a in node.args)) if node.args else set()
            if holder and any(used & names for names in holders.values()):
                kept.add(holder)
            elif isinstance(node.func.value, ast.Name):  # type: ignore[attr-defined]
                for names in holders.values():  # a local list collecting the task: it holds it too
                    if used & names:
                        names.add(node.func.value.id)  # type: ignore[attr-defined]
        elif isinstance(node, ast.Assign) and any(_kept_attr(t, aliases) for t in node.targets):
            if any(_names_in(node.value) & names for names in holders.values()):
                kept.update(a for a in (_kept_attr(t, aliases) for t in node.targets) if a)
                notes = {n for n in (_note_replacing(t, node.value, fresh) or _note_aliased_replacing(t, aliases, fresh)
                                     for t in node.targets) if n}
                for call, names in holders.items():
                    if notes and _names_in(node.value) & names:
                        replacing_of.setdefault(call, set()).update(notes)
    # locals that alias a holder: ``for t in tasks`` / ``x = tasks[i]``
    for node in nodes:
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            for call, names in holders.items():
                if _names_in(node.iter) & names:
                    names.add(node.target.id)
    # a wait under a condition (``if self._sync: wait(t)``) may not run: the task it names is not waited here
    all_waits = [n for n in nodes if _call_name(n) in STORE_WAITS]

    def wait_args(wait: ast.AST) -> set[str]:
        return set().union(*(_names_in(a) for a in wait.args)) if wait.args else set()  # type: ignore[attr-defined]
    waited = waited_if = 0
    replaced: set[tuple[str, frozenset[str]]] = set()
    passed: set[tuple[str, int | str]] = set()
    for call, names in holders.items():
        shared = _ancestors(call, parents)
        waits = [w for w in all_waits if not _under_condition(w, parents, shared)]
        waited_args = [wait_args(w) for w in waits]
        maybe_args = [wait_args(w) for w in all_waits if w not in waits]
        direct = isinstance(parents.get(call), ast.Call) and _call_name(parents.get(call)) in STORE_WAITS
        if direct or any(names & args for args in waited_args):
            waited += 1
        else:  # a task waited in the same call is not lost when a later one takes its place
            replaced |= replacing_of.get(call, set())
            passed |= _self_helper_args(call, names, nodes, parents)
            if any(names & args for args in maybe_args):
                waited_if += 1
    waits_each: set[str] = set()
    stops_early: set[str] = set()
    drains: set[str] = set()
    taken = _taken_entries(nodes)
    for node in nodes:
        if not (isinstance(node, ast.For) and isinstance(node.target, (ast.Name, ast.Tuple))):
            continue
        loop_vars = _names_in(node.target)
        body_nodes = [n for stmt in node.body for n in ast.walk(stmt)]
        attr = _iterated_attr(node.iter) or (taken.get(node.iter.id) if isinstance(node.iter, ast.Name) else None)
        waited_entries = [n for n in body_nodes if _call_name(n) in STORE_WAITS
                          and set().union(*(_names_in(a) for a in n.args)) & loop_vars]  # type: ignore[attr-defined]
        if not waited_entries:
            continue
        # ``for name in anything: wait(self.x[name])`` waits the entries of ``self.x`` too
        keyed = {a for w in waited_entries for arg in w.args  # type: ignore[attr-defined]
                 if isinstance(arg, ast.Subscript) and _names_in(arg.slice) & loop_vars and (a := _self_attr(arg))}
        attrs = ({attr} if attr else set()) | keyed
        if not attrs:
            continue
        waits_each |= attrs
        # a break/return, or a try around the loop whose handler swallows a failed wait, ends it early
        # (or a ``with`` around it whose ``__exit__`` may swallow the error a ``raise`` in the body ends it with:
        # GuardedLayerConnector, sixteenth blind round, raised on a failed layer wait inside ``with _Settling():``,
        # whose ``__exit__`` returns True, then cleared the other layers' tasks)
        swallowed = False
        raises = any(isinstance(n, ast.Raise) for n in body_nodes)
        child, up = node, parents.get(node)
        while up is not None:
            if isinstance(up, ast.Try) and up.handlers and child in up.body:
                swallowed = True
            if raises and isinstance(up, (ast.With, ast.AsyncWith)) and child in up.body:
                swallowed = True
            child, up = up, parents.get(up)
        if swallowed or any(isinstance(n, (ast.Break, ast.Return)) for n in body_nodes):
            stops_early |= attrs
        guarded = any(isinstance(n, (ast.If, ast.While, ast.IfExp)) for n in body_nodes)
        up = parents.get(node)
        while up is not None and not guarded:
            # an enclosing loop over anything but the same entries selects which entries are waited
            # (``for r in meta.preempted: for t in self.x.pop(r): wait(t)`` waits the preempted ones only)
            guarded = isinstance(up, (ast.If, ast.While, ast.ExceptHandler)) or (
                isinstance(up, ast.For) and _iterated_attr(up.iter) not in attrs)
            up = parents.get(up)
        if not guarded and not any(
            isinstance(n, ast.If) and n.body and isinstance(n.body[-1], (ast.Return, ast.Raise))
            for n in nodes if nodes.index(n) < nodes.index(node)
        ):
            drains |= attrs
    clears: set[str] = set()
    for node in nodes:
        if _call_name(node) == "clear" and _self_attr(node.func.value):  # type: ignore[attr-defined]
            clears.add(_self_attr(node.func.value))  # type: ignore[arg-type,attr-defined]
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Dict)) and not (
            node.value.elts if isinstance(node.value, ast.List) else node.value.keys
        ):
            clears.update(a for a in (_self_attr(t) for t in node.targets) if a)
        elif isinstance(node, ast.Delete):
            clears.update(a for a in (_self_attr(t) for t in node.targets) if a)
    return TaskFlow(len(submits), waited, frozenset(kept), frozenset(waits_each), frozenset(stops_early),
                    frozenset(clears), frozenset(drains), frozenset(replaced), waited_if, frozenset(passed))


@dataclass
class _ClassExprScope:
    """What a class-valued expression may refer to: module-level registries (``{"a": A}``), the class's own
    factory methods (``def inner_class(...): return A``) and the function's local names."""

    registries: dict[str, tuple[str, ...]]
    factories: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]
    local_classes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    depth: int = 0
    unresolved: set[str] = field(default_factory=set)  # self attrs assigned from a call naming no class


def _class_names_of(expr: ast.expr, scope: _ClassExprScope) -> tuple[str, ...] | None:
    """The classes an expression can evaluate to, or None when it is not recognisably a class.

    Understands ``A``, ``m.A``, ``a if c else b``, a local bound to those, ``REGISTRY[key]`` and
    ``REGISTRY.get(key, A)`` for a module-level dict of classes, and ``self.factory(...)`` for a method of
    the class whose returns are such expressions.
    """
    if isinstance(expr, ast.IfExp):
        body = _class_names_of(expr.body, scope)
        orelse = _class_names_of(expr.orelse, scope)
        return None if body is None or orelse is None else body + orelse
    if isinstance(expr, ast.Name) and expr.id in scope.local_classes:
        return scope.local_classes[expr.id]
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):
        return scope.registries.get(expr.value.id)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        owner = expr.func.value
        if isinstance(owner, ast.Name) and owner.id in scope.registries and expr.func.attr == "get":
            default = _class_names_of(expr.args[1], scope) if len(expr.args) > 1 else ()
            return None if default is None else scope.registries[owner.id] + default
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls") and expr.func.attr in scope.factories:
            return _factory_returns(scope.factories[expr.func.attr], scope)
        return None
    dotted = _dotted(expr)
    if dotted is None or dotted.split(".")[0] in ("self", "cls"):
        return None
    return (_simple(dotted),) if _simple(dotted)[:1].isupper() else None


def _factory_returns(
    func: ast.FunctionDef | ast.AsyncFunctionDef, scope: _ClassExprScope
) -> tuple[str, ...] | None:
    if scope.depth > 3:
        return None
    inner = _ClassExprScope(scope.registries, scope.factories, {}, scope.depth + 1)
    names: list[str] = []
    returns = [n for n in _own_nodes(func) if isinstance(n, ast.Return) and n.value is not None]
    for ret in returns:
        found = _class_names_of(ret.value, inner)  # type: ignore[arg-type]
        if found is None:
            return None
        names.extend(found)
    return tuple(names) if names else None


def _inner_assignments(
    func: ast.FunctionDef | ast.AsyncFunctionDef, tracking_attr: TrackingAttrs, scope: _ClassExprScope
) -> dict[str, tuple[str, ...]]:
    """Which classes ``__init__`` may instantiate into each ``self.<attr>`` (every branch counts); an attribute
    assigned from something unrecognisable is simply absent (the judge then says the inner is unknown)."""
    assigned: dict[str, list[str]] = {}
    for node in _own_nodes(func):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Name):
                names = _class_names_of(node.value, scope)
                if names is not None:
                    scope.local_classes[target.id] = scope.local_classes.get(target.id, ()) + names
            elif isinstance(target, ast.Attribute) and _is_self(target.value) and target.attr not in _attr_set(tracking_attr):
                if isinstance(node.value, ast.Call):
                    names = _class_names_of(node.value.func, scope)
                    if names is not None:
                        assigned.setdefault(target.attr, []).extend(names)
                    else:
                        scope.unresolved.add(target.attr)
    return {attr: tuple(dict.fromkeys(names)) for attr, names in assigned.items()}


def _module_registries(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    """Module-level ``NAME = {key: Class, ...}`` dicts (a common way to pick a connector variant)."""
    registries: dict[str, tuple[str, ...]] = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(stmt.value, ast.Dict):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            values = [_dotted(v) for v in stmt.value.values]
            if values and all(v is not None and _simple(v)[:1].isupper() for v in values):
                for target in targets:
                    if isinstance(target, ast.Name):
                        registries[target.id] = tuple(_simple(v) for v in values if v is not None)
    return registries


def _module_classes(body: Iterable[ast.stmt]) -> Iterator[ast.ClassDef]:
    """Top-level classes, including those under module-level ``if``/``try``/``with`` blocks."""
    for stmt in body:
        if isinstance(stmt, ast.ClassDef):
            yield stmt
        elif isinstance(stmt, (ast.If, ast.With, ast.AsyncWith)):
            yield from _module_classes(stmt.body)
            yield from _module_classes(getattr(stmt, "orelse", []))
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            for block in (stmt.body, stmt.orelse, stmt.finalbody):  # type: ignore[attr-defined]
                yield from _module_classes(block)
            for handler in stmt.handlers:  # type: ignore[attr-defined]
                yield from _module_classes(handler.body)


def _bound_names(stmt: ast.stmt) -> list[str]:
    """The names a class-body statement (re)binds: a def or class, an import, and every name stored anywhere in
    any other statement (tuple targets, loops, ``with ... as``, defs nested in an ``if``)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    return ([n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
            + [d.name for d in ast.walk(stmt) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))])


#: Calls whose result holds no code of its own that could start a transfer: containers, synchronisation
#: primitives, loggers, numbers and strings (``torch.*`` / ``numpy`` results are tensors and arrays, likewise).
INERT_FACTORIES = frozenset({
    "dict", "list", "set", "frozenset", "tuple", "deque", "defaultdict", "OrderedDict", "Counter", "ChainMap",
    "Lock", "RLock", "Condition", "Event", "Semaphore", "BoundedSemaphore", "Barrier", "Queue", "SimpleQueue",
    "LifoQueue", "PriorityQueue", "WeakValueDictionary", "WeakKeyDictionary", "WeakSet", "getLogger",
    "init_logger", "int", "float", "str", "bool", "bytes", "bytearray", "len", "max", "min", "sum", "sorted",
    "count", "field", "object", "monotonic", "perf_counter", "time", "time_ns", "getenv", "get_from_extra_config",
})
_INERT_MODULES = ("torch.", "np.", "numpy.", "math.", "os.environ", "time.")


def value_kind(value: ast.expr) -> list[str]:
    """What a value assigned to ``self.<attr>`` holds, for telling helper objects from plain data:
    ``inert`` (a literal, container, primitive, tensor or number), ``class:<Name>`` (an instance of a class
    called by name), ``alias:<attr>`` (another ``self`` attribute), ``opaque:<expr>`` (a parameter or the
    result of a call whose object is unknown). A conditional gives each branch's kind."""
    if isinstance(value, ast.IfExp):
        return [*value_kind(value.body), *value_kind(value.orelse)]
    if isinstance(value, ast.BoolOp):
        return [k for v in value.values for k in value_kind(v)]
    if isinstance(value, ast.Constant):
        return [] if value.value is None else ["inert"]
    if isinstance(value, (ast.JoinedStr, ast.List, ast.Dict, ast.Set, ast.Tuple, ast.ListComp, ast.DictComp,
                          ast.SetComp, ast.GeneratorExp, ast.BinOp, ast.Compare, ast.UnaryOp, ast.Lambda,
                          ast.Subscript)):
        return ["inert"]
    if isinstance(value, ast.Attribute):
        if _is_self(value.value):
            return [f"alias:{value.attr}"]
        return ["inert"]  # a field read off a parameter or module (a config value)
    if isinstance(value, ast.Call):
        dotted = _dotted(value.func)
        if dotted is None:
            return [f"opaque:{ast.unparse(value.func)}()"]
        name = _simple(dotted)
        if name in INERT_FACTORIES or dotted.startswith(_INERT_MODULES):
            return ["inert"]
        if name[:1].isupper():
            return [f"class:{name}"]
        return [f"opaque:{dotted}()"]
    if isinstance(value, ast.Name):
        return [f"opaque:{value.id}"]
    return [f"opaque:{ast.unparse(value)}"]


def _attr_values(func: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[tuple[str, str], ...]:
    found: list[tuple[str, str]] = []
    for node in _own_nodes(func):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and _is_self(target.value):
                    found += [(target.attr, kind) for kind in value_kind(node.value)]
    return tuple(dict.fromkeys(found))


_COPYING_CALLS = _SNAPSHOT_CALLS | {"deque", "OrderedDict"}  # a new container holding the argument's entries


def _attr_transfers(func: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[tuple[str, str, str], ...]:
    """Where one ``self`` attribute is given another's entries (``MethodFacts.attr_transfers``). Why the three
    kinds: ``self.prev = list(self.cur); self.cur.clear()`` hands the step's tasks over, ``self.prev = self.cur;
    self.cur.clear()`` empties both names of one list (StepAliasConnector, thirteenth blind round), and
    ``self.prev, self.cur = self.cur, []`` hands the old list over and starts a new one."""
    pairs: list[tuple[ast.AST, ast.expr, int]] = []  # (target, value, line)
    emptied: dict[str, list[int]] = {}  # attr -> lines it is emptied in place
    rebound: dict[str, list[int]] = {}  # attr -> lines it is bound to a new value
    found: list[tuple[str, str, str]] = []
    for node in _own_nodes(func):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                        and len(target.elts) == len(node.value.elts):
                    pairs += [(t, v, node.lineno) for t, v in zip(target.elts, node.value.elts)]
                elif isinstance(node, ast.AugAssign):
                    source = _self_attr(node.value) if isinstance(node.value, ast.Attribute) else None
                    if source and _self_attr(target) and isinstance(target, ast.Attribute):
                        found.append((target.attr, source, "copy"))  # self.d += self.k
                else:
                    pairs.append((target, node.value, node.lineno))
                if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Slice) and _self_attr(target):
                    emptied.setdefault(_self_attr(target), []).append(node.lineno)  # self.k[:] = ...
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Slice) and _self_attr(target):
                    emptied.setdefault(_self_attr(target), []).append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            holder = _self_attr(node.func.value) if isinstance(node.func.value, ast.Attribute) else None
            if holder and node.func.attr == "clear":
                emptied.setdefault(holder, []).append(node.lineno)
            if holder and node.func.attr in ("extend", "update") and node.args \
                    and isinstance(node.args[0], ast.Attribute) and _self_attr(node.args[0]):
                found.append((holder, _self_attr(node.args[0]), "copy"))  # type: ignore[arg-type]
    pairs = [(t, v, line) for t, v, line in pairs if isinstance(t, ast.Attribute) and _is_self(t.value)]
    for target, _, line in pairs:
        rebound.setdefault(target.attr, []).append(line)  # type: ignore[attr-defined]
    for target, value, line in pairs:
        if isinstance(value, ast.Attribute) and _is_self(value.value):
            source = value.attr
            moved = any(later >= line for later in rebound.get(source, ())) and not emptied.get(source)
            found.append((target.attr, source, "moved" if moved else "alias"))
        elif isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Attribute) \
                and _is_self(value.args[0].value) and _func_name(value) in _COPYING_CALLS:
            found.append((target.attr, value.args[0].attr, "copy"))
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "copy" \
                and isinstance(value.func.value, ast.Attribute) and _is_self(value.func.value.value):
            found.append((target.attr, value.func.value.attr, "copy"))
    return tuple(dict.fromkeys(found))


def _read_class(
    node: ast.ClassDef, file: str, tracking_attr: TrackingAttrs, registries: dict[str, tuple[str, ...]],
    transparent: frozenset[str] = frozenset(), functions: dict[str, ast.FunctionDef] | None = None,
    value_equal: frozenset[str] = frozenset(),
) -> ClassFacts:
    bases: list[str] = []
    base_exprs: list[str] = []
    opaque: list[str] = []
    for base in node.bases:
        expr = base.value if isinstance(base, ast.Subscript) else base
        dotted = _dotted(expr)
        base_exprs.append(ast.unparse(base))
        if dotted is None:
            opaque.append(f"line {node.lineno}: base {ast.unparse(base)} is computed")
            bases.append(ast.unparse(base))
        else:
            bases.append(_simple(dotted))
    methods: dict[str, MethodFacts] = {}
    inner: dict[str, tuple[str, ...]] = {}
    unresolved: set[str] = set()
    defined: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}  # plain functions bound so far in the body
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            setter = next(
                (d.value.id for d in stmt.decorator_list
                 if isinstance(d, ast.Attribute) and d.attr == "setter" and isinstance(d.value, ast.Name)),
                None,
            )
            key = f"{setter}.setter" if setter else stmt.name
            methods[key] = _MethodReader(stmt, node.name, tracking_attr, transparent, value_equal).read()
            if stmt.name == "__init__":
                factories = {
                    f.name: f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
                scope = _ClassExprScope(registries, factories)
                inner = _inner_assignments(stmt, tracking_attr, scope)
                unresolved = scope.unresolved
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                if not (isinstance(target, ast.Name) and target.id in CONNECTOR_METHODS and stmt.value is not None):
                    continue
                source = stmt.value.id if isinstance(stmt.value, ast.Name) else None
                if source in defined:
                    # ``request_finished = _finish_common`` binds the function object this class body defined
                    # above: a subclass overriding ``_finish_common`` does not change it (no virtual lookup)
                    methods[target.id] = dataclasses.replace(
                        _MethodReader(defined[source], node.name, tracking_attr, transparent, value_equal).read(),
                        name=target.id)
                else:
                    methods[target.id] = MethodFacts(
                        name=target.id,
                        owner=node.name,
                        lineno=stmt.lineno,
                        body="code",
                        opaque=(f"line {stmt.lineno}: {target.id} is assigned ({ast.unparse(stmt.value)}), not def",),
                    )
        for name in _bound_names(stmt):
            defined.pop(name, None)  # rebound: no longer the plain function defined above
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and not stmt.decorator_list:
            defined[stmt.name] = stmt
    _apply_class_decorators(node, methods, functions or {}, tracking_attr, transparent, value_equal)
    bound, abstract = _abstract_bindings(node)
    return ClassFacts(
        name=node.name,
        file=file,
        lineno=node.lineno,
        bases=tuple(bases),
        base_exprs=tuple(base_exprs),
        methods=methods,
        inner_classes=inner,
        unresolved_inits=frozenset(unresolved),
        opaque=tuple(opaque),
        bound_names=bound,
        abstract_names=abstract,
        construct_hooks=_construct_hooks(node),
        constants=_class_constants(node),
    )


def _class_constants(node: ast.ClassDef) -> tuple[tuple[str, str], ...]:
    """See ``ClassFacts.constants``."""
    values: dict[str, str | None] = {}
    for stmt in node.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            try:
                literal: str | None = repr(ast.literal_eval(stmt.value))
            except ValueError:
                literal = None
            for target in targets:
                if isinstance(target, ast.Name):
                    values[target.id] = literal if len(targets) == 1 else None
                    continue
        for name in _bound_names(stmt):
            if not (isinstance(stmt, (ast.Assign, ast.AnnAssign)) and name in values):
                values[name] = None
    return tuple((name, value) for name, value in values.items() if value is not None)


#: Decorators that keep a function's ``__isabstractmethod__`` (abc.py: property and the method kinds copy it).
_ABSTRACT_KEEPING = frozenset({"abstractmethod", "property", "classmethod", "staticmethod", "abstractproperty"})


def _abstract_bindings(node: ast.ClassDef) -> tuple[frozenset[str], frozenset[str]]:
    """The names the class body binds, and those whose last binding is an ``@abstractmethod`` def whose other
    decorators keep it abstract: what Python's ABC check (``__abstractmethods__``) reads from this class."""
    last_abstract: dict[str, bool] = {}
    for stmt in node.body:
        decorators = [_simple(_dotted(d.func if isinstance(d, ast.Call) else d) or "")
                      for d in getattr(stmt, "decorator_list", [])]
        abstract = (isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and "abstractmethod" in decorators
                    and set(decorators) <= _ABSTRACT_KEEPING)
        for name in _bound_names(stmt):
            last_abstract[name] = abstract
    return frozenset(last_abstract), frozenset(n for n, a in last_abstract.items() if a)


def _construct_hooks(node: ast.ClassDef) -> tuple[str, ...]:
    hooks = [f"line {node.lineno}: metaclass {ast.unparse(k.value)}" for k in node.keywords if k.arg == "metaclass"]
    hooks += [f"line {d.lineno}: class decorator @{ast.unparse(d)}" for d in node.decorator_list
              if _simple(_dotted(d.func if isinstance(d, ast.Call) else d) or "") not in BENIGN_CLASS_DECORATORS]
    hooks += [f"line {s.lineno}: {s.name}" for s in node.body
              if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name in ("__init_subclass__", "__new__")]
    return tuple(hooks)


#: Class decorators that return the class as it is (or only add dunder/ordering methods).
BENIGN_CLASS_DECORATORS = frozenset({"dataclass", "total_ordering", "final", "unique", "runtime_checkable",
                                     "dataclass_transform", "frozen", "define", "s", "attrs"})


def _injected_methods(func: ast.FunctionDef) -> dict[str, ast.FunctionDef] | None:
    """The methods a module-level class decorator ``def deco(cls): ...; cls.m = f; ...; return cls`` puts on
    the class (``cls.m = f`` or ``setattr(cls, "m", f)`` with ``f`` a function it defines); None when its body
    does anything else to the class (or returns something else), which the reader does not follow."""
    if len(func.args.args) != 1 or func.decorator_list:
        return None
    cls = func.args.args[0].arg
    nested = {s.name: s for s in func.body if isinstance(s, ast.FunctionDef)}
    injected: dict[str, ast.FunctionDef] = {}
    for stmt in func.body:
        if isinstance(stmt, ast.FunctionDef) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Name) and stmt.value.id == cls:
            continue
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute) \
                and isinstance(stmt.targets[0].value, ast.Name) and stmt.targets[0].value.id == cls \
                and isinstance(stmt.value, ast.Name) and stmt.value.id in nested:
            injected[stmt.targets[0].attr] = nested[stmt.value.id]
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _dotted(stmt.value.func) == "setattr" \
                and len(stmt.value.args) == 3 and isinstance(stmt.value.args[0], ast.Name) \
                and stmt.value.args[0].id == cls and isinstance(stmt.value.args[1], ast.Constant) \
                and isinstance(stmt.value.args[2], ast.Name) and stmt.value.args[2].id in nested:
            injected[str(stmt.value.args[1].value)] = nested[stmt.value.args[2].id]
            continue
        return None
    return injected


def _apply_class_decorators(
    node: ast.ClassDef, methods: dict[str, MethodFacts], functions: dict[str, ast.FunctionDef],
    tracking_attr: TrackingAttrs, transparent: frozenset[str], value_equal: frozenset[str] = frozenset(),
) -> None:
    """Class decorators run after the class body and may add or replace methods. A module-level decorator
    whose whole work is ``cls.m = f`` is read: its functions become the class's methods (the innermost
    decorator first). Any other decorator (imported, parametrised, doing more) may have put anything on
    the class: every connector method of the class is then unknown, with the decorator named."""
    for decorator in reversed(node.decorator_list):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = _simple(_dotted(target) or "")
        if name in BENIGN_CLASS_DECORATORS or "register" in name.lower():
            continue  # returns the class unchanged (a registry records it)
        injected = _injected_methods(functions[name]) if name in functions and decorator is target else None
        if injected is not None:
            for method, func in injected.items():
                methods[method] = dataclasses.replace(
                    _MethodReader(func, node.name, tracking_attr, transparent, value_equal).read(), name=method)
            continue
        reason = (f"line {decorator.lineno}: the class decorator @{ast.unparse(decorator)} may add or replace "
                  "methods after the class body, and its work is not read")
        for method in CONNECTOR_METHODS:
            existing = methods.get(method)
            methods[method] = dataclasses.replace(existing, opaque=(*existing.opaque, reason)) if existing else \
                MethodFacts(name=method, owner=node.name, lineno=node.lineno, body="code", opaque=(reason,))


def _value_equal(node: ast.ClassDef) -> bool:
    """Do two different instances of this class compare equal (so a set keeps only the first)? A class that
    defines ``__eq__``, or a ``dataclass`` with a field left out of the comparison (``field(compare=False)``)."""
    if any(isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == "__eq__" for s in node.body):
        return True
    dataclass = any(_simple(_dotted(d.func if isinstance(d, ast.Call) else d) or "") == "dataclass"
                    for d in node.decorator_list)
    return dataclass and any(
        isinstance(s, ast.AnnAssign) and isinstance(s.value, ast.Call) and _func_name(s.value) == "field"
        and any(k.arg == "compare" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in s.value.keywords)
        for s in node.body)


def read_source(
    text: str, file: str = "<string>", tracking_attr: TrackingAttrs = DEFAULT_TRACKING_ATTR
) -> dict[str, ClassFacts]:
    """Classes defined at module level in one source text; a later definition of a name replaces an earlier one,
    as Python's module execution would."""
    try:
        tree = ast.parse(text, filename=file)
    except SyntaxError as exc:
        raise SourceParseError(f"{file}:{exc.lineno}: syntax error: {exc.msg}") from exc
    except ValueError as exc:  # e.g. null bytes
        raise SourceParseError(f"{file}: not Python source: {exc}") from exc
    classes: dict[str, ClassFacts] = {}
    registries = _module_registries(tree)
    transparent = frozenset(stmt.name for stmt in tree.body
                            if isinstance(stmt, ast.FunctionDef) and _transparent_decorator(stmt))
    functions = {stmt.name: stmt for stmt in tree.body if isinstance(stmt, ast.FunctionDef)}
    value_equal = frozenset(node.name for node in _module_classes(tree.body) if _value_equal(node))
    for node in _module_classes(tree.body):
        classes[node.name] = _read_class(node, file, tracking_attr, registries, transparent, functions, value_equal)
    misread = _misread_functions(functions)
    imported = _imported_names(tree)
    callbacks = {name: _parameter_calls(func) for name, func in functions.items()}
    for name, facts in list(classes.items()):
        methods = {m: _with_function_callbacks(
                       _with_misread_calls(_without_imported_receivers(method, imported), misread), callbacks)
                   for m, method in facts.methods.items()}
        if any(methods[m] is not method for m, method in facts.methods.items()):
            classes[name] = dataclasses.replace(facts, methods=methods)
    if builds_bounded_deque(tree):
        classes = {name: dataclasses.replace(facts, bounded_deques=True) for name, facts in classes.items()}
    log.debug("%s: %d classes", file, len(classes))
    return classes


def _parameter_calls(func: ast.FunctionDef) -> str:
    """The methods a module function calls on its parameters (``conn._dump(...)`` in ``def run_plan(conn, plan)``),
    sorted and comma-joined: where a connector hands itself to the function, the connector methods it may run."""
    params = {a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]}
    return ",".join(sorted({n.func.attr for n in ast.walk(func) if isinstance(n, ast.Call)
                            and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                            and n.func.value.id in params}))


def _with_function_callbacks(method: MethodFacts, callbacks: Mapping[str, str]) -> MethodFacts:
    """``method`` with each hand-off of ``self`` to a module function of its file given the methods that function
    calls on its parameters; a function defined elsewhere is left out (nothing of it is read)."""
    if not any(kind == "function" for kind, *_ in method.handoffs):
        return method
    handoffs = tuple((kind, what, callbacks.get(what, "") if kind == "function" else name, line)
                     for kind, what, name, line in method.handoffs
                     if kind != "function" or callbacks.get(what))
    return dataclasses.replace(method, handoffs=handoffs)


#: Builtins and standard containers whose result is plain data of their own class (``dict()``, ``sorted(x)``).
_DATA_CONSTRUCTORS = frozenset({"dict", "list", "set", "tuple", "frozenset", "sorted", "defaultdict", "OrderedDict",
                                "deque", "Counter", "len", "str", "int", "float", "bool", "range"})


def _value_calls(func: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    """Calls whose callee is a value, not a name the reader resolves: a parameter or a local the body binds
    (``step = self.table.get((state, event)); step(rec, span)``), an item (``self.ops[kind](r)``), a call's result
    (``self._pick()(r)``) or a lambda. A ``wait_for_save`` that tracks and submits its dumps through a table of
    lambdas showed no submit, and its class was judged with no dumps at all."""
    args = [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]
    bound = {a.arg for a in args[1:]} | {a.arg for a in (func.args.vararg, func.args.kwarg) if a is not None}
    bound |= {n.id for n in _own_nodes(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    found = []
    for node in _own_nodes(func):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func
        if isinstance(callee, ast.Name) and callee.id in bound \
                or isinstance(callee, (ast.Subscript, ast.Call, ast.Lambda)):
            found.append(f"line {node.lineno}: {ast.unparse(callee)}(...)")
    return tuple(found)


def _local_data(func: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    """Locals every binding of which is a literal or a builtin container's constructor (``saves = {}``,
    ``done = set(ids)``): their special methods are the builtin's. A parameter, a loop variable or any other
    binding (a call's result, an element) may be a helper."""
    other = {a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]}
    other |= {a.arg for a in (func.args.vararg, func.args.kwarg) if a is not None}
    plain_targets: dict[int, bool] = {}
    for node in _own_nodes(func):
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and value is not None:
            plain_targets[id(targets[0])] = isinstance(value, _LITERALS) or (
                isinstance(value, ast.Call) and _simple(_dotted(value.func) or "") in _DATA_CONSTRUCTORS)
    data: set[str] = set()
    for node in _own_nodes(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            (data if plain_targets.get(id(node), False) else other).add(node.id)
    return frozenset(data - other)


def _local_instances(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, set[str]]:
    """Locals the body binds to an instance of a class called by name (``batch = DumpBatch(store)``, ``with
    Scope(store) as scope``), each with every such class: a call on them is a call into that class."""
    found: dict[str, set[str]] = {}
    for node in _own_nodes(func):
        pairs: list[tuple[ast.expr, ast.expr]] = []
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            pairs.append((node.targets[0], node.value))
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            pairs.append((node.target, node.value))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            pairs += [(item.optional_vars, item.context_expr) for item in node.items if item.optional_vars is not None]
        for target, value in pairs:
            if isinstance(target, ast.Name) and isinstance(value, ast.Call):
                dotted = _dotted(value.func)
                if dotted is not None and _simple(dotted)[:1].isupper():
                    found.setdefault(target.id, set()).add(_simple(dotted))
    return found


#: Builtins whose result a loop may iterate that are plain collections or iterators over their arguments.
ITERATION_BUILTINS = frozenset({"sorted", "list", "set", "tuple", "range", "zip", "enumerate", "reversed", "dict",
                                "frozenset", "map", "filter", "iter"})
#: Receivers whose class is the literal's (a builtin's special methods, never a helper's).
_LITERALS = (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp, ast.SetComp, ast.DictComp,
             ast.GeneratorExp, ast.JoinedStr)

#: The special method each operator calls on its left operand (``a | b``: ``a.__or__``), in-place first for ``|=``.
_OPERATOR_METHODS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.BitOr: "or", ast.BitAnd: "and",
                     ast.BitXor: "xor", ast.LShift: "lshift", ast.RShift: "rshift", ast.Mod: "mod",
                     ast.FloorDiv: "floordiv", ast.Div: "truediv", ast.MatMult: "matmul", ast.Pow: "pow"}
_COMPARE_METHODS = {ast.Eq: "__eq__", ast.NotEq: "__ne__", ast.Lt: "__lt__", ast.LtE: "__le__", ast.Gt: "__gt__",
                    ast.GtE: "__ge__"}
#: Builtins that call one of their argument's special methods (``len(t)``: ``t.__len__``).
_BUILTIN_SPECIALS = {"len": ("__len__",), "bool": ("__bool__", "__len__"), "hash": ("__hash__",),
                     "next": ("__next__",), "reversed": ("__reversed__",), "abs": ("__abs__",)}


def _special_calls(node: ast.AST) -> list[tuple[ast.expr, str]]:
    """The special methods Python calls for ``node``'s own syntax, with the expression each is called on:
    subscripts (``__getitem__`` and a ``dict`` subclass's ``__missing__``, ``__setitem__``, ``__delitem__``),
    operators and augmented assignments, comparisons and ``in``, a truth test (``__bool__``, else ``__len__``)
    and builtins such as ``len``. Loops (``__iter__``) and ``with`` (``__enter__``/``__exit__``) have rules of
    their own."""
    found: list[tuple[ast.expr, str]] = []
    if isinstance(node, ast.Subscript):
        if isinstance(node.ctx, ast.Store):
            found.append((node.value, "__setitem__"))
        elif isinstance(node.ctx, ast.Del):
            found.append((node.value, "__delitem__"))
        else:
            found += [(node.value, "__getitem__"), (node.value, "__missing__")]
    elif isinstance(node, ast.AugAssign) and type(node.op) in _OPERATOR_METHODS:
        op = _OPERATOR_METHODS[type(node.op)]
        found += [(node.target, f"__i{op}__"), (node.target, f"__{op}__")]
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATOR_METHODS:
        op = _OPERATOR_METHODS[type(node.op)]
        found += [(node.left, f"__{op}__"), (node.right, f"__r{op}__")]
    elif isinstance(node, ast.Compare):
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            if isinstance(op, (ast.In, ast.NotIn)):
                found.append((right, "__contains__"))
            elif type(op) in _COMPARE_METHODS:
                found.append((left, _COMPARE_METHODS[type(op)]))
            left = right
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BUILTIN_SPECIALS \
            and len(node.args) == 1:
        found += [(node.args[0], special) for special in _BUILTIN_SPECIALS[node.func.id]]
    tests: list[ast.expr] = []
    if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
        tests.append(node.test)
    elif isinstance(node, ast.comprehension):
        tests += node.ifs
    elif isinstance(node, ast.BoolOp):
        tests += node.values
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        tests.append(node.operand)
    for test in tests:
        if not isinstance(test, (ast.BoolOp, ast.UnaryOp, ast.Compare, ast.Constant)):
            found += [(test, "__bool__"), (test, "__len__")]
    return found


#: Container methods that take one entry out of a container.
ITEM_GETTERS = frozenset({"pop", "get", "setdefault", "popitem", "popleft"})
#: Container methods whose result is a view or a copy of the container's own entries.
DICT_VIEWS = frozenset({"items", "keys", "values", "copy"})


#: Calls on another object that submit, wait or poll a store task.
_TASK_CALLS = STORE_SUBMITS | STORE_WAITS | {"check"}


def _acts_on_tasks(call: ast.Call) -> bool:
    """Does ``call`` wait, poll or submit a store task, or call a ``self`` method (which may)?"""
    func = call.func
    return isinstance(func, ast.Attribute) and (func.attr in _TASK_CALLS or _is_self(func.value))


_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _imported_names(tree: ast.Module) -> frozenset[str]:
    """Modules the file binds by ``import`` anywhere (``torch``, ``os``): a call on one of them (or on a name under
    one) is a call into that module. Names bound by ``from x import y`` may be objects, helpers included: kept."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).partition(".")[0] for a in node.names}
    return frozenset(names)


def _without_imported_receivers(method: MethodFacts, imported: frozenset[str]) -> MethodFacts:
    """``method`` without the loose calls on an imported module or a name under one (``torch.cuda.synchronize()``); a
    call's result (``make_table().set()``) or an item (``mod.TABLES[k].set()``) stays, whatever it comes from."""
    kept = tuple(c for c in method.loose_calls
                 if not (_DOTTED_NAME.fullmatch(c[0]) and c[0].partition(".")[0] in imported))
    return method if kept == method.loose_calls else dataclasses.replace(method, loose_calls=kept)


#: Part of every reason for a call whose store work includes a submit its name does not say (a helper's ``set`` or
#: ``flush``, a module's ``submit_all``): the tasks it submits are kept where the reader does not look, so the waits
#: it recognises elsewhere may never reach them, and a model run that passes proves nothing (the judge's rule).
HIDDEN_SUBMIT = "a submit made out of the reader's sight, whose tasks the waits it recognises may never reach"

#: Part of every reason for a call into a container subclass's own ``extend``/``pop``/``__setitem__``: which tasks it
#: keeps is not the builtin's, so the waits the reader recognises over that container may miss some; a model run that
#: passes proves nothing (the judge treats it as :data:`HIDDEN_SUBMIT`).
UNSEEN_KEEPING = "tasks kept or dropped out of the reader's sight, which the waits it recognises may never reach"


def named_store_acts(name: str) -> frozenset[str]:
    """What the reader takes a call named ``name`` to do to store tasks, whatever it calls."""
    acts = {"a store submit"} if name in STORE_SUBMITS else set()
    acts |= {"a store wait"} if name in STORE_WAITS else set()
    acts |= {"a store check"} if name == "check" else set()
    return frozenset(acts)


def _misread_functions(functions: Mapping[str, ast.FunctionDef]) -> dict[str, str]:
    """Module-level functions whose store work differs from what their names say (``submit_all`` that dumps, a
    ``wait`` that only polls), with what they do: the reader reads a plain call ``f(...)`` by its name alone. A
    function's work includes that of the module's functions it calls, and work handed to a thread or pool."""
    direct: dict[str, set[str]] = {}
    called: dict[str, set[str]] = {}
    for name, func in functions.items():
        acts: set[str] = set()
        callees: set[str] = set()
        for node in _own_nodes(func):
            if not isinstance(node, ast.Call):
                continue
            callee = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else None
            if callee is None:
                continue
            acts |= named_store_acts(callee)
            if callee in ASYNC_CALLS:
                acts.add("a hand-off to another thread or pool")
            if isinstance(node.func, ast.Name) and callee in functions and callee != name:
                callees.add(callee)
        direct[name], called[name] = acts, callees
    found: dict[str, str] = {}
    for name in functions:
        acts, seen, pending = set(direct[name]), {name}, list(called[name])
        while pending:
            callee = pending.pop()
            if callee not in seen:
                seen.add(callee)
                acts |= direct[callee]
                pending.extend(called[callee])
        if frozenset(acts) != named_store_acts(name):
            found[name] = ", ".join(sorted(acts)) or "no store work"
    return found


def _with_misread_calls(method: MethodFacts, misread: Mapping[str, str]) -> MethodFacts:
    """``method`` with a reason for each plain call to a module function whose work its name does not say."""
    names = sorted(n for n in method.plain_calls if n in misread)
    if not names:
        return method
    reasons = tuple(f"calls {n}(), a function of its module that does {misread[n]}, which the reader would read by "
                    f"its name ({', '.join(sorted(named_store_acts(n))) or 'no store work'})"
                    + (f" ({HIDDEN_SUBMIT})" if "a store submit" in misread[n] and n not in STORE_SUBMITS else "")
                    for n in names)
    return dataclasses.replace(method, opaque=(*method.opaque, *reasons))


#: Where a tracking set is written (the save path) and where it is consulted (the free decision, the report).
_TRACK_WRITERS = ("build_connector_meta", "wait_for_save", "save_kv_layer")
_TRACK_READERS = ("request_finished", "get_finished")


def discover_tracking_attrs(classes: dict[str, ClassFacts]) -> frozenset[str]:
    """``self`` attributes that behave as a tracking set, whatever their name or shape: written (``add``,
    ``update``, ``|=``, an item stored under a request or tuple key) on the save path and consulted in a
    decision (a membership test, ``&``/``-``, an ``if`` test, a filter) in ``request_finished`` or
    ``get_finished``, the helpers they call included (by name, within the class's own methods and those of
    every analysed class). Nothing is discovered where the code uses the PR's own name for the set."""
    if any(m.tracking_ops for c in classes.values() for m in c.methods.values()):
        return frozenset()  # read with the PR's name: that set is in use

    def reach(facts: ClassFacts, roots: Iterable[str]) -> list[MethodFacts]:
        seen: dict[str, MethodFacts] = {}
        todo = [r for r in roots if r in facts.methods]
        pool = {**{n: m for c in classes.values() for n, m in c.methods.items()}, **facts.methods}
        while todo:
            name = todo.pop()
            if name in seen or name not in pool:
                continue
            seen[name] = pool[name]
            todo.extend(pool[name].self_calls)
        return list(seen.values())

    found: set[str] = set()
    for facts in classes.values():
        written = {a for m in reach(facts, _TRACK_WRITERS) for a, ops in m.attr_ops if "add" in ops}
        consulted = {a for m in reach(facts, _TRACK_READERS) for a, ops in m.attr_ops if "test" in ops}
        found |= written & consulted
    return frozenset(found)


def source_files(paths: Iterable[Path | str]) -> list[Path]:
    """The files to read for what the user named: a file as it is, a folder as every ``*.py`` below it (sorted,
    ``__pycache__`` and hidden folders left out), so a connector package is judged by naming its folder."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted(p for p in path.rglob("*.py")
                       if not any(part == "__pycache__" or part.startswith(".") for part in p.relative_to(path).parts))
        if not found:
            raise SourceParseError(f"{path}: no Python files in this folder")
        files.extend(found)
    return list(dict.fromkeys(files))


def read_files(
    paths: Iterable[Path | str], tracking_attr: TrackingAttrs | None = None
) -> dict[str, ClassFacts]:
    """Classes of several files analysed together (a connector and the module its base lives in, say).
    ``tracking_attr`` names the tracking set; without it the default name and every attribute
    :func:`discover_tracking_attrs` finds by data flow are read as tracking sets."""
    paths = list(paths)
    if tracking_attr is None:
        first = _read_files(paths, DEFAULT_TRACKING_ATTR)
        found = discover_tracking_attrs(first)
        if not found - {DEFAULT_TRACKING_ATTR}:
            return first
        log.info("tracking sets found by data flow: %s", ", ".join(sorted(found)))
        return _read_files(paths, found | {DEFAULT_TRACKING_ATTR})
    return _read_files(paths, tracking_attr)


def _class_texts(text: str) -> dict[str, set[str]]:
    """Each class name of a module -> the structure of its definitions (``ast.dump``: no positions)."""
    texts: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            texts.setdefault(node.name, set()).add(ast.dump(node))
    return texts


def _read_files(paths: Iterable[Path | str], tracking_attr: TrackingAttrs) -> dict[str, ClassFacts]:
    """A class defined in two files is one class when both definitions are the same code (Dynamo's KVBM
    connector repeats its metadata class in the connector, leader and worker modules); otherwise which one a
    name means depends on imports the reader does not resolve, and it refuses."""
    merged: dict[str, ClassFacts] = {}
    defined: dict[str, set[str]] = {}
    for raw in paths:
        path = Path(raw)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SourceParseError(f"{path}: cannot read: {exc}") from exc
        classes = read_source(text, str(path), tracking_attr)
        texts = _class_texts(text)
        for name, facts in classes.items():
            if name in merged:
                if len(defined[name]) == 1 and texts.get(name) == defined[name]:
                    log.info("class %s: %s repeats the definition in %s; read once", name, path, merged[name].file)
                    continue
                raise DuplicateClassError(f"class {name} is defined in both {merged[name].file} and {path}")
            merged[name] = facts
            defined[name] = texts.get(name, set())
    return merged
