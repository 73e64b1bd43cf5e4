"""Store tasks a save hands to a ``self`` helper that drops them: the helper's parameter goes nowhere but into a copy
it discards, a log line, or nowhere at all.

``FrozenRecordStatsConnector`` (a blind round's) saves with ``self._record(rid, self.store.dump(...))``; its
``_record`` computes ``dataclasses.replace(rec, tasks=rec.tasks + (task,))`` and throws the result away, so the record
it stores never holds the task and nothing ever waits that dump. The reader follows a submit's task through one
body's locals (``TaskFlow``) and counts a task handed to a helper as kept, so the model's deferred dump was waited
where the class waits nothing. The facts (``task_handoffs``, ``dropped_params``) are read per definition by the
main reader (source.py); :func:`dropped_handoffs` resolves each helper as the class does."""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from deferdump.tools.mro.ast_helpers import called_name, is_self
from deferdump.tools.mro.task_holders import COPY_CALLS, READ_ONLY_CALLS

if TYPE_CHECKING:
    from deferdump.tools.mro.behaviour import EffectReader


def _submit(node: ast.AST, submits: frozenset[str]) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in submits


def task_handoffs(func: ast.FunctionDef | ast.AsyncFunctionDef, nodes: list[ast.AST],
                  submits: frozenset[str]) -> tuple[tuple[str, int | str, int], ...]:
    """(helper, position or keyword, line) for each ``self.<helper>(...)`` call given a store submit's task: the
    submit written in place, or a local every binding of which is a submit and which nothing else reads."""
    bindings: dict[str, list[ast.AST]] = {}  # a name's bound values; any binding but ``name = value`` counts as itself
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr, ast.For, ast.With)):
            plain = isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None
            whole = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in ast.walk(node):
                if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                    bound = node.value if plain and any(t is target for t in whole) else node
                    bindings.setdefault(target.id, []).append(bound)
    reads: dict[str, int] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
            reads[node.id] = reads.get(node.id, 0) + 1

    def holds_task(arg: ast.AST) -> bool:
        if _submit(arg, submits):
            return True
        return isinstance(arg, ast.Name) and reads.get(arg.id) == 1 and bool(bindings.get(arg.id)) \
            and all(_submit(value, submits) for value in bindings[arg.id])

    found = []
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_self(node.func.value)):
            continue
        for position, arg in enumerate(node.args):
            if holds_task(arg):
                found.append((node.func.attr, position, node.lineno))
        for keyword in node.keywords:
            if keyword.arg is not None and holds_task(keyword.value):
                found.append((node.func.attr, keyword.arg, node.lineno))
    return tuple(found)


def dropped_params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    """The parameters (after ``self``) that the body never lets out: every read sits in the arguments of a copy whose
    result is thrown away (a statement of its own) or of a call that only reads (a log line, ``len``), or there is
    none. A parameter bound anew, or read anywhere else (a store, a return, any other call, a test), is not one."""
    args = [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]
    params = {a.arg for a in args[1:]}
    parents = {child: node for node in ast.walk(func) for child in ast.iter_child_nodes(node)}
    dropped = set()
    for name in params:
        uses = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == name]
        if any(isinstance(n.ctx, ast.Store) for n in uses):
            continue
        if all(_discarded(use, parents, func) for use in uses):
            dropped.add(name)
    return frozenset(dropped)


def _discarded(use: ast.Name, parents: dict[ast.AST, ast.AST], func: ast.AST) -> bool:
    node: ast.AST = use
    while node is not func:
        parent = parents.get(node)
        if parent is None or isinstance(parent, (ast.Lambda, ast.comprehension)) \
                or isinstance(parent, ast.stmt) and not isinstance(parent, ast.Expr):
            return False
        if isinstance(parent, ast.Call) and node is not parent.func:
            callee = called_name(parent)
            if callee in READ_ONLY_CALLS:
                return True
            if callee in COPY_CALLS and isinstance(parents.get(parent), ast.Expr):
                return True
            return False  # handed to a call that may keep it
        if isinstance(parent, ast.Expr):
            return False  # read as a statement of its own, outside any call: not the shapes above
        node = parent
    return False


def dropped_handoffs(reader: "EffectReader", cls: str) -> tuple[str, ...]:
    """Why a pass proves nothing for ``cls``: its save path hands a store submit's task to a ``self`` helper (as
    ``cls`` resolves it) whose parameter goes nowhere (see :func:`dropped_params`). Nothing can wait that dump, where
    the model's deferred dumps are waited before their blocks are freed."""
    from deferdump.tools.mro.unreached_tasks import SAVE_PATH, reached_facts, resolved_method

    found = []
    for facts in reached_facts(reader, cls, SAVE_PATH):
        for helper, where, line in facts.task_handoffs:
            called = resolved_method(reader, cls, helper)
            if called is None:
                continue
            name = called.param_names[where] if isinstance(where, int) and where < len(called.param_names) else where
            if isinstance(name, str) and name in called.dropped_params:
                found.append(f"{facts.owner}.{facts.name} (line {line}) hands a store task to "
                             f"{called.owner}.{helper}(), whose parameter `{name}` goes only into a copy it discards, "
                             "a log line, or nowhere: nothing waits that dump, where the model's deferred dumps are "
                             "waited before their blocks are freed")
    return tuple(dict.fromkeys(found))
