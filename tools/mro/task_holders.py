"""Where a definition puts store tasks a helper returned, and which ``self`` containers its loops visit: the facts
the unreached-task rule (unreached_tasks.py) reads, kept out of the main reader (source.py) that calls these.

The reader's data flow of store tasks (``TaskFlow``) follows a submit's result through the locals of one body; a task
a ``self`` helper returns (``task = self._launch(order)``, whose body is ``return self._store.dump(...)``) and the
caller appends to ``self._background`` is kept there unseen (the twenty-ninth blind round's
``DetachedBackfillConnector``). These facts name the pairs (helper, container); the rule resolves the helper. A
submit whose task the body drops (``dropped_submits``) is held nowhere at all: the reader counts it as lost."""
from __future__ import annotations

import ast
import collections
from dataclasses import dataclass
from typing import Iterable

from deferdump.tools.mro.ast_helpers import called_name, loop_bodies, names_in, self_call, self_container

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


#: Calls that make a new object from another (``dataclasses.replace``, ``copy.copy``/``deepcopy``, a named tuple's
#: ``_replace``, pydantic's ``model_copy``): what is put into the new object is not in the one it was made from.
COPY_CALLS = frozenset({"replace", "copy", "deepcopy", "_replace", "model_copy"})

#: Calls that read what they are given without keeping it (a log line, a length, a type test).
READ_ONLY_CALLS = frozenset({"len", "isinstance", "bool", "repr", "str", "id", "type", "hasattr", "print", "debug",
                             "info", "warning", "error", "exception", "critical", "log"})

#: Methods called on a field of the copy that fill or read it in place (no object leaves through them).
_IN_PLACE = frozenset({"append", "appendleft", "extend", "insert", "add", "update", "setdefault", "pop", "get",
                       "items", "values", "keys", "clear", "index", "count", "remove", "discard"})


@dataclass(frozen=True)
class CopyRecord:
    """A local bound only to a copy of another object (``meta = dataclasses.replace(shared, records=[])``) that the
    definition fills with store tasks and never lets out whole (no ``return``, no store into another object, no call
    that may keep it, other than the ``self`` helpers in ``handed``).

    ``filled``: (field, what) for each value the definition itself puts into a field of the copy, ``what`` being
    ``""`` for a store submit's task, else the ``self`` helper whose result it is; ``passes``: (helper, the copy's
    position, the other arguments' positions with what each holds, as in ``filled``); ``handed``: (helper, position,
    field) for every ``self`` helper given the copy (field ``""``) or one of its fields (the rule checks that none
    keeps what may hold the tasks); ``escaped``: fields handed elsewhere, stored or returned. A value counts only where
    the copy is its one holder here: a call written in place, or a local read once."""

    local: str
    line: int
    filled: tuple[tuple[str, str], ...] = ()
    passes: tuple[tuple[str, int, tuple[tuple[int, str], ...]], ...] = ()
    handed: tuple[tuple[str, int, str], ...] = ()
    escaped: frozenset[str] = frozenset()


def _copy_call(value: ast.AST) -> bool:
    if not isinstance(value, ast.Call):
        return False
    return called_name(value) in COPY_CALLS and bool(value.args or isinstance(value.func, ast.Attribute))


