"""Judge connector classes read from source with the protocol model.

For each connector class and each context it can run in (top level on vLLM's HMA path if it is
``SupportsHMA``, else top level on the non-HMA path; and as a MultiConnector child beside a non-HMA
delaying sibling; a wrapper once per inner class its ``__init__`` may pick), and each case of model vLLM
can run it under (one KV-cache group; a sliding-window group: a hybrid model on the HMA path, a model whose
every layer is sliding-window on the non-HMA path; MLA; two layers when a save may keep a task per layer), the class table is injected into the spec and TLC
checks the protocol's safety invariants. The class verdict is the worst case's. Definitions the analysis cannot classify
are first given the worst label their method admits: if even that passes, the class is safe; otherwise
they get the PR's label, and a violation that survives is ``unsafe``, one that disappears ``unknown``.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Sequence

from deferdump.tools.mro.block_tables import unreplaced_tables
from deferdump.tools.mro.copied_sweeps import entries_left_behind
from deferdump.tools.mro.dropped_handoffs import dropped_handoffs
from deferdump.tools.mro.finish_plans import finish_plans
from deferdump.tools.mro.own_victims import counted_victims, unshipped_victims, widened_victims
from deferdump.tools.mro.unreached_tasks import copied_task_records, unreached_task_holders
from deferdump.tools.mro.behaviour import (
    ABSTRACT_REASON,
    EVERY_STEP_METHODS,
    FORWARD_ALIASES,
    GUARDED_TRACKING,
    AMBIGUOUS_PREEMPT,
    DELAY_ALL,
    SILENT_WAITS,
    UNSELECTED_REPORT_WAITS,
    WAIT_CALLS,
    OPTIMISTIC,
    OPTIMISTIC_HYBRID,
    OPTIMISTIC_SYNC,
    OUTSIDE_METHODS,
    PESSIMISTIC,
    RANK_DECIDED,
    UNTRACKED_SAVE,
    SAVE_METHODS,
    TENSOR_IDENTITY_CALLS,
    UNMODELLED_SCHEDULER_METHODS,
    UNMODELLED_STEP_METHODS,
    SPEC_METHODS,
    UNKNOWN,
    DefinitionLabel,
    EffectReader,
)
from deferdump.tools.mro.errors import JudgeError, ModelTimeout, MroError
from deferdump.tools.mro.hierarchy import Hierarchy, build_hierarchy
from deferdump.tools.mro.imported_bases import BaseSource, imported_base_files
from deferdump.tools.mro.source import CONNECTOR_METHODS, HIDDEN_SUBMIT, UNSEEN_KEEPING, read_files
from deferdump.tools.mro.tla import (
    ASSIGNED_CONSTANTS,
    PROTOCOL_MODULE,
    TEMPLATE_CFG,
    WRAPPER_NAME,
    CallPath,
    Case,
    ClassTable,
    ModelBounds,
    cfg_assignments,
    config_text,
    declared_constants,
    module_name,
    module_text,
)

if TYPE_CHECKING:
    from deferdump.tools.tlc.output import TlcResult


#: Worker methods whose behaviour per rank matters with two ranks (saves, waits, reports).
RANKED_METHODS = frozenset({"save_kv_layer", "wait_for_save", "get_finished", "handle_preemptions",
                            "_wait_pending_dump_task"})

#: Save labels under which no dump outlives the call (nothing in flight for a delayed free to cover).
NO_TRANSFER_SAVES = frozenset({"pass", "base", "sync_save"})
log = logging.getLogger(__name__)

Verdict = Literal["safe", "unsafe", "unknown"]

_PATH_WORDS: dict[str, str] = {
    "hma": "top level, HMA path (request_finished_all_groups)",
    "non_hma": "top level, non-HMA path (request_finished)",
    "multi": "MultiConnector child beside a non-HMA delaying sibling",
}
_CASE_ORDER: dict[str, int] = {"single": 0, "mla": 1, "layerwise": 2, "hybrid": 3}
_CASE_WORDS: dict[str, str] = {
    "single": "",
    "hybrid": "hybrid model (full attention + sliding window: out-of-window blocks freed while running)",
    "mla": "MLA model (two ranks, only rank 0 dumps)",
    "layerwise": "two attention layers (one save per layer)",
}
#: The hybrid case of a class that is not ``SupportsHMA``: vLLM turns its hybrid manager off, but a model whose
#: every layer is sliding-window keeps its one sliding-window group (kv_cache_utils.py ~1690-1703).
_SLIDING_ONLY_WORDS = ("sliding-window model (every layer sliding-window: vLLM keeps that group without "
                       "SupportsHMA, so out-of-window blocks are freed while running)")


@dataclass(frozen=True)
class Context:
    """Where a connector class runs: vLLM's call path, and for a wrapper the inner class it was given."""

    path: CallPath
    inner: str | None = None
    case: Case = "single"

    @property
    def key(self) -> str:
        """The name of the case in ``--json`` (``"cases"``): the model kind, the path where a kind runs on
        two, and the inner class of a wrapper."""
        name = "multi" if self.path == "multi" else self.case
        return f"{name}[{self.inner}]" if self.inner else name

    def describe(self) -> str:
        words = _PATH_WORDS[self.path]
        if self.case == "hybrid" and self.path == "non_hma":
            words = f"{_SLIDING_ONLY_WORDS}, {words}"
        elif self.case != "single":
            words = f"{_CASE_WORDS[self.case]}, {words}"
        return f"{words}, wrapping {self.inner}" if self.inner else words

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "case": self.case, "inner": self.inner, "description": self.describe()}


@dataclass(frozen=True)
class ContextJudgement:
    """The verdict in one context, with the property TLC found violated and why it is unknown."""

    context: Context
    verdict: Verdict
    violated: str | None
    reasons: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)  # "Class.method" -> label, as injected
    counterexample: "TlcResult | None" = None  # TLC's trace of the violation (unknown: under the worst labels)
    model: str | None = None  # the generated module the counterexample comes from
    model_files: dict[str, str] = field(default_factory=dict)  # the generated module and cfg (a pass keeps its too)
    run: Any = None  # the replay of the counterexample against the class (``run.replay.ReplayOutcome``), if run
    source: str = "reading"  # where the verdict comes from: "reading", "reading, replayed" or "running"

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {**self.context.to_json(), "verdict": self.verdict, "violated": self.violated,
                                  "source": self.source}
        if self.reasons:
            out["reasons"] = list(self.reasons)
        if self.counterexample is not None:
            out["counterexample"] = counterexample_json(self.counterexample, self.model)
        if self.run is not None:
            out["run"] = self.run.to_json()
        return out


def counterexample_json(result: "TlcResult", model: str | None) -> dict[str, object]:
    from deferdump.tools.tlc.manifest import trace_json

    return {
        "model": model,
        "property": result.property,
        "kind": None if result.kind is None else result.kind.value,
        "trace": trace_json(result),
        "loop_index": result.loop_index,
    }


