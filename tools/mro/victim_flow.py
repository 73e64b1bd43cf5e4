"""Where a definition sends the entries of ``scheduler_output.preempted_req_ids``: into what it returns or into a field
of an object it was handed (the metadata the workers get), or only somewhere the workers never see (a log line, a
mirror the class keeps, a complement such as ``live - preempted``).

vLLM 0.32 tells the workers nothing about preemption itself: ``handle_preemptions`` gets the connector's own metadata
(gpu_model_runner.py ~3968-3971), so a class whose workers wait "the preempted requests' dumps" must carry vLLM's
victim ids there from ``build_connector_meta``. The model's ``wait_preempted`` waits vLLM's victims; a class shipping
victims of its own choosing (a diff of scheduled sets, the tail of a mirror: the thirtieth blind round) passes the
model while its workers wait the wrong requests. Only shapes that keep every entry count as carrying: the value
itself, ``set(x)``/``list(x)``, ``x or ()``, ``x | y``, ``x.union(y)``, ``{r for r in x}`` with no filter, a loop over
``x`` adding each entry unconditionally; a difference, an intersection or a filter keeps only some (``unknown``).
Pure syntax (source.py imports it)."""
from __future__ import annotations

import ast
from dataclasses import dataclass

from deferdump.tools.mro.ast_helpers import is_self, target_names

#: The field the read sits in: the victims are the value itself, or a field of the object it is.
WHOLE = "*"
#: Builtins that copy every entry of what they are given.
_COPIES = frozenset({"set", "frozenset", "list", "tuple", "sorted"})
#: Builtins that only look at what they are given.
_LOOKS = frozenset({"isinstance", "getattr", "hasattr", "len", "id", "type", "repr", "str", "bool", "print"})
#: Calls on a container that put every entry of their arguments in it.
_FILLS = frozenset({"update", "extend", "add", "append", "__ior__"})
#: Calls that take entries out of a container.
_TRIMS = frozenset({"discard", "remove", "pop", "popitem", "clear", "difference_update", "intersection_update",
                    "__isub__", "__iand__"})
_EMPTY_CALLS = frozenset({"set", "frozenset", "list", "tuple", "dict"})


@dataclass(frozen=True)
class VictimFlow:
    """What leaves the definition carrying every victim id: (source, field) pairs, source ``read`` (its own read of
    ``preempted_req_ids``), ``self:<m>`` (what a ``self`` helper returns), ``super:<m>`` (what ``super().<m>()``
    returns) or ``param`` (what a caller handed in, passed back); field the attribute of the object that holds them
    (:data:`WHOLE`: the value itself)."""

    out: frozenset[tuple[str, str]] = frozenset()
    # ``build_connector_meta`` only: the scheduler output handed whole to code this reading does not follow
    # (``SaveMeta(scheduler_output)``: the metadata class may copy the victims itself), as the called name
    handed: tuple[str, ...] = ()


def _is_read(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == "preempted_req_ids" and isinstance(node.ctx, ast.Load):
        return not is_self(node.value)
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
        and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
        and node.args[1].value == "preempted_req_ids"


def _empty(node: ast.AST) -> bool:
    """``()``, ``[]``, ``set()``, ``None``: what ``x or ()`` falls back to when there is no victim."""
    if isinstance(node, ast.Constant):
        return node.value is None
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return not node.elts
    if isinstance(node, ast.Dict):
        return not node.keys
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _EMPTY_CALLS \
        and not node.args and not node.keywords


def _keeps_itself(name: str, value: ast.expr) -> bool:
    """``v | x``, ``x | v``, ``v.union(x)``: a value that holds everything ``v`` held."""
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):
        return any(isinstance(side, ast.Name) and side.id == name for side in (value.left, value.right))
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "union" \
        and isinstance(value.func.value, ast.Name) and value.func.value.id == name


def _compose(outer: str, inner: str) -> str:
    return inner if outer == WHOLE else outer