def _fill_site(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST:
    """Where a use of the copy (a ``Name``) stops being the copy or one of its fields: climbs ``x.a.b`` and ``x.a[k]``."""
    while isinstance(up := parents.get(node), (ast.Attribute, ast.Subscript)) and up.value is node:
        if isinstance(up, ast.Attribute) and isinstance(call := parents.get(up), ast.Call) and call.func is up:
            break  # ``x.f.extend(...)``: the method, not a field
        node = up
    return node


def copy_records(func: ast.FunctionDef | ast.AsyncFunctionDef, nodes: list[ast.AST],
                 submits: frozenset[str]) -> tuple[CopyRecord, ...]:
    """The copies the body fills and keeps to itself (see ``CopyRecord``)."""
    bound = _bindings(nodes)
    copies = {name for name, values in bound.items() if values and all(_copy_call(v) for v in values)}
    shared = {name for n in ast.walk(func) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
    copies -= shared | {a.arg for a in func.args.args}
    if not copies:
        return ()
    parents = {child: node for node in nodes for child in ast.iter_child_nodes(node)}
    nested = {id(n) for n in ast.walk(func) if isinstance(n, ast.Name)} - {id(n) for n in nodes}
    reads = collections.Counter(n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))

    def holds(value: ast.AST, depth: int = 0) -> str | None:
        """What a value holds: ``""`` for a store submit's task, a ``self`` helper's name for its result."""
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in submits:
            return ""
        helper = self_call(value)
        if helper is not None:
            return helper
        if isinstance(value, (ast.List, ast.Tuple)) and value.elts:
            return holds(value.elts[0], depth)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and len(value.args) == 1:
            return holds(value.args[0], depth)  # a wrapping constructor: ``Record(task)``, ``list(tasks)``
        if isinstance(value, ast.Name) and reads[value.id] == 1 and depth < 3:
            for v in bound.get(value.id, []):
                got = holds(v, depth + 1)
                if got is not None:
                    return got
        return None

    found: list[CopyRecord] = []
    for local in sorted(copies):
        uses = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == local and not isinstance(n.ctx, ast.Store)]
        if any(id(n) in nested for n in uses):
            continue  # a nested function or lambda reads it: it may outlive the call
        filled: list[tuple[str, str]] = []
        passes: list[tuple[str, int, tuple[tuple[int, str], ...]]] = []
        handed: list[tuple[str, int, str]] = []
        escaped: set[str] = set()
        whole_escapes = False
        for use in uses:
            first = parents.get(use)
            field = first.attr if isinstance(first, ast.Attribute) and first.value is use and not (
                isinstance(parents.get(first), ast.Call) and parents[first].func is first) else ""  # type: ignore[attr-defined]
            site = _fill_site(use, parents)
            up = parents.get(site)
            if isinstance(up, ast.Attribute) and isinstance(call := parents.get(up), ast.Call) and call.func is up:
                if up.attr not in _IN_PLACE:
                    whole_escapes |= not field
                    escaped.add(field)
                elif site is not use and up.attr in _FILLING | {"update", "setdefault"}:
                    filled += [(field, h) for a in [*call.args, *(k.value for k in call.keywords)]
                               if (h := holds(a)) is not None]
                continue
            if isinstance(up, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and site in (
                    up.targets if isinstance(up, ast.Assign) else [up.target]):
                if site is not use and up.value is not None:  # ``x.f = value`` / ``x.f[k] = value``: a fill
                    held = holds(up.value)
                    filled += [(field, held)] if held is not None else []
                continue
            if isinstance(up, ast.Call) and site in up.args:
                helper = self_call(up)
                name = up.func.id if isinstance(up.func, ast.Name) else up.func.attr if isinstance(up.func, ast.Attribute) else None
                if helper is not None:
                    position = up.args.index(site)
                    handed.append((helper, position, field))
                    if site is use:
                        others = tuple((i, h) for i, a in enumerate(up.args) if a is not site and (h := holds(a)) is not None)
                        passes.append((helper, position, others))
                    continue
                if name in READ_ONLY_CALLS:
                    continue  # a length, a type test, a log line: nothing is kept
            elif isinstance(up, (ast.For, ast.AsyncFor, ast.comprehension)) and site is up.iter:
                continue
            elif isinstance(up, (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.If, ast.While, ast.IfExp,
                                 ast.FormattedValue, ast.Assert)):
                continue
            whole_escapes |= not field
            escaped.add(field)
        if not whole_escapes and (filled or passes):
            line = min(v.lineno for v in bound[local])
            found.append(CopyRecord(local, line, tuple(dict.fromkeys(filled)), tuple(passes),
                                    tuple(dict.fromkeys(handed)), frozenset(escaped)))
    return tuple(found)


def param_fills(func: ast.FunctionDef | ast.AsyncFunctionDef, nodes: list[ast.AST]) -> tuple[tuple[int, int, str], ...]:
    """(i, j, field) for each statement that puts positional parameter ``j``'s value (directly, or through locals
    derived from it) into ``field`` of positional parameter ``i`` (``p.f.extend(q)``, ``p.f = q``, ``p.f[k] = q``); 0
    is the first parameter after ``self``."""
    params = [a.arg for a in func.args.args[1:]]
    if len(params) < 2:
        return ()
    bound = _bindings(nodes)
    loops = [(names_in(t.target), t.iter) for t in nodes if isinstance(t, (ast.For, ast.comprehension))]

    def reads(value: ast.AST) -> set[int]:
        names = names_in(value)
        for _ in range(3):
            names |= {n for n, values in bound.items() for v in values if names_in(v) & names}
            names |= {n for targets, it in loops if names_in(it) & names for n in targets}
        return {i for i, p in enumerate(params) if p in names}

    def base(node: ast.AST) -> tuple[int, str] | None:
        field = ""
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node, ast.Attribute):
                field = node.attr
            node = node.value
        if field and isinstance(node, ast.Name) and node.id in params:
            return params.index(node.id), field
        return None

    found: set[tuple[int, int, str]] = set()
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _FILLING | {"update", "setdefault"}:
            at = base(node.func.value)
            if at is not None:
                found |= {(at[0], j, at[1]) for a in node.args for j in reads(a) if j != at[0]}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                at = base(target) if isinstance(target, (ast.Attribute, ast.Subscript)) else None
                if at is not None:
                    found |= {(at[0], j, at[1]) for j in reads(node.value) if j != at[0]}
    return tuple(sorted(found))


#: Builtins that make a new container of what they are given (``list(self.x[r])``).
_NEW_CONTAINERS = frozenset({"list", "tuple", "sorted", "set", "frozenset"})


def _copied_container(value: ast.AST) -> str | None:
    """``list(self.x.get(r, ()))``, ``self.x[r].copy()``, ``sorted(self.x)`` -> ``x``: a new container of the entries."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _NEW_CONTAINERS \
            and len(value.args) == 1:
        return self_container(value.args[0])
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "copy" \
            and not value.args:
        return self_container(value.func.value)
    return None


def copied_sweeps(nodes: list[ast.AST], waits: frozenset[str]) -> tuple[tuple[str, int, bool, frozenset[str]], ...]:
    """Loops over a local bound only to a copy of a ``self`` container or of one of its entries (``tickets =
    list(self._by_req.get(r, ()))``, then ``for t in tickets:``): (attribute, line, does the body call a store wait, the
    ``self`` helpers it calls). What such a loop ends stays in the container unless something removes it there."""
    bound = _bindings(nodes)
    copies = {name: attrs.pop() for name, values in bound.items()
              if values and len(attrs := {_copied_container(v) for v in values}) == 1 and None not in attrs}
    found: list[tuple[str, int, bool, frozenset[str]]] = []
    for node in nodes:
        if not (isinstance(node, (ast.For, ast.AsyncFor)) and isinstance(node.iter, ast.Name) and node.iter.id in copies):
            continue
        calls = [c for part in node.body for c in ast.walk(part) if isinstance(c, ast.Call)]
        found.append((copies[node.iter.id], node.lineno,
                      any(isinstance(c.func, ast.Attribute) and c.func.attr in waits for c in calls),
                      frozenset(h for c in calls if (h := self_call(c)) is not None)))
    return tuple(found)
