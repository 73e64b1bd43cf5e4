"""A save split across helpers: every store task it submits lands in a container that a later helper of the same
call waits entry by entry, so no dump outlives the call (a synchronous save, whatever the helpers are called).

The per-definition flow (source.py's ``TaskFlow``) sees one body at a time: a task a helper appends to a list it is
given (``batch.tasks.append(self._store.dump(...))``) and a loop another helper runs over that list
(``self._settle(batch.tasks)``: ``for task in tasks: self._store.wait(task)``) are two unrelated facts there, and the
thirtieth blind round's ``StepBatchConnector`` (keyed safe: submitted and settled in one ``wait_for_save``) was read
as a deferred save that tracks nothing. This module reads each definition as an ordered list of events on
*container paths* (``self._batch.tasks``, ``batch.tasks`` for a parameter ``batch``), and follows a save's top-level
``self`` helper calls, binding each helper's parameters to the caller's paths. Strict on purpose, since a wrong
answer here is a wrong ``safe``: every submit must go straight into a path (``P.append(submit)``, or a local bound
once to the submit and only appended), the wait loop must run at the top level of a helper called at the top level
of the save, over the whole container, with no ``break``/``return``/``continue`` that can skip a wait, and nothing
may rebind or take entries from the container between the submit and the wait.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterator

from deferdump.tools.mro.ast_helpers import is_self, names_in, target_names

if TYPE_CHECKING:
    from deferdump.tools.mro.behaviour import EffectReader

#: A container path: its root (``self`` or a parameter's name), then attribute names.
Path = tuple[str, ...]

#: Calls on a container that add to it or only read it: they take no task out and do not replace it.
_HARMLESS_CALLS = frozenset({"append", "extend", "add", "copy", "count", "index", "keys", "values", "items", "get",
                             "__len__", "__contains__", "__iter__"})
#: Builtins that only read what they are given (or copy it): passing a container to them takes nothing out.
_READING_BUILTINS = frozenset({"len", "list", "tuple", "sorted", "bool", "str", "repr", "isinstance", "id", "iter",
                               "enumerate", "sum", "any", "all", "min", "max", "set", "frozenset"})
#: Wrappers a wait loop may iterate instead of the container itself: each visits every entry as it is now.
_WHOLE_COPIES = frozenset({"list", "tuple", "sorted"})
#: The root of a helper's parameter given an expression that may be one of the call's containers but is not a path
#: (``batch.tasks or []``): a task put there, or anything taken from it, is not followed.
UNKNOWN_ROOT = "?"
#: The root of a helper's parameter given a copy of a container (``list(batch.tasks)``): a loop waiting every entry
#: of the copy waits every entry the container had; a task put into the copy is not in the container.
COPY_ROOT = "="
#: How deep helper calls are followed.
_MAX_DEPTH = 6


@dataclass(frozen=True)
class Put:
    """A store submit whose task is appended to ``path``."""

    path: Path
    line: int


@dataclass(frozen=True)
class Drain:
    """A top-level loop that waits every entry of ``path``."""

    path: Path
    line: int


@dataclass(frozen=True)
class Touch:
    """Something that may take entries out of ``path`` or replace it (a rebinding, ``pop``, ``clear``, a foreign
    call it is handed to); ``rebinds``: it may bind the path to another object (an assignment to it or to an object
    it is in, or ``self`` handed to code not read), after which a name bound to it earlier names the old one."""

    path: Path
    line: int
    rebinds: bool = False


@dataclass(frozen=True)
class HelperCall:
    """``self.<helper>(...)`` with each argument's path (None: not a path); ``top``: it runs whenever the body does,
    before any later statement (a statement of the body's top level, no return before it)."""

    helper: str
    args: tuple[Path | None, ...]
    keywords: tuple[tuple[str, Path | None], ...]
    top: bool
    line: int


@dataclass(frozen=True)
class Return:
    """A ``return`` before the body's last statement: the call may end here."""

    line: int


@dataclass(frozen=True)
class Unreadable:
    """A submit whose task goes somewhere this module does not follow, or a construct it does not read."""

    why: str
    line: int


Event = Put | Drain | Touch | HelperCall | Return | Unreadable


@dataclass(frozen=True)
class PathEvents:
    """One definition's events in source order and its parameters (``self`` left out)."""

    params: tuple[str, ...]
    events: tuple[Event, ...]


def path_events(func: ast.FunctionDef | ast.AsyncFunctionDef, own: list[ast.AST],
                submits: frozenset[str], waits: frozenset[str]) -> PathEvents | None:
    """The definition's events, or None where it neither submits, waits nor calls a ``self`` helper (nothing to follow).
    ``own``: its nodes, nested functions, lambdas and classes left out."""
    calls = [n for n in own if isinstance(n, ast.Call)]
    if not any(_name(c) in submits | waits or _self_helper(c) for c in calls):
        return None
    params = tuple(a.arg for a in func.args.args[1:])
    aliases = _aliases(own, set(params))
    parents = {child: node for node in own for child in ast.iter_child_nodes(node)}
    top_statements = set(map(id, func.body))
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    events: list[tuple[tuple[int, int], Event]] = []

    def resolve(node: ast.AST) -> Path | None:
        return _path(node, aliases)

    roots = {"self", *aliases}
    for node in own:  # code that runs elsewhere or later, over the same objects
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) \
                    and names_in(child) & roots:
                events.append(((child.lineno, child.col_offset), Unreadable(
                    f"line {child.lineno}: a nested function or lambda over the call's objects", child.lineno)))
    submit_holders: dict[str, ast.Call] = {}  # local -> the submit it was bound to
    for node in own:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Call) and _name(node.value) in submits:
            submit_holders[node.targets[0].id] = node.value
    rebound = {name for name in submit_holders if sum(
        1 for n in own for t in _targets(n) if name in target_names(t)) > 1}
    for call in calls:
        where = (call.lineno, call.col_offset)
        if _name(call) in submits:
            events.append((where, _submit_event(call, parents, resolve, submit_holders, rebound, own)))
            continue
        helper = _self_helper(call)
        if helper is not None:
            if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                events.append((where, Unreadable(f"line {call.lineno}: self.{helper}(*...)", call.lineno)))
                continue
            statement = parents.get(call)
            top = isinstance(statement, ast.Expr) and id(statement) in top_statements
            events.append((where, HelperCall(helper, tuple(_argument(a, aliases) for a in call.args),
                                             tuple((k.arg, _argument(k.value, aliases)) for k in call.keywords
                                                   if k.arg), top, call.lineno)))
            continue
        receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
        if receiver is not None and (path := resolve(receiver)) is not None \
                and _name(call) not in _HARMLESS_CALLS | waits | submits:
            events.append((where, Touch(path, call.lineno)))
        if isinstance(call.func, ast.Name) and call.func.id in _READING_BUILTINS:
            continue
        if _name(call) in waits | submits:
            continue  # a store call reads what it is given
        for arg in (*call.args, *(k.value for k in call.keywords)):
            if is_self(arg):
                events.append((where, Touch(("self",), call.lineno, True)))  # anything of the instance may change
            elif (path := resolve(arg)) is not None:
                events.append((where, Touch(path, call.lineno)))  # handed to code this module does not read
    for node in own:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Delete)):
            for target in _targets(node):
                for sub in ast.walk(target):
                    if isinstance(sub, (ast.Attribute, ast.Subscript)) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                        base = sub.value if isinstance(sub, ast.Subscript) else sub
                        if (path := resolve(base)) is not None:
                            events.append(((node.lineno, node.col_offset), Touch(path, node.lineno, True)))
            value = getattr(node, "value", None)
            aliasing = isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in aliases
            if value is not None and not aliasing and (path := resolve(value)) is not None:
                events.append(((node.lineno, node.col_offset), Touch(path, node.lineno)))  # a second name for it
        elif isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)) and node.value is not None \
                and (path := resolve(node.value)) is not None:
            events.append(((node.lineno, node.col_offset), Touch(path, node.lineno)))  # handed to the caller
        if isinstance(node, ast.Return) and not (body and node is body[-1]):
            events.append(((node.lineno, node.col_offset), Return(node.lineno)))
    for stmt in body:
        drain = _drain(stmt, resolve, waits)
        if drain is not None:
            events.append(((stmt.lineno, -1), drain))
    return PathEvents(params, tuple(e for _, e in sorted(events, key=lambda pair: pair[0])))