class _Flow:
    def __init__(self, func: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.func = func
        self.params = {a.arg for a in [*func.args.posonlyargs, *func.args.args[1:], *func.args.kwonlyargs]}
        # a parameter holds what the caller handed in: returned, it passes the caller's value through ("param")
        self.taint: dict[str, set[tuple[str, str]]] = {p: {("param", WHOLE)} for p in self.params}
        self.out: set[tuple[str, str]] = set()

    def carry(self, node: ast.AST | None) -> set[tuple[str, str]]:
        """(source, field) pairs whose every entry the value of ``node`` holds."""
        if node is None:
            return set()
        if _is_read(node):
            return {("read", WHOLE)}
        if isinstance(node, ast.Name):
            return set(self.taint.get(node.id, ()))
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.Or):  # ``x or ()``: what follows x is taken only when x (so every victim) is
                return self.carry(node.values[0])  # empty; ``self._cached or x`` may be the cache
            return set()  # ``a and x`` is a falsy ``a`` when a does not hold: no victim at all
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.carry(node.left) | self.carry(node.right)
        if isinstance(node, ast.IfExp):
            body, orelse = self.carry(node.body), self.carry(node.orelse)
            tested = {source for source, _ in self.carry(node.test)}
            if _empty(node.orelse) and body and {source for source, _ in body} <= tested:
                return body  # ``set(x) if x else set()``: empty only when x is
            return body & orelse
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and len(node.generators) == 1:
            gen = node.generators[0]
            if not gen.ifs and isinstance(gen.target, ast.Name) and isinstance(node.elt, ast.Name) \
                    and node.elt.id == gen.target.id:
                return self.carry(gen.iter)
            return set()
        if isinstance(node, ast.Call):
            return self._carry_call(node)
        return set()

    def _carry_call(self, node: ast.Call) -> set[tuple[str, str]]:
        func = node.func
        if isinstance(func, ast.Name) and func.id in _COPIES and len(node.args) == 1 and not node.keywords:
            return self.carry(node.args[0])
        if isinstance(func, ast.Attribute):
            if is_self(func.value):
                return {(f"self:{func.attr}", WHOLE)}
            if isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name) \
                    and func.value.func.id == "super":
                return {(f"super:{func.attr}", WHOLE)}
            if func.attr in ("union", "copy"):
                return self.carry(func.value).union(*(self.carry(a) for a in node.args))
            return set()
        if isinstance(func, ast.Name) and func.id[:1].isupper():  # a constructor: its fields hold the arguments
            found = {(s, WHOLE) for a in node.args for s, _ in self.carry(a)}
            found |= {(s, k.arg) for k in node.keywords if k.arg for s, _ in self.carry(k.value)}
            return found
        return set()

    def _conditional(self, node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
        """Does ``node`` run only under a test other than the truth of the value it carries (a filter)?"""
        carried = {s for s, _ in self._stored_value_carry(node)}
        child, parent = node, parents.get(node)
        while parent is not None and parent is not self.func:
            if isinstance(parent, (ast.If, ast.While)) and child is not parent.test:
                if not (carried and {s for s, _ in self.carry(parent.test)} >= carried and child in parent.body):
                    return True
            if isinstance(parent, ast.Try) and child in parent.handlers:
                return True
            child, parent = parent, parents.get(parent)
        return False

    def _stored_value_carry(self, node: ast.AST) -> set[tuple[str, str]]:
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            return self.carry(node.value)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return set().union(*(self.carry(a) for a in node.value.args))
        return set()

    @staticmethod
    def _field_of(target: ast.AST) -> tuple[str, str] | None:
        """(local name, field) for a store into a field of a local object (``meta.preempted``, ``meta.v.ids``: the
        outermost field), None for ``self`` or anything else."""
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return None
        base, field = target.value, (target.attr if isinstance(target, ast.Attribute) else WHOLE)
        while isinstance(base, (ast.Attribute, ast.Subscript)):
            field = base.attr if isinstance(base, ast.Attribute) else field
            base = base.value
        if isinstance(base, ast.Name) and not is_self(base):
            return base.id, field
        return None

    def run(self) -> VictimFlow:
        everything = list(ast.walk(self.func))
        parents = {child: node for node in everything for child in ast.iter_child_nodes(node)}
        nodes = [n for n in everything if not self._nested(n, parents)]
        # Every binding of a local name, and every store into a field of a local object, wherever it is: a name
        # or field holds the victims only if each of its bindings does (``victims = set(x)`` then ``victims =
        # self._guess()`` holds guesses); fills (``victims.add(r)``, ``meta.ids.update(x)``) only add.
        bindings: dict[str, list[ast.expr | None]] = {p: [] for p in self.params}
        stores: dict[tuple[str, str], list[ast.expr | None]] = {}
        for node in nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    if isinstance(target, ast.Name):
                        if not _keeps_itself(target.id, node.value):  # ``v = v | x`` only adds to v
                            bindings.setdefault(target.id, []).append(node.value)
                        else:
                            bindings.setdefault(target.id, [])
                    elif isinstance(target, (ast.Tuple, ast.List)):  # ``meta.f, self._x = self._x, []``
                        for element in target.elts:
                            element = element.value if isinstance(element, ast.Starred) else element
                            if isinstance(element, ast.Name):
                                bindings.setdefault(element.id, []).append(None)
                            elif (held := self._field_of(element)) is not None:
                                stores.setdefault(held, []).append(None)
                    elif (held := self._field_of(target)) is not None and not self._conditional(node, parents):
                        stores.setdefault(held, []).append(node.value)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                if not isinstance(node.op, ast.BitOr):  # ``v |= x`` only adds to v; ``v -= x`` is a trim (below)
                    bindings.setdefault(node.target.id, []).append(None)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bindings.setdefault(node.name, []).append(None)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
                for sub in ([node.target] if isinstance(node, (ast.For, ast.AsyncFor)) else
                            [i.optional_vars for i in node.items if i.optional_vars is not None]
                            if isinstance(node, (ast.With, ast.AsyncWith)) else []):
                    for name in target_names(sub):
                        bindings.setdefault(name, []).append(None)
        for _ in range(4):  # loops: a later statement may feed an earlier one
            taint: dict[str, set[tuple[str, str]]] = {}
            for name, values in bindings.items():
                carried = [self.carry(v) if v is not None else set() for v in values]
                if name in self.params:
                    carried.append({("param", WHOLE)})  # what the caller handed in, unless rebound
                taint[name] = set.intersection(*carried) if carried else set()
            for (name, field), values in stores.items():
                held = set.intersection(*(self.carry(v) if v is not None else set() for v in values))
                held = {(s, _compose(field, f)) for s, f in held}
                taint.setdefault(name, set()).update(held)
                if name in self.params:
                    self.out |= held  # a field of an object the caller handed in (``meta.preempted = ...``)
            for node in nodes:
                grown = node.target.id if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.BitOr) \
                    and isinstance(node.target, ast.Name) else \
                    node.targets[0].id if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name) and _keeps_itself(node.targets[0].id, node.value) \
                    else None
                if grown is not None and not self._conditional(node, parents):  # ``v |= x``, ``v = v | x``
                    taint.setdefault(grown, set()).update(self.carry(node.value))
                if isinstance(node, (ast.For, ast.AsyncFor)) and isinstance(node.target, ast.Name):
                    taint[f"{node.target.id}\0{id(node)}"] = self.carry(node.iter)  # per loop: names recur
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _FILLS:
                    stmt = parents.get(node)
                    if not isinstance(stmt, ast.Expr) or self._conditional(stmt, parents):
                        continue
                    pairs = set().union(*(self.carry(a) for a in node.args)) | self._each(node, parents)
                    if isinstance(node.func.value, ast.Name):
                        taint.setdefault(node.func.value.id, set()).update(pairs)
                    elif (held_in := self._field_of(node.func.value)) is not None:
                        name, field = held_in
                        held = {(s, _compose(field, f)) for s, f in pairs}
                        taint.setdefault(name, set()).update(held)
                        if name in self.params:
                            self.out |= held
            self.taint = taint
        if any(self._trims(node) for node in nodes):
            return VictimFlow()  # ``victims -= done``, ``victims.discard(r)``: some entries taken out again
        returns = [self.carry(node.value) for node in nodes if isinstance(node, ast.Return)
                   and not self._nested(node, parents)]
        if returns:  # every return must carry them: an early ``return Meta()`` ships no victim
            self.out |= set.intersection(*returns)
        return VictimFlow(frozenset(self.out), self._handed(nodes))

    def _handed(self, nodes: list[ast.AST]) -> tuple[str, ...]:
        """In ``build_connector_meta``: calls given the scheduler output whole (the parameter or a name bound to it),
        other than ``self`` helpers and ``super()`` (followed by the judge) and builtins that only look at it."""
        args = self.func.args.args[1:]
        if self.func.name != "build_connector_meta" or not args:
            return ()
        output = {args[0].arg}
        for node in nodes:  # ``so = scheduler_output``
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in output:
                output |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        found: list[str] = []
        for node in nodes:
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and (is_self(func.value) or (
                    isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name)
                    and func.value.func.id == "super")):
                continue
            if isinstance(func, ast.Name) and func.id in _LOOKS:
                continue
            given = [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(a, ast.Name) and a.id in output for a in given):
                found.append(ast.unparse(func))
        return tuple(dict.fromkeys(found))

    def _nested(self, node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
        parent = parents.get(node)
        while parent is not None and parent is not self.func:
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return True
            parent = parents.get(parent)
        return False

    def _trims(self, node: ast.AST) -> bool:
        """Does ``node`` take entries out of a local that carries victims (or out of one of its fields)?"""
        if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Sub, ast.BitAnd)):
            target = node.target
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _TRIMS:
            target = node.func.value
        elif isinstance(node, ast.Delete):
            return any(self._trims_target(t) for t in node.targets)
        else:
            return False
        return self._trims_target(target)

    def _trims_target(self, target: ast.AST) -> bool:
        while isinstance(target, (ast.Attribute, ast.Subscript)):
            target = target.value
        return isinstance(target, ast.Name) and not is_self(target) \
            and any(source != "param" for source, _ in self.taint.get(target.id, ()))

    def _each(self, call: ast.Call, parents: dict[ast.AST, ast.AST]) -> set[tuple[str, str]]:
        """``for r in x: victims.add(r)``: the loop puts every entry of x in (no filter: see ``_conditional``)."""
        if call.func.attr not in ("add", "append") or len(call.args) != 1 or not isinstance(call.args[0], ast.Name):
            return set()
        name, parent = call.args[0].id, parents.get(call)
        while parent is not None and parent is not self.func:
            if isinstance(parent, (ast.For, ast.AsyncFor)) and isinstance(parent.target, ast.Name) \
                    and parent.target.id == name:
                return set(self.taint.get(f"{name}\0{id(parent)}", ()))
            parent = parents.get(parent)
        return set()


