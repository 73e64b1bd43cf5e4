"""Where a definition puts store tasks a helper returned, and which ``self`` containers its loops visit: the facts
the unreached-task rule (unreached_tasks.py) reads, kept out of the main reader (source.py) that calls these.

The reader's data flow of store tasks (``TaskFlow``) follows a submit's result through the locals of one body; a task
a ``self`` helper returns (``task = self._launch(order)``, whose body is ``return self._store.dump(...)``) and the
caller appends to ``self._background`` is kept there unseen (the twenty-ninth blind round's
``DetachedBackfillConnector``). These facts name the pairs (helper, container); the rule resolves the helper. A
submit whose task the body drops (``dropped_submits``) is held nowhere at all: the reader counts it as lost."""
from __future__ import annotations

import ast
from typing import Iterable

from deferdump.tools.mro.ast_helpers import loop_bodies, self_call, self_container

#: ``self.<a>.<m>(value)`` calls that put ``value`` into the container ``a``.
_FILLING = frozenset({"append", "appendleft", "extend", "insert", "add", "put", "put_nowait"})


def _bindings(nodes: Iterable[ast.AST]) -> dict[str, list[ast.expr]]:
    found: dict[str, list[ast.expr]] = {}
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(node.value)
    return found


def returns_task(nodes: list[ast.AST], submits: frozenset[str]) -> bool:
    """Does a ``return`` hand back a store submit's result (the call itself, or a local bound to one)?"""
    bound = _bindings(nodes)

    def submitted(value: ast.AST | None) -> bool:
        return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in submits

    for node in nodes:
        if isinstance(node, ast.Return) and node.value is not None:
            if submitted(node.value) or (isinstance(node.value, ast.Name)
                                         and any(submitted(v) for v in bound.get(node.value.id, []))):
                return True
    return False


def helper_keeps(nodes: list[ast.AST]) -> tuple[tuple[str, str], ...]:
    """(helper, container) for each ``self.<helper>(...)`` result the body puts into ``self.<container>`` (an
    ``append``-like call, or an item), directly or through a local bound to it."""
    bound = _bindings(nodes)

    def helpers(value: ast.AST) -> set[str]:
        direct = self_call(value)
        if direct is not None:
            return {direct}
        if isinstance(value, ast.Name):
            return {h for v in bound.get(value.id, []) if (h := self_call(v)) is not None}
        return set()

    found: list[tuple[str, str]] = []
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _FILLING \
                and node.args and (attr := self_container(node.func.value)) is not None:
            found += [(h, attr) for h in helpers(node.args[-1])]
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and (attr := self_container(target)) is not None:
                    found += [(h, attr) for h in helpers(node.value)]
    return tuple(dict.fromkeys(found))


def entry_visits(nodes: list[ast.AST], waits: frozenset[str],
                 iteration_builtins: frozenset[str]) -> tuple[tuple[str, bool, frozenset[str]], ...]:
    """Loops (and comprehensions) over a ``self`` container's entries (``self.x``, its ``values()``/``items()``,
    ``list(self.x)``): (attribute, does the body call a store wait, the ``self`` helpers it calls)."""
    found: list[tuple[str, bool, frozenset[str]]] = []
    for iterable, body in loop_bodies(nodes):
        while isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) \
                and iterable.func.id in iteration_builtins and iterable.args:
            iterable = iterable.args[0]
        if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) \
                and iterable.func.attr in ("items", "values", "keys", "copy") and not iterable.args:
            iterable = iterable.func.value
        attr = self_container(iterable) if isinstance(iterable, (ast.Attribute, ast.Subscript)) else None
        if attr is None:
            continue
        calls = [c for part in body for c in ast.walk(part) if isinstance(c, ast.Call)]
        found.append((attr, any(isinstance(c.func, ast.Attribute) and c.func.attr in waits for c in calls),
                      frozenset(h for c in calls if (h := self_call(c)) is not None)))
    return tuple(dict.fromkeys(found))


#: Modules whose ``dump`` writes an object out and returns no task (``json.dump(obj, f)``).
_SERIALIZERS = frozenset({"json", "pickle", "cloudpickle", "marshal", "yaml", "toml", "ujson", "orjson", "msgpack"})


def dropped_submits(func: ast.FunctionDef | ast.AsyncFunctionDef, nodes: list[ast.AST],
                    submits: frozenset[str]) -> tuple[tuple[int, str], ...]:
    """(line, the call) for each store submit whose task the body drops: the call is a statement of its own, or its
    result is bound only to local names that nothing in the function (nested functions included) reads. No wait can
    reach such a task: a store's wait takes the task the submit returned."""
    read = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
    shared = {name for n in ast.walk(func) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
    parents = {child: node for node in nodes for child in ast.iter_child_nodes(node)}
    found: list[tuple[int, str]] = []
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in submits):
            continue
        if isinstance(node.func.value, ast.Name) and node.func.value.id in _SERIALIZERS:
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Expr):
            dropped = True
        elif isinstance(parent, (ast.Assign, ast.AnnAssign)):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            dropped = all(isinstance(t, ast.Name) and t.id not in read and t.id not in shared for t in targets)
        else:
            dropped = False
        if dropped:
            found.append((node.lineno, f"{ast.unparse(node.func)}(...)"))
    return tuple(found)