def settled_across_helpers(reader: "EffectReader", cls: str, owner: str, method: str) -> bool:
    """Does every store task ``owner``'s ``method`` submits (for an instance of ``cls``), through any helper, land in
    a container a later top-level helper (or loop) of the same call waits entry by entry, with nothing between
    taking it out? At least one submit is required."""
    facts = reader.hierarchy.method(owner, method)
    if facts.path_events is None or _magic_attributes(reader) or _bounded_containers(reader):
        return False
    binding: dict[str, Path | None] = {name: None for name in facts.path_events.params}
    open_puts: list[Path] = []
    rebound: list[Path] = []  # paths the call may have bound to another object so far
    seen_put = False
    for event, top, depth in _expand(reader, cls, facts.path_events, binding, True, (owner, method), 0):
        if isinstance(event, Unreadable):
            return False
        if isinstance(event, Put):
            if event.path[0] == UNKNOWN_ROOT or _property_on(reader, event.path):
                return False
            if any(_prefix(r, event.path) for r in rebound):
                # ``batch = self._batch; self._batch = Batch(); self._submit(batch)``: the task went into the old
                # object, the path names the new one, and a name bound before may be what a later loop waits
                return False
            seen_put = True
            open_puts.append(event.path)
        elif isinstance(event, Touch):
            if any(_prefix(event.path, p) for p in open_puts) or (event.path[0] == UNKNOWN_ROOT and open_puts):
                return False
            if event.rebinds:
                rebound.append(event.path)
        elif isinstance(event, Return) and depth == 0 and open_puts:
            return False  # the save may end with tasks in flight
        elif isinstance(event, Drain) and top:
            open_puts = [p for p in open_puts if p != event.path]
    return seen_put and not open_puts