@dataclass(frozen=True)
class ConnectorJudgement:
    """One connector class: which definition runs for each method, and the verdict over its contexts."""

    name: str
    resolves: dict[str, str]
    verdict: Verdict
    violated: str | None
    context: Context | None
    reasons: tuple[str, ...]
    judgements: tuple[ContextJudgement, ...]

    def rejudged(self, judgements: tuple[ContextJudgement, ...]) -> "ConnectorJudgement":
        """The same class with its cases replaced (after running them): the verdict decided again."""
        return decide(self.name, self.resolves, judgements)

    @property
    def deciding(self) -> ContextJudgement | None:
        """The context judgement the verdict comes from (None when safe)."""
        return next((j for j in self.judgements if j.context == self.context and j.verdict == self.verdict), None)

    def to_json(self) -> dict[str, object]:
        context: dict[str, object] | None = None
        if self.context is not None:
            context = self.context.to_json()
            if self.reasons:
                context["reasons"] = list(self.reasons)
        out: dict[str, Any] = {
            "resolves": self.resolves, "verdict": self.verdict, "violated": self.violated, "context": context,
            "cases": {j.context.key: j.to_json() for j in self.judgements},
            "source": self.deciding.source if self.deciding is not None else "reading",
        }
        deciding = self.deciding
        if deciding is not None and deciding.counterexample is not None:
            out["counterexample"] = counterexample_json(deciding.counterexample, deciding.model)
        return out


@dataclass(frozen=True)
class MroReport:
    """Everything ``deferdump mro`` says about a set of files."""

    hierarchy: Hierarchy
    connectors: dict[str, ConnectorJudgement]
    tlc_runs: int
    cached_runs: int
    seconds: float
    imported_bases: tuple[BaseSource, ...] = ()  # bases imported by the given files: read from where, or why not
    given: frozenset[str] | None = None  # the files asked about (None: every analysed file)

    @property
    def shown(self) -> list[str]:
        """The classes of the files asked about (not those of files read only for a base)."""
        return [n for n in self.hierarchy.defined if self.given is None or self.hierarchy.classes[n].file in self.given]

    def to_json(self) -> dict[str, object]:
        classes = {
            name: {
                "bases": list(self.hierarchy.classes[name].bases),
                "mro": list(self.hierarchy.mro[name]),
                "defines": list(self.hierarchy.classes[name].methods),
            }
            for name in self.shown
        }
        bases = [{"name": b.name, "module": b.module, "importer": b.importer,
                  "read": str(b.path) if b.path is not None else None, "why_not": b.why or None}
                 for b in self.imported_bases]
        return {"classes": classes, "connectors": {n: j.to_json() for n, j in self.connectors.items()},
                "imported_bases": bases}


@dataclass(frozen=True)
class _Outcome:
    passed: bool
    violated: str | None
    result: "TlcResult | None" = None  # kept for a violation: its counterexample
    model: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # the generated module and cfg, by file name (pass or not)


#: BlockPool methods that take or drop a reference on a vLLM block (block_pool.py ~752 ``touch``, ``free_blocks``).
BLOCK_REFERENCE_CALLS = frozenset({"touch", "free_blocks"})


def block_references(hierarchy: Hierarchy, concrete: str) -> str | None:
    """Why the model's frees are not the class's: vLLM 0.32 hands a connector its block pool
    (``bind_kv_cache_manager`` / ``bind_gpu_block_pool``, base.py ~475-480), and a class that takes
    references on blocks there (``BlockPool.touch``, block_pool.py ~752) and drops them (``free_blocks``)
    keeps a block vLLM frees for the request out of the free queue until it lets go, or, dropping one it
    never took, frees a block a request still holds. The model frees blocks only as vLLM's requests do, so
    neither its counterexample (MooncakeStyleStoreConnector, thirteenth blind round: a finish answered
    False, the block pinned) nor its pass is the class's. Searched: the classes of ``concrete``'s MRO and
    the analysed classes it keeps instances of. None when none calls either."""
    owners = [o for o in hierarchy.mro[concrete] if not hierarchy.classes[o].external]
    for owner in list(owners):
        for facts in hierarchy.classes[owner].methods.values():
            owners += [k.partition(":")[2] for _, k in facts.attr_values if k.startswith("class:")
                       and k.partition(":")[2] in hierarchy.classes
                       and not hierarchy.classes[k.partition(":")[2]].external
                       and k.partition(":")[2] not in owners]
    for owner in owners:
        for name, facts in hierarchy.classes[owner].methods.items():
            used = sorted(facts.calls & BLOCK_REFERENCE_CALLS)
            if used:
                return (f"{owner}.{name} calls {used[0]}() on vLLM's block pool (bind_kv_cache_manager / "
                        "bind_gpu_block_pool, base.py ~475-480): the class takes or drops references on blocks "
                        "itself, so a block vLLM frees for a request may stay held, or one a request holds be "
                        "freed; the model frees blocks only as vLLM's requests do")
    return None


class ModelRunner:
    """Runs generated models with TLC, caching identical (table, context) runs within one judge."""

    def __init__(
        self, bounds: ModelBounds, timeout: float | None, spec_dir: Path | None = None, liveness: bool = False
    ) -> None:
        self.bounds = bounds
        self.liveness = liveness
        self.timeout = timeout
        self.spec_dir = spec_dir
        self._cache: dict[tuple[object, ...], _Outcome] = {}
        self.runs = 0
        self.cached = 0

    def spec_settings(self, directory: Path) -> tuple[dict[str, str], str]:
        """Values for the constants the protocol declares beyond the ones the judge sets (its context and
        bounds), and the spelling of the first rank (``0`` or ``w0``). Both come from the spec's own cfgs
        (``DirectSafety.cfg`` first), so a new model switch keeps the spec's choice."""
        declared: set[str] = set()
        for module in (f"{PROTOCOL_MODULE}.tla", "Connectors.tla"):
            path = directory / module
            if not path.is_file():
                raise JudgeError(f"{path}: the protocol model is missing")
            declared |= declared_constants(path.read_text(encoding="utf-8"))
        missing = sorted(declared - ASSIGNED_CONSTANTS)
        values: dict[str, str] = {}
        templates = [directory / TEMPLATE_CFG, *sorted(directory.glob("*.cfg"))]
        for template in reversed([t for t in templates if t.is_file()]):  # the preferred template wins
            values.update(cfg_assignments(template.read_text(encoding="utf-8")))
        if "Record" in missing:
            values["Record"] = "TRUE"  # a violation's counterexample is this tool's output: keep its calls
        unset = [name for name in missing if name not in values]
        if unset:
            raise JudgeError(
                f"{directory}: the model declares constants `deferdump mro` cannot set: {', '.join(unset)}"
            )
        return {name: values[name] for name in missing}, values.get("Rank0", "0")

    def check(
        self, table: ClassTable, inner: str, wrapper: bool, path: CallPath, case: Case = "single"
    ) -> _Outcome:
        key = (table.key(), inner, wrapper, path, self.liveness, case)
        if key in self._cache:
            self.cached += 1
            return self._cache[key]
        from deferdump.tools.tlc.specfiles import spec_dir
        from deferdump.tools.tlc.bridge import run_tlc

        directory = self.spec_dir or spec_dir()
        inherited, rank0 = self.spec_settings(directory)
        name = module_name(table, inner, wrapper, path, self.bounds, self.liveness, case)
        result = run_tlc(
            directory / f"{name}.tla",
            f"{name}.cfg",  # type: ignore[arg-type]
            workers=1,
            timeout=self.timeout,
            heap="512m",
            jvm_args=("-XX:TieredStopAtLevel=1",),
            extra_modules=(files := {name: module_text(name, table), f"{name}.cfg": config_text(
                inner, wrapper, path, self.bounds, inherited, self.liveness, rank0, case
            )}),
        )
        self.runs += 1
        status = getattr(result.status, "value", result.status)
        if status == "error":
            if getattr(result.kind, "value", result.kind) == "timeout":
                states = "" if result.distinct_states is None else f", {result.distinct_states} distinct states so far"
                raise ModelTimeout(f"TLC did not finish the model of {inner} ({path}, {case}) within "
                                   f"{self.timeout:g} s{states}: not decided (raise --timeout to decide it)")
            raise JudgeError(f"TLC could not check the model for {inner} ({path}, {case}): {result.message}")
        passed = status == "pass"
        outcome = _Outcome(
            passed=passed,
            violated=None if passed else result.property,
            result=None if passed else result,
            model=name,
            files=files,
        )
        log.info("TLC %s %s wrapper=%s %s %s: %s in %.1fs", name, inner, wrapper, path, case, status, result.seconds)
        self._cache[key] = outcome
        return outcome