def victim_flow(func: ast.FunctionDef | ast.AsyncFunctionDef) -> VictimFlow:
    """Where ``func`` sends every entry of ``preempted_req_ids`` (see the module docstring)."""
    return _Flow(func).run()


def metadata_fields(func: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str] | None:
    """The fields ``handle_preemptions(self, kv_connector_metadata)`` reads off its metadata; None where the object
    goes elsewhere whole (to a helper, a call, another name), so any field may be the one read."""
    args = func.args.args[1:]
    if not args:
        return frozenset()
    param = args[0].arg
    nodes = list(ast.walk(func))
    parents = {child: node for node in nodes for child in ast.iter_child_nodes(node)}
    fields: set[str] = set()
    for node in nodes:
        if not (isinstance(node, ast.Name) and node.id == param and isinstance(node.ctx, ast.Load)):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Attribute):
            fields.add(parent.attr)
        elif isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "getattr" \
                and len(parent.args) >= 2 and isinstance(parent.args[1], ast.Constant) \
                and isinstance(parent.args[1].value, str):
            fields.add(parent.args[1].value)
            if len(parent.args) > 2 and any(isinstance(n, ast.Name) and n.id == param for n in ast.walk(parent.args[2])):
                return None  # ``getattr(meta, "x", meta)``: the object itself is the fallback
        elif isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "isinstance":
            continue
        else:
            return None
    return frozenset(fields)