def _expand(reader: "EffectReader", cls: str, events: PathEvents, binding: dict[str, Path | None], top: bool,
            where: tuple[str, str], depth: int) -> Iterator[tuple[Event, bool, int]]:
    """The events of one call in order, helpers expanded, paths rooted at ``self``; ``top``: the event runs
    whenever the save does (a helper's events after a return it may take do not)."""
    for event in events.events:
        if isinstance(event, (Put, Drain, Touch)):
            path = _bound(event.path, binding)
            if path is not None and path[0] == COPY_ROOT:
                if isinstance(event, Drain) and len(event.path) == 1:
                    yield (Drain(path[1:], event.line), top, depth)  # every entry of the copy: every entry it had
                elif isinstance(event, Put):
                    yield (Unreadable(f"{where[0]}.{where[1]}: a task put into a copy", event.line), top, depth)
                    return
                continue  # anything else done to the copy leaves the container as it is
            if path is None:
                if isinstance(event, Drain):
                    continue  # waits a container not followed here: it ends nothing this module counts
                if isinstance(event, Touch):
                    continue  # a container the caller did not hand over as a path: none of the followed ones
                yield (Unreadable(f"{where[0]}.{where[1]}: a task put into a container given by an argument that "
                                  "is not a path", event.line), top, depth)
                return
            yield (replace(event, path=path), top, depth)
        elif isinstance(event, HelperCall):
            target = reader.hierarchy.lookup(cls, event.helper)
            if target is None or reader.hierarchy.classes[target].external or depth >= _MAX_DEPTH:
                yield (Unreadable(f"self.{event.helper}() is not read", event.line), top, depth)
                return
            callee = reader.hierarchy.method(target, event.helper)
            if callee.generator:
                yield (Unreadable(f"self.{event.helper}() is a generator", event.line), top, depth)
                return
            if callee.path_events is None:
                continue  # no submit, no wait, no helper call: nothing of a container's tasks moves there
            inner: dict[str, Path | None] = {name: None for name in callee.path_events.params}
            for name, path in zip(callee.path_events.params, event.args):
                inner[name] = _bound(path, binding) if path is not None else None
            for name, path in event.keywords:
                if name in inner:
                    inner[name] = _bound(path, binding) if path is not None else None
            yield from _expand(reader, cls, callee.path_events, inner, top and event.top,
                               (target, event.helper), depth + 1)
        elif isinstance(event, Return):
            yield (event, top, depth)
            if depth:
                top = False  # the helper may have returned: what follows in it may not run
        else:
            yield (event, top, depth)
            return


def _magic_attributes(reader: "EffectReader") -> bool:
    """Does an analysed class define ``__getattr__``/``__getattribute__``/``__setattr__`` (an attribute read may then
    hand back a different object each time), or a container's ``append``/``extend``/``__iter__`` (a container of its
    own, which may keep or visit entries otherwise)?"""
    return any(name in facts.methods for facts in reader.hierarchy.classes.values()
               for name in ("__getattr__", "__getattribute__", "__setattr__", "append", "extend", "__iter__"))