class Judge:
    """Judges every connector of one hierarchy."""

    def __init__(self, hierarchy: Hierarchy, runner: ModelRunner) -> None:
        self.hierarchy = hierarchy
        self.reader = EffectReader(hierarchy)
        self.runner = runner

    # -- which definitions, which contexts ---------------------------------------------------------------
    def _forwarded_attrs(self, cls: str) -> dict[str, list[str]]:
        """attr -> the spec methods ``cls`` forwards to ``self.<attr>``."""
        attrs: dict[str, list[str]] = {}
        for method in SPEC_METHODS:
            owner = self.hierarchy.lookup(cls, method)
            if owner is None or self.hierarchy.classes[owner].external:
                continue
            related = (method, *FORWARD_ALIASES.get(method, ()))
            for forward in self.hierarchy.method(owner, method).forwards:
                if forward.method in related:
                    attrs.setdefault(forward.attr, []).append(method)
        return attrs

    def _init_assignments(self, cls: str) -> dict[str, tuple[str, ...]]:
        """attr -> the classes ``cls``'s ``__init__`` may assign to it, the ``__init__``s it reaches through
        ``super().__init__(...)`` included (vllm-ascend's ``AscendOffloadingConnector`` replaces only the worker its
        base's ``__init__`` built; the scheduler it forwards to is the base's). An attribute the nearer ``__init__``
        assigns keeps that one's classes."""
        assigned: dict[str, tuple[str, ...]] = {}
        owner, seen = self.hierarchy.lookup(cls, "__init__"), set()
        while owner is not None and owner not in seen and not self.hierarchy.classes[owner].external:
            seen.add(owner)
            for attr, classes in self.hierarchy.classes[owner].inner_classes.items():
                assigned.setdefault(attr, classes)
            chained = [d for d in self.hierarchy.method(owner, "__init__").delegations if d.method == "__init__"]
            owner = self.hierarchy.delegation_target(cls, chained[0]) if chained else None
        return assigned

    def inner_choices(self, cls: str) -> tuple[list[str | None], list[str]]:
        """The inner classes a wrapper may hold ([None] for a plain connector) and why some are unknown."""
        attrs = self._forwarded_attrs(cls)
        if not attrs:
            return [None], []
        assigned = self._init_assignments(cls)
        choices: list[str] = []
        reasons: list[str] = []
        for attr in attrs:
            candidates = assigned.get(attr, ())
            if not candidates:
                reasons.append(f"{cls} forwards to self.{attr}, but its __init__ assigns no recognisable class to it")
            for candidate in candidates:
                if candidate in self.hierarchy.connectors:
                    choices.append(candidate)
                elif candidate in self.hierarchy.classes and not self.hierarchy.classes[candidate].external:
                    reasons.append(f"{cls}.__init__ puts {candidate} in self.{attr}, a helper that is not a "
                                   "connector class: the model has no counterpart for calls into it")
                else:
                    reasons.append(f"{cls}.__init__ may put {candidate} in self.{attr}, which was not analysed")
        unique = list(dict.fromkeys(choices))
        if reasons:
            return [*unique, None], reasons
        return list(unique), reasons

    def unanalysed_inners(self, cls: str) -> list[str]:
        """Inner classes ``cls``'s ``__init__`` may choose that the analysed files do not define."""
        attrs = self._forwarded_attrs(cls)
        assigned = self._init_assignments(cls)
        return [c for attr in attrs for c in assigned.get(attr, ())
                if c not in self.hierarchy.connectors
                and (c not in self.hierarchy.classes or self.hierarchy.classes[c].external)]

    def contexts(self, cls: str) -> list[Context]:
        """Every way vLLM can run ``cls``: for each inner class a wrapper may hold, on its top-level path
        (HMA when ``cls`` is ``SupportsHMA``) with one KV-cache group, as a MultiConnector child, under an
        MLA model, under a model with a sliding-window group (a hybrid model on the HMA path; without
        ``SupportsHMA`` a model whose every layer is sliding-window, which keeps its sliding-window group with
        the hybrid manager off, kv_cache_utils.py ~1690-1703), and with two layers when a save may keep one
        task per layer."""
        hma = self.hierarchy.supports_hma(cls)
        top: CallPath = "hma" if hma else "non_hma"
        inners, reasons = self.inner_choices(cls)
        contexts: list[Context] = []
        for inner in inners:
            contexts += [Context(top, inner), Context("multi", inner)]
            contexts.append(Context(top, inner, "hybrid"))
            contexts.append(Context(top, inner, "mla"))
            saves = [l for l in self._labels(cls, inner, reasons) if l.method == "save_kv_layer"]
            if any(l.label in ("submit_layer", UNKNOWN) for l in saves):
                contexts.append(Context(top, inner, "layerwise"))
        return contexts

    def _labels(
        self, cls: str, inner: str | None, forward_reasons: Sequence[str], case: Case = "single"
    ) -> list[DefinitionLabel]:
        """Label every spec-method definition in the MROs of ``cls`` and its inner class. A preemption wait
        that selects tasks by their blocks is a fence or a plain preemption wait: the same without a hybrid
        model (nothing is freed while running), undecided with one."""
        concretes = [cls] + ([inner] if inner else [])
        labels: dict[tuple[str, str], DefinitionLabel] = {}
        for concrete in concretes:
            for owner in self.hierarchy.mro[concrete]:
                facts = self.hierarchy.classes[owner]
                methods = SPEC_METHODS if facts.external and facts.opaque else facts.methods
                for method in SPEC_METHODS:
                    if method not in methods:
                        continue
                    label = self.reader.label(concrete, owner, method)
                    if label.hybrid_reasons and case == "hybrid":
                        label = DefinitionLabel(owner, method, UNKNOWN, label.hybrid_reasons,
                                                beyond_model=label.beyond_model)
                    if case == "mla" and method in RANKED_METHODS and label.label != UNKNOWN \
                            and not facts.external:
                        ranked = self.reader.rank_reasons(concrete, owner, method)
                        if ranked:
                            label = DefinitionLabel(owner, method, UNKNOWN, ranked, beyond_model=label.beyond_model)
                    if label.label == AMBIGUOUS_PREEMPT:
                        label = DefinitionLabel(owner, method, "wait_preempted") if case != "hybrid" else (
                            DefinitionLabel(owner, method, UNKNOWN, (
                                f"{owner}.handle_preemptions waits tasks chosen by their blocks: a fence over "
                                "blocks freed while the request runs or a wait for preempted requests only; "
                                "the reader cannot tell which",)))
                    if label.label == "forward" and inner is not None and concrete == cls:
                        label = self.reader.forward_label(owner, method, inner)
                    if label.label == "forward" and (inner is None or concrete == inner):
                        why = tuple(forward_reasons) or (f"{owner}.{method} forwards, but no inner class is known",)
                        label = DefinitionLabel(owner, method, UNKNOWN, why)
                    previous = labels.get((owner, method))
                    if previous is not None and previous.label != label.label:
                        label = DefinitionLabel(
                            owner, method, UNKNOWN,
                            (f"{owner}.{method} behaves as {previous.label} for {cls} but {label.label} for {concrete}",),
                            beyond_model=(*previous.beyond_model, *label.beyond_model),
                        )
                    labels[(owner, method)] = label
            counted = self._finished_count_override(concrete) if case == "mla" else None
            owner = self.hierarchy.lookup(concrete, "get_finished")
            if counted is not None and owner is not None:
                labels[(owner, "get_finished")] = DefinitionLabel(owner, "get_finished", UNKNOWN, (counted,))
            reporter = self._reported_elsewhere(concrete)
            if reporter is not None:
                owner = self.hierarchy.lookup(concrete, "get_finished")
                if owner is not None:
                    labels[(owner, "get_finished")] = DefinitionLabel(owner, "get_finished", UNKNOWN, (reporter,))
            dynamic = self.hierarchy.lookup(concrete, "__getattr__")
            if dynamic is not None and not self.hierarchy.classes[dynamic].external:
                for method in SPEC_METHODS:  # Python asks __getattr__ only for what the MRO lacks
                    if method not in CONNECTOR_METHODS and not self._called_by(concrete, method):
                        continue  # a model helper (UCM's _wait_pending_dump_task) no code of the class calls
                    if self.hierarchy.lookup(concrete, method) is None and (dynamic, method) not in labels:
                        labels[(dynamic, method)] = DefinitionLabel(dynamic, method, UNKNOWN, (
                            f"{concrete} defines no {method}: Python asks {dynamic}.__getattr__ for it at run time, "
                            "and what that returns is not read",))
        return list(labels.values())

    def _table(
        self, cls: str, inner: str | None, labels: Iterable[DefinitionLabel], resolve_unknown: dict[str, str] | None
    ) -> tuple[ClassTable, dict[str, str]]:
        """The injected table (the wrapper renamed to the model's ``UCMConnector``) and the name map."""
        names: list[str] = []
        for concrete in [cls] + ([inner] if inner else []):
            names.extend(c for c in self.hierarchy.mro[concrete] if c not in names)
        rename: dict[str, str] = {n: n for n in names}
        if inner is not None:
            for n in names:
                if n == WRAPPER_NAME and n != cls:
                    rename[n] = f"{WRAPPER_NAME}_renamed"
            rename[cls] = WRAPPER_NAME
        behaviour: dict[tuple[str, str], str] = {}
        for label in labels:
            value = label.label
            if value == UNKNOWN and resolve_unknown is not None:
                if label.phantom and resolve_unknown is not PESSIMISTIC:
                    continue
                value = resolve_unknown[label.method]
            behaviour[(rename[label.owner], label.method)] = value
        table = ClassTable(
            classes=tuple(rename[n] for n in names),
            bases={rename[n]: tuple(rename[b] for b in self.hierarchy.classes[n].bases) for n in names},
            behaviour=behaviour,
        )
        return table, rename

    # -- judging -----------------------------------------------------------------------------------------
    def judge_context(self, cls: str, context: Context, inner_reasons: Sequence[str]) -> ContextJudgement:
        try:
            return self._judge_context(cls, context, inner_reasons)
        except ModelTimeout as timeout:  # one case undecided: unknown, never a verdict it did not check
            return ContextJudgement(context, "unknown", None, (str(timeout),))

    def _judge_context(self, cls: str, context: Context, inner_reasons: Sequence[str]) -> ContextJudgement:
        labels = self._labels(cls, context.inner, inner_reasons, context.case)
        shown = {f"{l.owner}.{l.method}": l.label for l in labels if not self.hierarchy.classes[l.owner].external}
        unknowns = [l for l in labels if l.label == UNKNOWN]
        reasons = tuple(dict.fromkeys(r for l in unknowns for r in l.reasons))
        stopping = self._stops_at_first_step(cls, context.inner, labels)
        if stopping:  # no run reaches a second step, so none reuses a block: never unsafe, never judged safe
            return ContextJudgement(context, "unknown", None, stopping, shown)
        target = context.inner or cls
        wrapper = context.inner is not None
        def check(table: ClassTable, rename: dict[str, str]) -> _Outcome:
            return self.runner.check(table, rename[target], wrapper, context.path, context.case)

        table, rename = self._table(cls, context.inner, labels, PESSIMISTIC)
        worst = check(table, rename)
        # definitions that do worse than their label (tasks lost): a pass proves nothing, an overwrite stands
        beyond = tuple(dict.fromkeys(r for l in labels for r in l.beyond_model))
        undecided = self._reading_cannot_decide(cls, context.inner, labels)
        if worst.passed:  # the passed model is kept: --run samples its schedules and runs the class through them
            def passed(verdict: Verdict, why: tuple[str, ...]) -> ContextJudgement:
                return ContextJudgement(context, verdict, None, why, shown, None, worst.model, worst.files)

            if beyond:
                return passed("unknown", beyond)
            hidden = tuple(dict.fromkeys(r for l in labels for r in l.reasons
                                         if HIDDEN_SUBMIT in r or UNSEEN_KEEPING in r))
            if hidden:  # the worst label's dumps are the model's, kept where its waits look; the class's are not
                return passed("unknown", hidden)
            untracked = self._tracking_the_worst_save_assumes(
                labels, context.case, context.case == "mla" and self._tracks_in_layer_save(cls, context.inner))
            if untracked:  # the worst save label tracks every request on every rank; the class may not
                return passed("unknown", untracked)
            leaks = self._success_only_releases(cls, context.inner)
            if leaks:  # a handle released only after a wait that returns: the model's handles are the PR helper's
                return passed("unknown", leaks)
            shared = self._tensor_identity(cls, context.inner) if context.case == "layerwise" else ()
            if shared:  # the model's two layers never share a cache; vLLM's KV-sharing layers do
                return passed("unknown", shared)
            concretes = [cls] + ([context.inner] if context.inner else [])
            stale = tuple(r for c in concretes for r in unreplaced_tables(self.hierarchy, c))
            if stale:  # the class's dumps may read ids it kept from before a preemption; the model's never do
                return passed("unknown", stale)
            unwaited = tuple(r for c in concretes for r in (*unreached_task_holders(self.reader, c),
                                                            *copied_task_records(self.reader, c),
                                                            *dropped_handoffs(self.reader, c),
                                                            *entries_left_behind(self.reader, c)))
            if unwaited:  # dumps kept where no finish or preemption waits them: the model's are waited there
                return passed("unknown", unwaited)
            chosen = tuple(r for c in concretes for r in (*counted_victims(self.reader, c),
                                                          *unshipped_victims(self.reader, c)))
            if chosen:  # the workers wait the dumps of requests the class picked, not of those vLLM preempted
                return passed("unknown", chosen)
            outside = self._transfers_outside_the_model(cls, context.inner)
            if outside:  # more transfers can only add hazards: an unsafe verdict stands, a safe one cannot
                return passed("unknown", outside)
            unseen = self._delay_without_transfers(cls, context.inner, labels)
            if unseen:
                return passed("unknown", unseen)
            if undecided:  # the model's dumps or waits are not the class's: its pass proves nothing
                return passed("unknown", undecided)
            return passed("safe", ())
        if beyond and worst.violated != "NoOverwriteWhileDumpingInv":
            # losing a task removes waits, which removes no overwrite but may remove other violations
            return ContextJudgement(context, "unknown", worst.violated, (*reasons, *beyond), shown, worst.result,
                                    worst.model, worst.files)
        if undecided:  # neither way: the model's dumps or waits are not the class's (the counterexample stays)
            return ContextJudgement(context, "unknown", worst.violated, (*reasons, *undecided), shown, worst.result,
                                    worst.model, worst.files)
        if not unknowns:
            return self._unsafe_unless_unreachable(cls, context, worst, shown, labels)
        benign = OPTIMISTIC_HYBRID if context.case == "hybrid" else OPTIMISTIC
        # Every benign reading of the unknown definitions must fail before the class is called unsafe: the
        # PR's labels; a save that completes before it returns; a wait_for_save that waits every pending task
        # (a drain the reader cannot follow); a handle_preemptions that waits every pending task before the
        # forward (a flush, which covers every block freed since); a finish that delays every request (the answer (True, ...)
        # computed in a way the reader cannot follow, whose worker reports them all).
        readings = [benign]
        if any(l.method in ("save_kv_layer", "wait_for_save") for l in unknowns):
            readings.append({**OPTIMISTIC_SYNC, "handle_preemptions": benign["handle_preemptions"]})
        if any(l.method == "wait_for_save" for l in unknowns):  # it may wait every pending task (a drain)
            readings.append({**benign, "wait_for_save": "wait_all"})
        if any(l.method == "handle_preemptions" for l in unknowns):  # it may wait every pending task before the forward
            readings.append({**benign, "handle_preemptions": "wait_all_always"})
        if any(l.method in ("request_finished", "request_finished_all_groups") for l in unknowns):
            readings += [{**reading, **DELAY_ALL} for reading in list(readings)]
        best = None
        for reading in readings:
            table, rename = self._table(cls, context.inner, labels, reading)
            outcome = check(table, rename)
            if best is None or outcome.passed:
                best = outcome
            if outcome.passed:
                break
        assert best is not None
        silent = tuple(r for l in unknowns if l.method == "get_finished" for r in l.reasons if SILENT_WAITS in r)
        if silent and not best.passed:
            # every benign reading reports what it waits, and waits the finished tracked requests' tasks only; the
            # class reports nothing and may wait more (every pending task, each step: a synchronous save in effect).
            # A report of a request the child did not delay is one the class never makes, and under MultiConnector
            # it counts toward the free (DeferredTrackerStore, keyed safe as a child: its waits come before its
            # sibling's report)
            return ContextJudgement(context, "unknown", worst.violated, (*reasons, *silent), shown, worst.result,
                                    worst.model, worst.files)
        if not best.passed and not (beyond and best.violated != "NoOverwriteWhileDumpingInv"):
            return self._unsafe_unless_unreachable(cls, context, best, shown, labels)
        return ContextJudgement(context, "unknown", worst.violated, (*reasons, *beyond), shown, worst.result,
                                worst.model, worst.files)

    def _tracks_in_layer_save(self, cls: str, inner: str | None) -> bool:
        """Does ``save_kv_layer`` (as ``cls`` or its inner class resolves it, with the helpers it reaches) add requests
        to a tracking set? There, any early return of a rank (a replica, a layer it does not hold) skips the tracking."""
        for concrete in [cls] + ([inner] if inner else []):
            owner = self.hierarchy.lookup(concrete, "save_kv_layer")
            if owner is not None and not self.hierarchy.classes[owner].external \
                    and "add" in self.reader.effect(concrete, owner, "save_kv_layer").tracking_ops:
                return True
        return False

    @staticmethod
    def _tracking_the_worst_save_assumes(labels: Sequence[DefinitionLabel], case: Case,
                                         layer_tracking: bool = False) -> tuple[str, ...]:
        """Why a pass of the worst reading proves nothing for an unknown save: that reading (``poll_track_submit``)
        tracks every request it dumps, on every rank, where the class tracks some only under a test
        (``BackfillDumpConnector``, twenty-eighth blind round) or, under MLA, branches on the rank in a way the model's
        ranks cannot follow (a rank returning before it tracks never reports: ``ReplicaAwareLaneConnector``,
        twenty-ninth), or, under MLA, does not track in ``wait_for_save`` but in ``save_kv_layer`` (``layer_tracking``),
        where a rank may return before it tracks (``StageLocalTrackingConnector``, twenty-ninth)."""
        return tuple(dict.fromkeys(
            r for l in labels if l.label == UNKNOWN for r in l.reasons
            if (l.method == "wait_for_save" and GUARDED_TRACKING in r)
            or (case == "mla" and l.method in SAVE_METHODS and RANK_DECIDED in r)
            or (case == "mla" and layer_tracking and l.method == "wait_for_save" and UNTRACKED_SAVE in r)))

    def _success_only_releases(self, cls: str, inner: str | None) -> tuple[str, ...]:
        """Why a pass proves nothing for a class that releases something (an event, a handle) only when a store wait
        returns: a definition in its MRO (other than ``_wait_pending_dump_task``, whose release the model checks)
        makes a release-like call after the wait in a ``try`` whose ``except`` does not make it, with no
        ``finally``. A wait that raises skips the release, PR #989's release-on-success bug, which the model's
        ``NoEventLeakInv`` sees only in the PR's helper (EventFencedStageLeanConnector, twenty-ninth blind round)."""
        why: list[str] = []
        for concrete in [cls] + ([inner] if inner else []):
            for owner in self.hierarchy.mro[concrete]:
                facts = self.hierarchy.classes[owner]
                if facts.external:
                    continue
                for name, method in facts.methods.items():  # an overridden one too: super() may reach it
                    if name == "_wait_pending_dump_task":
                        continue
                    why += [f"{owner}.{name} line {line}: {call}() follows a store wait in a try whose except does "
                            "not make it, and no finally does: a wait that raises leaves what it releases held (PR "
                            "#989's release-on-success bug), which the model checks only in _wait_pending_dump_task"
                            for line, call in method.success_releases]
        return tuple(dict.fromkeys(why))

    def _tensor_identity(self, cls: str, inner: str | None) -> tuple[str, ...]:
        """Why a pass with two layers proves nothing for a save path that asks a KV-cache tensor its identity
        (``data_ptr()``, ``untyped_storage()``): vLLM binds a layer with ``kv_sharing_target_layer_name`` to its
        target's tensor (gpu_model_runner.py ``initialize_kv_cache_tensors``, ~7008-7010), so two layers share one
        identity, and whatever the class keys by it (a task per tensor: the twenty-eighth blind round's
        ``PtrKeyedLayerwiseConnector``, whose second layer's task replaced the first's unwaited) is shared too; the
        model's layers never share a cache."""
        why: list[str] = []
        for concrete in [cls] + ([inner] if inner else []):
            for method in SAVE_METHODS:
                owner = self.hierarchy.lookup(concrete, method)
                if owner is None or self.hierarchy.classes[owner].external:
                    continue
                for facts in self.reader._reached(concrete, owner, method):  # noqa: SLF001
                    asked = sorted(facts.calls & TENSOR_IDENTITY_CALLS)
                    if asked:
                        why.append(f"{facts.owner}.{facts.name} asks a KV-cache tensor's identity ({asked[0]}()): "
                                   "layers sharing a cache (kv_sharing_target_layer_name) share it, and what the class "
                                   "keys by it with them, where the model's layers never share a cache")
        return tuple(dict.fromkeys(why))

    def _stops_at_first_step(self, cls: str, inner: str | None, labels: Sequence[DefinitionLabel]) -> tuple[str, ...]:
        """Why ``cls`` (holding ``inner``) cannot get past vLLM's first step: a method vLLM calls every step
        resolves to an abstract or always-raising definition, or the class cannot be built at all because it
        leaves ``SupportsHMA.request_finished_all_groups`` (an @abstractmethod) undefined (the eighteenth blind
        round's ``_ForwardingHMAWrapper``: TypeError, for vLLM and for a MultiConnector building its child).
        Empty when nothing stops it."""
        by_key = {(l.owner, l.method): l for l in labels}
        why: list[str] = []
        for concrete in [cls] + ([inner] if inner else []):
            owners = self.hierarchy.resolves(concrete)
            hma = owners.get("request_finished_all_groups", "")
            facts = self.hierarchy.classes.get(hma)
            if facts is not None and facts.external and facts.methods["request_finished_all_groups"].body == "abstract":
                why.append(f"{hma}.request_finished_all_groups is an @abstractmethod {concrete} does not define: "
                           f"constructing {concrete} raises TypeError, so no run reaches a reused block")
            why += [f"{left} is an @abstractmethod {concrete} does not override: constructing {concrete} raises "
                    "TypeError (a connector is an ABC), so no run reaches a reused block"
                    for left in self.hierarchy.abstract_left(concrete)]
            for method in EVERY_STEP_METHODS:
                label = by_key.get((owners.get(method, ""), method))
                if label is not None and any(ABSTRACT_REASON in r for r in label.reasons):
                    why += [f"{r} (vLLM calls {method} in every step: no run reaches a reused block)"
                            for r in label.reasons if ABSTRACT_REASON in r]
        return tuple(dict.fromkeys(why))

    def _reading_cannot_decide(self, cls: str, inner: str | None, labels: Sequence[DefinitionLabel]) -> tuple[str, ...]:
        """Why a counterexample of the model is not a run of the class, nor a pass a proof (ninth blind round):

        * a finish that keeps its block ids in ``self`` state dumps the finished request's blocks later (while the
          delay holds them), where the model dumps blocks as the steps compute them: the model's running dumps,
          preempted or slid out of the window, are not the class's (``BlockListDumpConnector``,
          ``PriorityTierConnector``);
        * a ``get_finished`` that waits store tasks not chosen by the requests it reports may wait every task it
          holds, each step: then no dump outlives its step, which no label says (``WriteThroughDrainConnector``).
        """
        why: list[str] = []
        for concrete in [cls] + ([inner] if inner else []):
            for method in ("request_finished", "request_finished_all_groups"):
                for owner in self.hierarchy.mro[concrete]:  # every definition: an override may call super()'s
                    if method not in self.hierarchy.classes[owner].methods or self.hierarchy.classes[owner].external:
                        continue
                    facts = self.hierarchy.method(owner, method)
                    blocks = facts.param_names[1] if len(facts.param_names) > 1 else None
                    if blocks is not None and blocks in facts.kept_params:
                        why.append(f"{owner}.{method} keeps the finished request's `{blocks}` for a later dump: the "
                                   "class dumps blocks at the finish, which its delay holds, while the model dumps "
                                   "them as each step computes them")
        why += [r for concrete in [cls] + ([inner] if inner else []) if (r := block_references(self.hierarchy, concrete))]
        for concrete in [cls] + ([inner] if inner else []):  # frees decided on the scheduler side (round 24)
            for owner in self.hierarchy.mro[concrete]:
                facts = self.hierarchy.classes[owner]
                if not facts.external and "update_connector_output" in facts.methods:
                    why += [f"{owner}.update_connector_output {what} (line {line}): vLLM frees what the output's "
                            "finished_sending holds after that call, so the class's scheduler side decides frees the "
                            "model's get_finished reports do not"
                            for line, what in facts.methods["update_connector_output"].report_rewrites]
        why += self._tracking_dropped_outside_the_model(cls, inner)
        why += [f"{l.reasons[0]}; it drains every task it holds each step, so that no dump outlives its step"
                for l in labels if l.method == "get_finished" and l.label == UNKNOWN and l.reasons
                and UNSELECTED_REPORT_WAITS in l.reasons[0]
                and self._sweeps_every_task(cls, l.owner)]
        return tuple(dict.fromkeys(why))

    def _tracking_dropped_outside_the_model(self, cls: str, inner: str | None) -> list[str]:
        """A method vLLM calls where the model has no action that takes requests out of the tracking set (the
        twenty-fifth blind round's ``CompletionAwareDumpConnector`` drops them in ``update_connector_output`` on the
        workers' word that a dump landed, while a later dump of the same request runs): the class's finish answers
        False for requests the model's tracking still holds. Judged safe on the model's tracking before."""
        why: list[str] = []
        for concrete in [cls] + ([inner] if inner else []):
            for method in UNMODELLED_SCHEDULER_METHODS:  # the finish reads the scheduler side's set
                owner = self.hierarchy.lookup(concrete, method)
                if owner is None or self.hierarchy.classes[owner].external:
                    continue
                if self.reader.effect(concrete, owner, method).tracking_ops & {"remove", "assign"}:
                    why.append(f"{owner}.{method} takes requests out of the tracking set: vLLM calls it every step "
                               "where the model has no action, so the class may free at once a request the model "
                               "still tracks (and delays)")
        return why

    def _sweeps_every_task(self, cls: str, owner: str) -> bool:
        """Does ``owner``'s ``get_finished`` (or a helper it reaches) wait, in an unconditional loop over a whole
        ``self`` table, each entry (directly, or through a helper that waits)?"""
        for facts in self.reader._reached(cls, owner, "get_finished"):  # noqa: SLF001
            for callee in facts.full_sweeps:
                if callee == "wait":
                    return True
                target = self.hierarchy.lookup(cls, callee)
                if target is not None and not self.hierarchy.classes[target].external \
                        and self.reader.effect(cls, target, callee).calls & WAIT_CALLS:
                    return True
        return False

    def _finished_count_override(self, concrete: str) -> str | None:
        """Why the MLA model's count of reports does not hold for ``concrete``: vLLM frees a delayed request once
        ``connector.get_finished_count() or world_size`` ranks reported it (KVOutputAggregator.from_connector,
        kv_connector/utils.py ~76-77), and a class defining ``get_finished_count`` (other than ``return None``)
        may free it after fewer ranks' reports than the model's every rank. None otherwise."""
        owner = self.hierarchy.lookup(concrete, "get_finished_count")
        if owner is None or self.hierarchy.classes[owner].external:
            return None
        facts = self.hierarchy.method(owner, "get_finished_count")
        if facts.constant_return == "None" or facts.body == "noop":
            return None
        return (f"{owner}.get_finished_count sets how many ranks' reports free a request (vLLM's KVOutputAggregator "
                "uses it instead of the world size): the MLA model frees a request only once every rank reported it")

    def _called_by(self, concrete: str, method: str) -> bool:
        """Does any analysed method in ``concrete``'s MRO call ``self.<method>()``?"""
        return any(method in m.self_calls for owner in self.hierarchy.mro[concrete]
                   if not self.hierarchy.classes[owner].external
                   for m in self.hierarchy.classes[owner].methods.values())

    def _reported_elsewhere(self, concrete: str) -> str | None:
        """Why ``get_finished``'s label does not say what vLLM sees: vLLM 0.32's runners call
        ``get_transfer_results`` (kv_connector_model_runner_mixin.py:94; the base wraps ``get_finished``), and
        ``concrete`` overrides it with a definition that never calls ``get_finished`` (itself, through a
        ``super()`` reaching the base, or forwarded to an inner connector). None otherwise."""
        owner = self.hierarchy.lookup(concrete, "get_transfer_results")
        seen: set[str] = set()
        while owner is not None and not self.hierarchy.classes[owner].external and owner not in seen:
            seen.add(owner)
            facts = self.hierarchy.method(owner, "get_transfer_results")
            if facts.opaque:
                return f"{owner}.get_transfer_results: {facts.opaque[-1]}"
            if "get_finished" in facts.self_calls or any(f.method == "get_finished" for f in facts.forwards):
                return None
            supers = [d for d in facts.delegations if d.method == "get_transfer_results"]
            if not supers:
                return (f"{owner}.get_transfer_results, which vLLM calls instead of get_finished "
                        "(kv_connector_model_runner_mixin.py:94), does not call get_finished: what the class "
                        "reports each step is not what get_finished does")
            owner = self.hierarchy.delegation_target(concrete, supers[0])
        return None

    def _delay_without_transfers(
        self, cls: str, inner: str | None, labels: Sequence[DefinitionLabel]
    ) -> tuple[str, ...]:
        """Why a pass proves nothing for a class that may delay the free of a finished request while no save
        method of it submits a transfer the model follows: the delay then covers reads the model does not
        see (a remote engine pulling the blocks, as vLLM's P/D connectors have it, or a thread started
        elsewhere), and the model, with nothing in flight, passes whatever the class does. Empty otherwise."""
        by_key = {(l.owner, l.method): l for l in labels}

        def resolved(concrete: str, method: str) -> DefinitionLabel | None:
            owner = self.hierarchy.lookup(concrete, method)
            while owner is not None:
                label = by_key.get((owner, method))
                if label is None or label.label != "super":
                    return label
                owner = self.hierarchy.lookup(concrete, method, after=owner)
            return None

        concretes = [cls] + ([inner] if inner else [])
        found = [l for c in concretes for m in ("save_kv_layer", "wait_for_save") if (l := resolved(c, m))]
        if any(l.label not in NO_TRANSFER_SAVES and not l.label.startswith("forward") for l in found):
            return ()
        reports = [l for c in concretes if (l := resolved(c, "get_finished")) and l.label != "base"]
        if not reports:
            return ()  # nothing is ever reported: a delayed request's blocks never return to the pool
        delaying = [
            l for c in concretes for m in ("request_finished", "request_finished_all_groups")
            if (l := resolved(c, m)) and l.label != "base" and not l.label.startswith(("forward", "call_"))
            and not self.hierarchy.classes[l.owner].external
            and self.reader.effect(c, l.owner, m).delay_answer is not False
        ]
        if not delaying:
            return ()
        first = delaying[0]
        how = "may return True" if first.label == UNKNOWN else f"delays ({first.label})"
        return (f"{first.owner}.{first.method} {how}, but no save method submits a transfer the model follows: "
                "a delayed free then covers reads outside the model (a remote engine pulling the blocks, a "
                "thread started elsewhere), which a run with nothing in flight cannot check",)

    def _transfers_outside_the_model(self, cls: str, inner: str | None) -> tuple[str, ...]:
        """Why the model does not cover every transfer of ``cls`` (holding ``inner``): a worker method vLLM
        calls each step, in which the model starts none, submits to the store or hands work to another thread
        or stream (EagerDuplexConnector's promotion push, submitted from start_load_kv to a pool, was judged
        safe: the model saw no save at all). Empty when every transfer starts where the model has one."""
        why: list[str] = []
        for concrete in [cls] + ([inner] if inner else []):
            for method in OUTSIDE_METHODS:
                owner = self.hierarchy.lookup(concrete, method)
                if owner is None or self.hierarchy.classes[owner].external:
                    continue
                started = self.reader.transfer_started(concrete, owner, method, inner if concrete == cls else None)
                if started is not None:
                    why.append(f"{owner}.{method} may start a transfer that outlives the call ({started}); the "
                               "model's transfers start only in save_kv_layer and wait_for_save, so one started "
                               "there may read blocks vLLM frees in a way no model run follows")
        return tuple(dict.fromkeys(why))

    def _waits_outside_the_model(self, cls: str, inner: str | None) -> tuple[str, ...]:
        """Why a counterexample may leave running a dump ``cls`` (holding ``inner``) has ended: a worker method vLLM
        calls every step, where the model has no action, waits store tasks (the twenty-fifth blind round's
        ``ReleaseSettledLayerConnector`` waits the step's layer dumps in ``clear_connector_metadata``, before the step's
        output reaches the scheduler: judged unsafe on a model with no wait at all). Empty when none does."""
        why: list[str] = []
        for concrete in [cls] + ([inner] if inner else []):
            holders = self._dump_holders(concrete)
            for method in UNMODELLED_STEP_METHODS:
                owner = self.hierarchy.lookup(concrete, method)
                if owner is None or self.hierarchy.classes[owner].external:
                    continue
                if not self.reader.effect(concrete, owner, method).calls & WAIT_CALLS:
                    continue
                # a wait over the table the saves keep their tasks in (a load wait in wait_for_layer_load reads
                # another one); a save keeping its tasks where the reader cannot see counts every wait
                read = {a for f in self.reader._reached(concrete, owner, method)  # noqa: SLF001
                        for a, _ in f.attr_ops}
                touched = sorted(read & holders)
                if touched:
                    why.append(f"{owner}.{method} waits store tasks of self.{touched[0]}, which its saves fill: vLLM "
                               "calls it in every step "
                               "(kv_connector_model_runner_mixin.py ~72-105) where the model has no action, so the "
                               "counterexample may leave running a dump the class has ended by then")
        return tuple(dict.fromkeys(why))

    def _dump_holders(self, cls: str) -> set[str]:
        """The ``self`` attributes ``cls``'s saves (``save_kv_layer``, ``wait_for_save`` and their helpers) put
        their store tasks into."""
        holders: set[str] = set()
        for method in ("save_kv_layer", "wait_for_save"):
            owner = self.hierarchy.lookup(cls, method)
            if owner is not None and not self.hierarchy.classes[owner].external:
                holders |= self.reader.effect(cls, owner, method).kept_in
        return holders

    def _finish_raises(self, cls: str, context: Context, labels: Sequence[DefinitionLabel]) -> str | None:
        """Why a finish on ``context``'s path never returns: the method vLLM calls there (``request_finished_all_groups``
        on the HMA path, ``request_finished`` otherwise) is the class's own and only raises (its label carries
        ``ABSTRACT_REASON``); the class is built, and vLLM's first finish stops the engine."""
        method = "request_finished_all_groups" if context.path == "hma" else "request_finished"
        owner = self.hierarchy.resolves(cls).get(method)
        for label in labels:
            if (label.owner, label.method) == (owner, method) and any(ABSTRACT_REASON in r for r in label.reasons):
                return (f"{owner}.{method} raises: vLLM's first finish of a request stops the engine there, and "
                        "this counterexample goes on past a finish, which no run does")
        return None

    def _unsafe_unless_unreachable(
        self, cls: str, context: Context, outcome: "_Outcome", shown: dict[str, str],
        labels: Sequence[DefinitionLabel],
    ) -> ContextJudgement:
        """A hybrid-model violation of a wrapper holding ``context.inner`` is a real one only if a hybrid
        model can reach that inner class. When ``__init__`` may also choose classes the analysed files do
        not define (UCM's ``UCMFAWAConnector`` for full + sliding-window layouts, chosen by
        ``can_handle_kv_cache_config``), the hybrid model may be served by one of them instead: unknown.
        A counterexample that passes a finish whose method only raises is no run either (``_finish_raises``;
        the model's ``request_finished`` call records mark a finish, spec/README.md "Call records"): unknown;
        one that reaches its violation before any finish stands. A class waiting store tasks where the model has no
        action (``_waits_outside_the_model``) may have ended the dump the counterexample overwrites: unknown."""
        unbuilt = [(c, left) for c in [cls] + ([context.inner] if context.inner else [])
                   for left in self.hierarchy.base_abstract_left(c, _PROTOCOL_ABSTRACTS)]
        if unbuilt:  # the counterexample runs vLLM's abstract stub where the class has no method: no run does
            why = tuple(f"{c} does not define {left.split('.')[-1]}, an @abstractmethod of vLLM's "
                        f"{left.split('.')[0]}: constructing {c} raises TypeError, so no run makes this "
                        "counterexample's calls" for c, left in unbuilt)
            return ContextJudgement(context, "unknown", outcome.violated, why, shown, outcome.result, outcome.model,
                                    outcome.files)
        waited = self._waits_outside_the_model(cls, context.inner)
        waited += tuple(r for c in [cls] + ([context.inner] if context.inner else []) for r in widened_victims(self.reader, c))
        waited += tuple(r for c in [cls] + ([context.inner] if context.inner else [])
                        for r in finish_plans(self.reader, c))
        if waited:  # the counterexample stays: --run replays it, with every method vLLM calls
            return ContextJudgement(context, "unknown", outcome.violated, waited, shown, outcome.result, outcome.model,
                                    outcome.files)
        raising = self._finish_raises(cls, context, labels)
        trace = outcome.result.trace if outcome.result is not None else []
        if raising and any("request_finished" in str(state.values.get("action")) for state in trace):
            return ContextJudgement(context, "unknown", outcome.violated, (raising,), shown, outcome.result,
                                    outcome.model, outcome.files)
        if context.case == "hybrid" and context.inner is not None:
            others = self.unanalysed_inners(cls)
            if others:
                why = (f"{cls}.__init__ may also choose {', '.join(others)}, not in the analysed files: which "
                       f"inner class serves a hybrid (sliding-window) model is decided at run time from the "
                       f"KV-cache layout, so the hybrid model may never reach {context.inner}; pass the files "
                       "defining those classes",)
                return ContextJudgement(context, "unknown", outcome.violated, why, shown, outcome.result, outcome.model,
                                        outcome.files)
        return ContextJudgement(context, "unsafe", outcome.violated, (), shown, outcome.result, outcome.model,
                                outcome.files)

    def judge(self, cls: str, cases: Iterable[str] | None = None) -> ConnectorJudgement:
        """``cls`` in every context vLLM can run it in, or only in the ``cases`` named by their keys
        (``single``, ``hybrid[Inner]``…; a key the class has no context for is an error)."""
        _, inner_reasons = self.inner_choices(cls)
        contexts = self.contexts(cls)
        if cases is not None:
            wanted = set(cases)
            missing = wanted - {c.key for c in contexts}
            if missing:
                raise MroError(f"{cls} is not judged in {', '.join(sorted(missing))}: its cases are "
                               f"{', '.join(c.key for c in contexts)}")
            contexts = [c for c in contexts if c.key in wanted]
        judgements = tuple(self.judge_context(cls, c, inner_reasons) for c in contexts)
        return decide(cls, self.hierarchy.resolves(cls), judgements)


