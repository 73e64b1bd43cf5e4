"""Block tables a connector keeps across steps: where it extends one with vLLM's ``new_block_ids``, and whether a
resumed request's table is replaced instead.

vLLM 0.32 sends a running request's new blocks in ``CachedRequestData.new_block_ids``; for a request in
``resumed_req_ids`` the same field holds its whole new table (v1/core/sched/output.py ~138-150: "for those in the
set, new_block_ids will be used as the request's block IDs instead of appending"; scheduler.py ~1361 takes
``get_blocks`` of a resumed request and ~1729 adds it to ``resumed_req_ids``). A class that appends that field to
a table it kept from before the preemption reads block ids vLLM freed at the preemption (scheduler.py ~1589) and
may have handed to another request. The model's connector reads each request's current blocks, so a pass of the
model says nothing about such a table (the twenty-ninth blind round's ``ResumeAppendDumpConnector`` appends always;
``LegacyResumeFlagConnector`` decides the resume by ``resumed_from_preemption``, a field vLLM 0.32 does not have).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deferdump.tools.mro.ast_helpers import derived_names, self_call, self_container, target_names

if TYPE_CHECKING:  # the hierarchy is built from facts that hold this module's TableExtension
    from deferdump.tools.mro.hierarchy import Hierarchy

#: The field of vLLM 0.32's scheduler output holding a running request's new blocks (a resumed one's whole table).
NEW_BLOCKS_FIELD = "new_block_ids"

#: The field naming the requests whose ``new_block_ids`` is their whole table (vLLM 0.32's only resume marker).
RESUMED_FIELD = "resumed_req_ids"

#: Calls that add ids to a table in place.
_EXTENDING_CALLS = frozenset({"extend", "append"})


@dataclass(frozen=True)
class TableExtension:
    """``<table>.extend(<ids>)`` (or ``append``, ``+=``) on a table the call did not build, with ids read from
    ``source``: ``new_block_ids`` itself, or a parameter (a helper handed those ids).

    ``resume_tested``: a test on the way to it (an enclosing ``if``, or an earlier ``if`` around it) reads ``resumed_req_ids`` (or a local bound from it); ``tested_params``: the parameters such tests read (a
    resume flag handed in); ``helpers``: the ``self.<m>(...)`` helpers they call (the judge resolves them)."""

    line: int
    source: str
    root: str  # the name the table is reached from: ``self``, a local holding a ``self`` entry, or a parameter
    resume_tested: bool
    tested_params: frozenset[str]
    helpers: frozenset[str]


@dataclass(frozen=True)
class BlockCall:
    """``self.<helper>(...)`` handed ids read from ``new_block_ids``: ``block_args`` and ``resume_args`` are the
    positions (after ``self``) or keywords whose argument reads ``new_block_ids`` and ``resumed_req_ids``, and
    ``kept_args`` those that hold an entry of a ``self`` container;
    ``resume_tested`` and ``helpers`` as for :class:`TableExtension`, for the call itself."""

    helper: str
    line: int
    block_args: tuple[int | str, ...]
    resume_args: tuple[int | str, ...]
    kept_args: tuple[int | str, ...]  # arguments that are ``self`` entries (a request's kept record)
    resume_tested: bool
    helpers: frozenset[str]


def _reads_field(node: ast.AST, field: str | None, tainted: set[str]) -> bool:
    """Does ``node`` read ``field`` (``x.<field>``, ``getattr(x, "<field>")``) or a local bound from it? A name a
    comprehension inside ``node`` binds is that comprehension's own, whatever a local of the same name holds."""
    own = {n.id for sub in ast.walk(node) if isinstance(sub, ast.comprehension) for n in ast.walk(sub.target)
           if isinstance(n, ast.Name)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == field:
            return True
        if isinstance(sub, ast.Name) and sub.id in tainted and sub.id not in own:
            return True
        if isinstance(sub, ast.Constant) and sub.value == field:
            return True
    return False


def _tainted_names(nodes: list[ast.AST], field: str | None, seeds: frozenset[str] = frozenset(),
                   collecting: bool = True) -> set[str]:
    """Locals holding what ``field`` (or the names ``seeds``) holds: bound from it, looping over what holds it, or
    (``collecting``) a local list it is appended to. A comprehension's names are its own (``_reads_field``)."""
    bindings: list[tuple[set[str], ast.AST]] = []
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bindings.append((set().union(*(target_names(t) for t in targets)), node.value))
        elif isinstance(node, ast.For):
            bindings.append((target_names(node.target), node.iter))
        elif collecting and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("append", "extend", "insert", "add") \
                and isinstance(node.func.value, ast.Name) and node.args:
            bindings.append(({node.func.value.id}, node.args[-1]))  # a local list collecting it holds it too
    return derived_names(bindings, set(seeds), lambda value, found: _reads_field(value, field, found))


def _kept_roots(nodes: list[ast.AST]) -> set[str]:
    """Names that hold a table kept across calls: ``self`` and locals bound to an entry of a ``self`` container
    (``tracker = self._trackers.get(r)``, ``for r, t in self._tables.items()``)."""
    kept = {"self"}
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None \
                and self_container(node.value) is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            kept |= set().union(*(target_names(t) for t in targets))
        elif isinstance(node, ast.For) and self_container(node.iter) is not None:
            kept |= target_names(node.target)
    return kept


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _element_of(value: ast.expr, field: str | None, tainted: set[str], nodes: list[ast.AST], call: str) -> bool:
    """Is ``value`` ids themselves, not a record holding them? ``append`` takes one id: a name bound only by loops
    over the ids, or an entry of them (``ids[i]``); ``extend``/``+=`` take a list of ids: the ids, an entry of
    them, or ``list(...)``/``tuple(...)`` of either. A constructor's result (``SaveJob(r, ids)``) is a record."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("list", "tuple") \
            and len(value.args) == 1 and call != "append":
        value = value.args[0]
    if isinstance(value, (ast.Subscript, ast.Attribute)):  # ``ids[i]``, ``ids[a:b]``, ``req.new_block_ids[i]``
        root = _root(value)
        return isinstance(root, ast.Name) and _reads_field(value, field, tainted) \
            and (root.id in tainted or _reads_field(value, field, set()))
    if not isinstance(value, ast.Name) or not _reads_field(value, field, tainted):
        return False
    bindings = [n for n in nodes if isinstance(n, (ast.Assign, ast.AnnAssign, ast.For, ast.NamedExpr))
                and value.id in set().union(*(target_names(t) for t in (
                    [n.target] if isinstance(n, (ast.For, ast.AnnAssign, ast.NamedExpr)) else n.targets)))]
    return all(isinstance(n, ast.For) or isinstance(n.value, (ast.Subscript, ast.Attribute, ast.Name))
               for n in bindings)  # a parameter (no binding) is the ids handed in


def _self_helpers(test: ast.AST) -> set[str]:
    return {h for n in ast.walk(test) if (h := self_call(n)) is not None}


def _tests_on_the_way(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[ast.expr]:
    """The tests deciding whether, or on what, ``node`` runs: enclosing ``if``/``while``/conditional expressions,
    and the tests of earlier ``if`` statements of the blocks around it (``if resumed: self._t[r] = []`` before
    ``self._t[r].extend(ids)`` resets the table a resume would leave stale)."""
    tests: list[ast.expr] = []
    child, up = node, parents.get(node)
    while up is not None:
        if isinstance(up, (ast.If, ast.IfExp, ast.While)) and child is not up.test:
            tests.append(up.test)
        for field in ("body", "orelse"):
            block = getattr(up, field, None)
            if isinstance(block, list) and child in block:
                tests += [earlier.test for earlier in block[:block.index(child)] if isinstance(earlier, ast.If)]
        child, up = up, parents.get(up)
    return tests


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)][1:]


def table_extensions(func: ast.FunctionDef | ast.AsyncFunctionDef, nodes: list[ast.AST]) -> tuple[TableExtension, ...]:
    """Every in-place extension, in ``func`` (whose own nodes are ``nodes``), of a table the call did not build
    with ids read from ``new_block_ids`` or from a parameter, with the tests on the way to it."""
    params = _params(func)
    marked = _tainted_names(nodes, RESUMED_FIELD)
    kept = _kept_roots(nodes) | set(params)  # a parameter counts where a caller hands it a kept entry
    parents = {child: node for node in nodes for child in ast.iter_child_nodes(node)}
    found: list[TableExtension] = []
    for source in (NEW_BLOCKS_FIELD, *params):
        field, seeds = (source, frozenset()) if source == NEW_BLOCKS_FIELD else (None, frozenset({source}))
        tainted = _tainted_names(nodes, field, seeds)
        bound = _tainted_names(nodes, field, seeds, collecting=False)  # a table it extends is not the ids' own
        for node in nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _EXTENDING_CALLS and node.args \
                    and _element_of(node.args[0], field, tainted, nodes, node.func.attr):
                table: ast.AST = node.func.value
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) \
                    and _element_of(node.value, field, tainted, nodes, "extend"):
                table = node.target
            else:
                continue
            root = _root(table)
            if not isinstance(root, ast.Name) or root.id not in kept or root.id in bound - {"self"}:
                continue  # a list the call builds, or one of the ids' own lists: nothing old in it
            tests = _tests_on_the_way(node, parents)
            read = {n.id for t in tests for n in ast.walk(t) if isinstance(n, ast.Name)}
            found.append(TableExtension(node.lineno, source, root.id, any(_reads_field(t, RESUMED_FIELD, marked) for t in tests),
                                        frozenset(read & set(params)),
                                        frozenset().union(*(_self_helpers(t) for t in tests))))
    return tuple(dict.fromkeys(found))


def block_calls(func: ast.FunctionDef | ast.AsyncFunctionDef, nodes: list[ast.AST]) -> tuple[BlockCall, ...]:
    """Every ``self.<m>(...)`` call of ``func`` handed ids read from ``new_block_ids``."""
    tainted = _tainted_names(nodes, NEW_BLOCKS_FIELD)
    marked = _tainted_names(nodes, RESUMED_FIELD)
    kept = _kept_roots(nodes)
    parents = {child: node for node in nodes for child in ast.iter_child_nodes(node)}
    found: list[BlockCall] = []
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
            continue
        args: list[tuple[int | str, ast.expr]] = [(i, a) for i, a in enumerate(node.args)]
        args += [(k.arg, k.value) for k in node.keywords if k.arg is not None]
        blocks = tuple(at for at, a in args if _reads_field(a, NEW_BLOCKS_FIELD, tainted))
        if not blocks:
            continue
        tests = _tests_on_the_way(node, parents)
        found.append(BlockCall(node.func.attr, node.lineno, blocks,
                               tuple(at for at, a in args if _reads_field(a, RESUMED_FIELD, marked)),
                               tuple(at for at, a in args if isinstance(_root(a), ast.Name) and _root(a).id in kept
                                     or self_container(a) is not None),
                               any(_reads_field(t, RESUMED_FIELD, marked) for t in tests),
                               frozenset().union(*(_self_helpers(t) for t in tests))))
    return tuple(found)


def _reads_resume(hierarchy: "Hierarchy", cls: str, helpers: frozenset[str]) -> bool:
    """Does one of these ``self`` helpers, as ``cls`` resolves it, read ``resumed_req_ids``?"""
    for name in helpers:
        owner = hierarchy.lookup(cls, name)
        if owner is not None and not hierarchy.classes[owner].external:
            facts = hierarchy.method(owner, name)
            if RESUMED_FIELD in facts.words | facts.foreign_words:
                return True
    return False


def _stale(owner: str, name: str, line: int) -> str:
    return (f"{owner}.{name} line {line} extends a block table it keeps with ids from {NEW_BLOCKS_FIELD}, and no test "
            f"on the way reads {RESUMED_FIELD}: for a resumed request vLLM 0.32 sends the whole new table there "
            "(scheduler.py ~1361, ~1729), so the kept table goes on with ids freed at the preemption (~1589); the "
            "model's dumps read each request's current blocks")


def unreplaced_tables(hierarchy: "Hierarchy", cls: str) -> tuple[str, ...]:
    """Why a pass of the model proves nothing for ``cls``: a definition in its MRO extends a kept block table with
    ids from ``new_block_ids`` (itself, or through a ``self`` helper it hands them to, as ``cls`` resolves it) where
    no test on the way reads ``resumed_req_ids`` (itself, through a ``self`` helper, or through a parameter the
    caller fills from it). Every analysed definition is read, an overridden one too (``super()`` may reach it)."""
    why: list[str] = []
    for owner in hierarchy.mro[cls]:
        facts = hierarchy.classes[owner]
        if facts.external:
            continue
        for name, method in facts.methods.items():
            for ext in method.table_extensions:
                if ext.source == NEW_BLOCKS_FIELD and ext.root not in method.param_names and not ext.resume_tested \
                        and not _reads_resume(hierarchy, cls, ext.helpers):
                    why.append(_stale(owner, name, ext.line))
            for call in method.block_calls:
                if call.resume_tested or _reads_resume(hierarchy, cls, call.helpers):
                    continue
                callee = hierarchy.lookup(cls, call.helper)
                if callee is None or hierarchy.classes[callee].external:
                    continue
                helper = hierarchy.method(callee, call.helper)
                named = list(helper.param_names)
                def param(at: int | str) -> str | None:
                    return named[at] if isinstance(at, int) and at < len(named) else at if isinstance(at, str) else None
                blocks = {param(at) for at in call.block_args}
                resumed = {param(at) for at in call.resume_args}
                kept = {param(at) for at in call.kept_args}
                for ext in helper.table_extensions:
                    if (ext.root not in helper.param_names or ext.root in kept) \
                            and (ext.source in blocks or ext.source == NEW_BLOCKS_FIELD and ext.root in kept) \
                            and not ext.resume_tested and not ext.tested_params & resumed \
                            and not _reads_resume(hierarchy, cls, ext.helpers):
                        why.append(_stale(callee, call.helper, ext.line) + f" (handed them by {owner}.{name} line "
                                   f"{call.line})")
    return tuple(dict.fromkeys(why))