def _bounded_containers(reader: "EffectReader") -> bool:
    """Does an analysed module build a ``deque`` with a bound (``maxlen=``, or a second argument)? Appending to a full
    one drops its oldest entry: a task put there may be gone before the loop that waits the rest."""
    return any(facts.bounded_deques for facts in reader.hierarchy.classes.values())


def builds_bounded_deque(tree: ast.AST) -> bool:
    """See :func:`_bounded_containers`: the module-wide fact source.py records on each of the module's classes."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                node.func.id if isinstance(node.func, ast.Name) else None
            if name == "deque" and (len(node.args) >= 2 or any(k.arg == "maxlen" for k in node.keywords)):
                return True
    return False


def _property_on(reader: "EffectReader", path: Path) -> bool:
    """Is any attribute of ``path`` a method or property of an analysed class (its value computed per read)?"""
    return any(attr in facts.methods for facts in reader.hierarchy.classes.values() for attr in path[1:])


def _bound(path: Path, binding: dict[str, Path | None]) -> Path | None:
    """``path`` with its root replaced by what the caller bound it to (``self`` stays)."""
    if path[0] in ("self", UNKNOWN_ROOT, COPY_ROOT):
        return path
    root = binding.get(path[0])
    return None if root is None else (*root, *path[1:])


def _prefix(short: Path, long: Path) -> bool:
    """Is ``short`` the path of ``long`` or of an object ``long`` is inside?"""
    return long[: len(short)] == short


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def _self_helper(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Attribute) and is_self(node.func.value):
        return node.func.attr
    return None


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    if isinstance(node, ast.For):
        return [node.target]
    return []


def _aliases(own: list[ast.AST], params: set[str]) -> dict[str, Path | None]:
    """Each parameter, and each local bound exactly once to a path (``batch = self._batch``), to its path; a name
    bound otherwise is left out (its value is not a path this module follows)."""
    bindings: dict[str, list[ast.AST]] = {}
    for node in own:
        for target in _targets(node):
            for name in target_names(target):
                bindings.setdefault(name, []).append(node)
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    for name in target_names(item.optional_vars):
                        bindings.setdefault(name, []).append(node)
        if isinstance(node, (ast.NamedExpr,)) and isinstance(node.target, ast.Name):
            bindings.setdefault(node.target.id, []).append(node)
    found: dict[str, Path | None] = {}
    for name in params:
        if name not in bindings:
            found[name] = (name,)
    for name, nodes in bindings.items():
        if name in params or len(nodes) != 1:
            continue
        node = nodes[0]
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            path = _path(node.value, found)
            if path is not None:
                found[name] = path
    return found


def _path(node: ast.AST, aliases: dict[str, Path | None]) -> Path | None:
    """``self.a.b`` -> ("self", "a", "b"); ``p.b`` -> (p's path, "b") for a parameter or alias; else None."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    if node.id == "self":
        root: Path = ("self",)
    else:
        alias = aliases.get(node.id)
        if alias is None:
            return None
        root = alias
    if root == ("self",) and not attrs:
        return None  # ``self`` itself is not a container
    return (*root, *reversed(attrs))


def _argument(node: ast.AST, aliases: dict[str, Path | None]) -> Path | None:
    """What a helper's parameter is bound to: the argument's path; None for a fresh value (a literal, a copy made by
    ``list(...)``/``tuple(...)``/``sorted(...)``, a value naming none of the call's objects); otherwise a path under
    :data:`UNKNOWN_ROOT`."""
    path = _path(node, aliases)
    if path is not None:
        return path
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _WHOLE_COPIES \
            and len(node.args) == 1 and not node.keywords:
        copied = _path(node.args[0], aliases)
        return (COPY_ROOT, *copied) if copied is not None else None
    if names_in(node) & {"self", *aliases}:
        return (UNKNOWN_ROOT,)
    return None


def _submit_event(call: ast.Call, parents: dict[ast.AST, ast.AST], resolve, holders: dict[str, ast.Call],
                  rebound: set[str], own: list[ast.AST]) -> Event:
    """Where a submit's task goes: straight into ``P.append(...)`` (or ``P.extend([...])``), or into a local bound
    once to it and only appended to paths."""
    parent = parents.get(call)
    if isinstance(parent, (ast.List, ast.Tuple)):
        parent = parents.get(parent)
        if isinstance(parent, ast.Call) and _name(parent) == "extend" and isinstance(parent.func, ast.Attribute):
            path = resolve(parent.func.value)
            return Put(path, call.lineno) if path is not None else Unreadable("extends a non-path", call.lineno)
        return Unreadable(f"line {call.lineno}: the task goes into a literal", call.lineno)
    if isinstance(parent, ast.Call) and _name(parent) == "append" and parent.args == [call] \
            and isinstance(parent.func, ast.Attribute):
        path = resolve(parent.func.value)
        if path is not None:
            return Put(path, call.lineno)
        return Unreadable(f"line {call.lineno}: appended to a container that is not a path", call.lineno)
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
        name = parent.targets[0].id
        if name in rebound or holders.get(name) is not call:
            return Unreadable(f"line {call.lineno}: the task's name is bound more than once", call.lineno)
        uses = [n for n in own if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
        places: list[Path] = []
        for use in uses:
            up = parents.get(use)
            if isinstance(up, ast.Call) and _name(up) == "append" and up.args == [use] \
                    and isinstance(up.func, ast.Attribute) and (path := resolve(up.func.value)) is not None:
                places.append(path)
            else:
                return Unreadable(f"line {use.lineno}: the task is used other than appended", call.lineno)
        if len(places) == 1:
            return Put(places[0], call.lineno)
    return Unreadable(f"line {call.lineno}: where the task goes is not read", call.lineno)


def _drain(stmt: ast.stmt, resolve, waits: frozenset[str]) -> Drain | None:
    """A top-level ``for v in P:`` (or ``list(P)``/``tuple(P)``/``sorted(P)``) whose body waits ``v`` on every pass:
    the wait not under an ``if``/loop/``with``, no ``break``/``return``, no ``continue`` outside an ``except``."""
    if not isinstance(stmt, ast.For) or not isinstance(stmt.target, ast.Name) or stmt.orelse:
        return None
    iterated = stmt.iter
    if isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Name) and iterated.func.id in _WHOLE_COPIES \
            and len(iterated.args) == 1 and not iterated.keywords:
        iterated = iterated.args[0]
    path = resolve(iterated)
    if path is None:
        return None
    var = stmt.target.id
    inner = [n for s in stmt.body for n in ast.walk(s)]
    if any(isinstance(n, (ast.Break, ast.Return, ast.Yield, ast.YieldFrom, ast.Await)) for n in inner):
        return None
    if any(var in target_names(t) for n in inner for t in _targets(n)):
        return None  # the loop variable rebound before the wait
    if _unconditional_wait(stmt.body, var, waits):
        return Drain(path, stmt.lineno)
    return None


def _unconditional_wait(body: list[ast.stmt], var: str, waits: frozenset[str]) -> bool:
    """Does ``body`` wait ``var`` on every pass? Walked statement by statement: a ``continue`` before the wait (outside
    an ``except`` handler) skips it; a wait under an ``if``/loop/``with`` may not run; in a ``try`` the wait must be
    its first statement (an earlier one may raise into a handler that skips it)."""
    for stmt in body:
        if isinstance(stmt, ast.Continue):
            return False
        if isinstance(stmt, ast.Try):
            if any(isinstance(n, ast.Continue) for s in stmt.body for n in ast.walk(s)):
                return False
            first = stmt.body[0]
            if _waits_in(first.test if isinstance(first, ast.If) else first, var, waits):
                return True
            continue
        if isinstance(stmt, (ast.If, ast.While, ast.For, ast.With, ast.AsyncWith, ast.AsyncFor)):
            if any(isinstance(n, ast.Continue) for n in ast.walk(stmt)):
                return False
            if isinstance(stmt, ast.If) and _waits_in(stmt.test, var, waits):
                return True  # ``if self._store.wait(task) != 0:``: the test always runs
            continue
        if _waits_in(stmt, var, waits):
            return True
    return False


def _waits_in(node: ast.AST, var: str, waits: frozenset[str]) -> bool:
    """A store wait on ``var`` that runs whenever ``node`` is evaluated (not behind a short circuit, a conditional
    expression, a lambda or a comprehension)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Call) and _name(current) in waits \
                and any(isinstance(a, ast.Name) and a.id == var for a in current.args):
            return True
        for child in ast.iter_child_nodes(current):
            if isinstance(child, (ast.Lambda, ast.IfExp, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
                                  ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(current, ast.BoolOp) and child is not current.values[0]:
                continue
            stack.append(child)
    return False