#: vLLM's abstract methods the protocol lives in (the save and what the scheduler ships): a class that leaves one
#: to vLLM's base is judged as if the base's empty body ran, which no built class does. The others (loads, the
#: per-layer save) are read as the no-ops a connector that loads nothing writes, as the corpus's sketches do.
_PROTOCOL_ABSTRACTS = ("wait_for_save", "build_connector_meta")


def decide(cls: str, resolves: dict[str, str], judgements: tuple[ContextJudgement, ...]) -> ConnectorJudgement:
    """The class verdict: the worst case decides; among equals the plainest model (one group before MLA, two
    layers, hybrid) gives the counterexample that is easiest to read."""
    def plainest(verdict: str) -> ContextJudgement | None:
        found = [j for j in judgements if j.verdict == verdict]
        return min(found, key=lambda j: _CASE_ORDER[j.context.case]) if found else None

    deciding = plainest("unsafe") or plainest("unknown")
    return ConnectorJudgement(
        name=cls,
        resolves=resolves,
        verdict=deciding.verdict if deciding else "safe",
        violated=deciding.violated if deciding else None,
        context=deciding.context if deciding else None,
        reasons=deciding.reasons if deciding else (),
        judgements=judgements,
    )


def judge_files(
    paths: Sequence[Path | str],
    *,
    tracking_attr: str | None = None,
    bounds: ModelBounds = ModelBounds(),
    timeout: float | None = 300.0,
    only: Sequence[str] | None = None,
    liveness: bool = False,
    runner: ModelRunner | None = None,
    on_connector: Callable[[str], None] | None = None,
    import_roots: Sequence[Path] = (),
) -> MroReport:
    """Read ``paths`` (never importing them), with the files their connectors' imported bases come from
    (:mod:`imported_bases`: found as Python would, ``import_roots`` searched first), linearize, and judge every
    connector class of ``paths`` with TLC.

    Raises :class:`MroError` subclasses for a file that cannot be read or parsed, an impossible hierarchy,
    no connector classes, or a model TLC cannot check; any other :class:`UserError` from the TLC bridge
    (no Java, a bad jar) passes through. ``only`` restricts judging to some connector classes (every class
    is still read and linearized); ``liveness`` also checks that delayed requests are eventually freed; a
    shared ``runner`` (which then decides ``bounds``/``timeout``/``liveness``) shares its cache of TLC runs.
    """
    started = time.perf_counter()
    followed, imported = imported_base_files([Path(p) for p in paths], import_roots)
    for base in imported:
        log.info("%s: base %s from %s %s", base.importer, base.name, base.module,
                 f"read from {base.path}" if base.path is not None else f"not read: {base.why}")
    hierarchy = build_hierarchy(read_files([*paths, *followed], tracking_attr), sources=[str(p) for p in paths])
    given = frozenset(str(Path(p)) for p in paths)
    selected = [name for name in hierarchy.connectors if hierarchy.classes[name].file in given]
    if only is not None:
        missing = [name for name in only if name not in selected]
        if missing:
            raise MroError(f"not a connector class in the given files: {', '.join(missing)}")
        selected = [name for name in selected if name in only]
    runner = runner or ModelRunner(bounds, timeout, liveness=liveness)
    runs_before, cached_before = runner.runs, runner.cached
    judge = Judge(hierarchy, runner)
    connectors: dict[str, ConnectorJudgement] = {}
    for cls in selected:
        if on_connector is not None:
            on_connector(cls)
        connectors[cls] = judge.judge(cls)
    return MroReport(
        hierarchy, connectors, runner.runs - runs_before, runner.cached - cached_before, time.perf_counter() - started,
        tuple(imported), given,
    )


__all__ = [
    "Context",
    "ContextJudgement",
    "ConnectorJudgement",
    "Judge",
    "ModelRunner",
    "decide",
    "MroReport",
    "judge_files",
]
