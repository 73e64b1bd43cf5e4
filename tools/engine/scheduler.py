"""The simulated vLLM 0.32 scheduler and block pool: enough to drive a KV connector as vLLM does.

What it keeps from vLLM 0.32's V1 scheduler (`v1/core/sched/scheduler.py`): a token budget per step with chunked
prefill; running requests first, FCFS; when blocks run out, the *last* running request is preempted, its
blocks freed at once (no `request_finished`), its computed tokens reset, and it goes back to the front of
the waiting queue; no waiting request is admitted in a step that preempted; admission asks the connector
for external hits (`get_num_new_matched_tokens`, then `update_state_after_alloc`); every finished request
(stop or abort) goes through `request_finished`, which may delay the free until every worker rank reported
it in `finished_sending`; finished ids reach workers in the *next* step. A block-load failure follows
`kv_load_failure_policy` (see `_apply_load_failures`).

The environment's choices — which running request to preempt although blocks remain, which requests the
clients abort, which token is sampled — come from a `Moves` object (`tools/engine/moves.py`): a seeded
policy for bench and soak, a scripted one a property test drives move by move. `abort` finishes a request
between steps, as vLLM's `finish_requests` does when a client disconnects.

No prefix caching inside the pool: every block belongs to exactly one request, so "blocks held by
finished requests" is exact.

Asynchronous loads (a connector whose lookup answers `load_async=True`): vLLM's WAITING_FOR_REMOTE_KVS. The
request gets blocks for its hit and is parked (not scheduled, no budget); once every rank reported it in
finished_recving it goes back to the front of the waiting queue with its blocks and computed tokens and is
scheduled as new (or resumed) without a second lookup. A failed receive (`failed_recving`) restarts it from
zero with its blocks freed under policy "recompute"; block-level load errors truncate its computed tokens at
the first failed block. A request finished (aborted) while parked keeps its blocks until its finished_recving
(vLLM's own delayed free: `finish_requests`, scheduler.py 2700-2707).

`WorkloadConfig.sliding_window` makes the model hybrid, as vLLM's hybrid KV-cache manager runs one with a
`SupportsHMA` connector: two KV-cache groups sharing one block pool, a full-attention group (the block
list the connector keys its prompt blocks by) and a sliding-window group whose blocks that left the
window are freed while the request runs (`remove_skipped_blocks` before every allocation and again at
finish) and handed out again at once; block 0 is then vLLM's null block, never allocated. docs/engine.md
lists the vLLM lines each rule rests on.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from deferdump.reference.errors import UserError
from deferdump.reference.groups import NULL_BLOCK, skipped_blocks
from deferdump.reference.views import CachedRequestView, NewRequestView, RequestView, StepView

if TYPE_CHECKING:
    from deferdump.tools.engine.moves import Moves

#: vLLM 0.32 `config/kv_transfer.py` (line 88): `kv_load_failure_policy: Literal["recompute", "fail"] = "fail"`.
LOAD_FAILURE_POLICIES = ("fail", "recompute")


class SimulationError(UserError):
    """The simulated scheduler found its own bookkeeping broken (a harness bug or a protocol violation)."""


class SchedulerConnector(Protocol):
    """The scheduler-side connector calls the simulation makes (vLLM's names)."""

    def get_num_new_matched_tokens(self, request: RequestView, num_computed_tokens: int) -> tuple[int, bool]: ...

    def update_state_after_alloc(
        self, request: RequestView, block_ids: Any, num_external_tokens: int, group_block_ids: Any = ()
    ) -> None: ...

    def build_connector_meta(self, step: StepView) -> Any: ...

    def request_finished(self, request: RequestView, block_ids: Any) -> tuple[bool, dict[str, Any] | None]: ...

    def request_finished_all_groups(
        self, request: RequestView, block_ids: tuple[Sequence[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]: ...

    def update_connector_output(self, finished_recving: Iterable[str] = ()) -> None: ...


@dataclasses.dataclass(frozen=True)
class WorkloadConfig:
    """The request stream and the scheduler's limits."""

    block_size: int = 16
    num_blocks: int = 256
    max_running: int = 8
    max_batched_tokens: int = 512
    prompt_tokens: tuple[int, int] = (16, 256)  # inclusive range, uniform
    output_tokens: tuple[int, int] = (1, 16)
    shared_prefix_prob: float = 0.3  # a prompt starts with one of a few shared documents (store hits, loads)
    shared_prefixes: int = 4
    abort_prob: float = 0.002  # per live request per step
    preempt_prob: float = 0.02  # per step: preempt one running request even if blocks remain
    waiting_target: int = 4  # keep this many requests waiting while the stream is open
    seed: int = 0
    kv_load_failure_policy: str = "fail"  # vLLM's default; "recompute" reschedules from the first bad block
    # None: one full-attention KV-cache group. N: a hybrid model, a full-attention group plus a sliding-window
    # group whose window is N tokens (its blocks that leave the window are freed while the request runs).
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.num_blocks < 1 or self.max_running < 1 or self.max_batched_tokens < 1:
            raise ValueError("block_size, num_blocks, max_running and max_batched_tokens must be >= 1")
        for name in ("prompt_tokens", "output_tokens"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name} must be a range 1 <= low <= high, got {(low, high)}")
        if self.sliding_window is not None and (
            isinstance(self.sliding_window, bool) or not isinstance(self.sliding_window, int) or self.sliding_window < 1
        ):
            raise ValueError(f"sliding_window must be a positive number of tokens, got {self.sliding_window!r}")
        longest = self.prompt_tokens[1] + self.output_tokens[1]
        needed = -(-longest // self.block_size) * self.num_groups + (1 if self.hybrid else 0)
        if needed > self.num_blocks:
            raise ValueError(f"num_blocks {self.num_blocks} cannot hold one request of {longest} tokens")
        if self.kv_load_failure_policy not in LOAD_FAILURE_POLICIES:
            raise ValueError(
                f"kv_load_failure_policy must be one of {', '.join(LOAD_FAILURE_POLICIES)}, got {self.kv_load_failure_policy!r}"
            )
        for name in ("shared_prefix_prob", "abort_prob", "preempt_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability, got {getattr(self, name)}")

    @property
    def hybrid(self) -> bool:
        """Two KV-cache groups (full attention + sliding window) instead of one."""
        return self.sliding_window is not None

    @property
    def num_groups(self) -> int:
        return 2 if self.hybrid else 1


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    HELD = "held"  # finished; its free is delayed until every rank reported it
    RECVING = "recving"  # vLLM's WAITING_FOR_REMOTE_KVS: blocks allocated, an asynchronous load running
    HELD_RECV = "held_recv"  # finished while its load ran: freed once every rank reported finished_recving
    DONE = "done"  # finished and freed


@dataclasses.dataclass(eq=False)
class SimRequest:
    req_id: str
    tokens: list[int]  # prompt, then sampled outputs
    num_prompt: int
    max_output: int
    num_computed: int = 0
    blocks: list[int] = dataclasses.field(default_factory=list)  # the full-attention group's block table
    # hybrid: the sliding-window group's block table, one entry per block position; a block that left the
    # window is NULL_BLOCK (vLLM replaces it with its null block in place)
    sw_blocks: list[int] = dataclasses.field(default_factory=list)
    status: Status = Status.WAITING
    admitted: bool = False  # scheduled at least once: later schedules are "cached" requests
    resumed: bool = False  # preempted since it was last scheduled
    reports: int = 0  # ranks that reported it in finished_sending
    recv_reports: int = 0  # ranks that reported its asynchronous load in finished_recving
    recv_failed: bool = False  # a rank reported it in failed_recving
    loads: int = 0  # asynchronous loads it was parked for

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    def view(self) -> RequestView:
        return RequestView(self.req_id, tuple(self.tokens), self.num_prompt)

    def held_blocks(self) -> list[int]:
        """Every pool block the request holds, in both groups (the null block is nobody's)."""
        return self.blocks + [block for block in self.sw_blocks if block != NULL_BLOCK]


@dataclasses.dataclass(frozen=True)
class ScheduledChunk:
    """Tokens [start, start + num_tokens) of a request computed this step, into `block_ids`."""

    req_id: str
    block_ids: tuple[int, ...]
    start: int
    num_tokens: int
    tokens: tuple[int, ...] = ()  # the token ids at those positions
    admitted: bool = False  # scheduled from the waiting queue this step (new or resumed)
    sw_block_ids: tuple[int, ...] = ()  # hybrid: the sliding-window group's block table (null where freed)


@dataclasses.dataclass(frozen=True)
class ScheduledStep:
    view: StepView
    chunks: tuple[ScheduledChunk, ...]
    preempted_blocks: frozenset[int]


@dataclasses.dataclass
class StepOutcome:
    """What one `update` changed: finished requests and their connector answers, frees, failures."""

    finished: dict[str, bool] = dataclasses.field(default_factory=dict)  # req id -> request_finished answer
    freed_after_reports: list[str] = dataclasses.field(default_factory=list)
    failed_loads: list[str] = dataclasses.field(default_factory=list)  # failed (policy "fail")
    recomputed_loads: list[str] = dataclasses.field(default_factory=list)  # rewound (policy "recompute")
    received: list[str] = dataclasses.field(default_factory=list)  # async loads every rank reported
    violations: list[str] = dataclasses.field(default_factory=list)  # a report vLLM would reject, a bad answer


class BlockPool:
    """Free block ids, reused LIFO like vLLM's unhashed blocks (a freed block is the next one handed out).

    `reserve_null`: block 0 is vLLM's null block (hybrid models: a sliding-window table shows a freed
    position as 0), never handed out nor freed. `free` appends, so the last block of a call is the next
    handed out: vLLM's `prepend_n` of the blocks in the reverse order (`v1/core/block_pool.py` 774-801).
    """

    def __init__(self, num_blocks: int, *, reserve_null: bool = False) -> None:
        self.num_blocks = num_blocks
        self.num_usable = num_blocks - 1 if reserve_null else num_blocks
        first = 1 if reserve_null else 0
        self._free: list[int] = list(range(num_blocks - 1, first - 1, -1))
        self._is_free = [True] * num_blocks
        self._reserve_null = reserve_null
        self._freed_by_preemption: set[int] = set()
        self._freed_by_window: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_blocks(self) -> frozenset[int]:
        return frozenset(self._free)

    def freed_by_preemption(self) -> frozenset[int]:
        """Free blocks whose last free was a preemption's (vLLM frees those at once, dumps or not)."""
        return frozenset(self._freed_by_preemption)

    def freed_at_once(self) -> frozenset[int]:
        """Free blocks vLLM freed without asking the connector: a preemption's, or sliding-window blocks
        that left the window (while the request ran, or at its finish before `request_finished_all_groups`)."""
        return frozenset(self._freed_by_preemption | self._freed_by_window)

    def allocate(self, count: int) -> list[int] | None:
        if count > len(self._free):
            return None
        taken = [self._free.pop() for _ in range(count)]
        for block in taken:
            self._is_free[block] = False
        if self._freed_by_preemption:
            self._freed_by_preemption.difference_update(taken)
        if self._freed_by_window:
            self._freed_by_window.difference_update(taken)
        return taken

    def free(self, blocks: Iterable[int], *, by_preemption: bool = False, by_window: bool = False) -> None:
        for block in blocks:
            if self._is_free[block] or (self._reserve_null and block == NULL_BLOCK):
                raise SimulationError(f"block {block} freed twice, or the null block freed")
            self._is_free[block] = True
            self._free.append(block)
            if by_preemption:
                self._freed_by_preemption.add(block)
            elif self._freed_by_preemption:
                self._freed_by_preemption.discard(block)
            if by_window:
                self._freed_by_window.add(block)
            elif self._freed_by_window:
                self._freed_by_window.discard(block)


class RequestFactory:
    """Random prompts (some sharing a document prefix, so the store gets hits) and output lengths."""

    def __init__(self, config: WorkloadConfig, rng: random.Random) -> None:
        self._config = config
        self._rng = rng
        low = config.prompt_tokens[0]
        self._documents = [
            [rng.randrange(1, 50_000) for _ in range(rng.randint(low, max(low, config.prompt_tokens[1] // 2)))]
            for _ in range(config.shared_prefixes)
        ]

    def make(self) -> tuple[list[int], int]:
        """(prompt, maximum output tokens) of the next request."""
        config, rng = self._config, self._rng
        length = rng.randint(*config.prompt_tokens)
        prompt: list[int] = []
        if self._documents and rng.random() < config.shared_prefix_prob:
            prompt = list(rng.choice(self._documents)[:length])
        prompt += [rng.randrange(1, 50_000) for _ in range(length - len(prompt))]
        return prompt, rng.randint(*config.output_tokens)


class SimScheduler:
    """vLLM's scheduler loop in miniature; `connector` None means no KV connector at all (baseline)."""

    def __init__(
        self,
        config: WorkloadConfig,
        connector: SchedulerConnector | None,
        *,
        world_size: int = 1,
        timed: Callable[[str], Any] | None = None,
        moves: Moves | None = None,
    ) -> None:
        """`moves` None: the seeded policy of `config` (`SeededMoves`)."""
        from deferdump.tools.engine.moves import SeededMoves

        self.config = config
        self.connector = connector
        self.world_size = world_size
        self.pool = BlockPool(config.num_blocks, reserve_null=config.hybrid)
        self.moves: Moves = moves if moves is not None else SeededMoves(config)
        self._factory = RequestFactory(config, random.Random(config.seed + 1))
        self.requests: dict[str, SimRequest] = {}
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.running: list[SimRequest] = []
        self.recving: list[SimRequest] = []  # parked for an asynchronous load (WAITING_FOR_REMOTE_KVS)
        self._finished_for_workers: set[str] = set()
        self._timed = timed
        self.admitted_total = 0  # requests created
        self.finished_total = 0  # requests that went through request_finished
        self.freed_total = 0  # finished requests whose blocks are back in the pool
        self.preempted_total = 0
        self.aborted_total = 0
        self.window_freed_total = 0  # hybrid: sliding-window blocks freed while their request ran
        self.finish_window_freed_total = 0  # hybrid: ... freed by the finish path's remove_skipped_blocks
        self.async_loads_total = 0  # requests parked for an asynchronous load
        self.stream_open = True
        self.request_limit: int | None = None

    # ------------------------------------------------------------------ stream
    def top_up(self) -> None:
        """Keep `waiting_target` requests waiting while the stream is open and under the request limit."""
        while self.stream_open and len(self.waiting) < self.config.waiting_target:
            if self.request_limit is not None and self.admitted_total >= self.request_limit:
                self.stream_open = False
                break
            self.add_request(*self._factory.make())

    def add_request(self, prompt: Sequence[int], max_output: int) -> SimRequest:
        """A new request at the end of the waiting queue (vLLM's `add_request`)."""
        if not prompt or max_output < 1:
            raise ValueError("a request needs at least one prompt token and one output token")
        self.admitted_total += 1
        request = SimRequest(f"req-{self.admitted_total}", list(prompt), len(prompt), max_output)
        self.requests[request.req_id] = request
        self.waiting.append(request)
        return request

    def unfinished(self) -> list[SimRequest]:
        """Requests waiting, parked for a load, or running (what a client can still abort)."""
        return [r for r in self.requests.values() if r.status in (Status.WAITING, Status.RECVING, Status.RUNNING)]

    def abort(self, req_id: str) -> StepOutcome:
        """A client abort between steps (vLLM `finish_requests(..., FINISHED_ABORTED)`): `request_finished`
        now, the id reaches the workers in the next step."""
        request = self.requests.get(req_id)
        if request is None or request.status not in (Status.WAITING, Status.RECVING, Status.RUNNING):
            raise SimulationError(f"{req_id} is not waiting, parked or running, it cannot be aborted")
        outcome = StepOutcome()
        self.aborted_total += 1
        self._finish(request, outcome)
        return outcome

    def idle(self) -> bool:
        """No request is alive or held, and nothing is left to tell the workers."""
        return not self.requests and not self._finished_for_workers

    # --------------------------------------------------------------- schedule
    def schedule(self) -> tuple[ScheduledStep, Any]:
        """One `schedule()`: the step's chunks, preemptions and `build_connector_meta`'s metadata."""
        config = self.config
        budget = config.max_batched_tokens
        new_views: list[NewRequestView] = []
        cached_views: list[CachedRequestView] = []
        chunks: list[ScheduledChunk] = []
        preempted: list[SimRequest] = []
        preempted_blocks: set[int] = set()

        self._promote_received()
        victim = self.moves.preempt(self.running)
        if victim is not None:
            self.running.remove(victim)
            preempted_blocks.update(self._preempt(victim))
            preempted.append(victim)

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(len(request.tokens) - request.num_computed, budget)
            new_blocks = self._allocate_for(request, request.num_computed + num_new)
            while new_blocks is None:
                victim = self.running.pop()
                preempted_blocks.update(self._preempt(victim))
                preempted.append(victim)
                if victim is request:
                    break
                new_blocks = self._allocate_for(request, request.num_computed + num_new)
            if new_blocks is None:
                break
            new_full, new_sw = new_blocks
            cached_views.append(CachedRequestView(
                request.req_id, tuple(new_full), False, request.num_computed, num_new,
                (tuple(new_sw),) if config.hybrid else (),
            ))
            chunks.append(ScheduledChunk(
                request.req_id, tuple(request.blocks), request.num_computed, num_new,
                tuple(request.tokens[request.num_computed:request.num_computed + num_new]),
                sw_block_ids=tuple(request.sw_blocks),
            ))
            budget -= num_new
            index += 1

        while not preempted and self.waiting and len(self.running) < config.max_running and budget > 0:
            request = self.waiting[0]
            if request.blocks:  # back from an asynchronous load: its blocks and computed tokens, no lookup
                num_new = self._schedule_received(request, budget, new_views, cached_views, chunks)
                if num_new is None:
                    break
                budget -= num_new
                continue
            external = 0
            load_async = False
            if self.connector is not None:
                with self._measure("sched_connector"):
                    external, load_async = self.connector.get_num_new_matched_tokens(request.view(), 0)
            if load_async and external > 0:
                if not self._park(request, external):
                    break
                continue
            num_new = min(len(request.tokens) - external, budget)
            if num_new <= 0:
                raise SimulationError(f"{request.req_id}: connector claimed all {len(request.tokens)} tokens")
            admitted = self._allocate_admission(external, external + num_new)
            if admitted is None:
                break
            blocks, sw_blocks = admitted
            self.waiting.popleft()
            request.blocks, request.sw_blocks = blocks, sw_blocks
            request.num_computed = external
            if self.connector is not None:
                with self._measure("sched_connector"):
                    self.connector.update_state_after_alloc(request.view(), tuple(blocks), external)
            groups = (tuple(sw_blocks),) if config.hybrid else ()
            if request.resumed:
                cached_views.append(CachedRequestView(request.req_id, tuple(blocks), True, external, num_new, groups))
            else:
                new_views.append(NewRequestView(
                    request.req_id, tuple(request.tokens), request.num_prompt, tuple(blocks), external, num_new, groups
                ))
            request.admitted, request.resumed, request.status = True, False, Status.RUNNING
            self.running.append(request)
            chunks.append(ScheduledChunk(
                request.req_id, tuple(blocks), external, num_new, tuple(request.tokens[external:external + num_new]), True,
                tuple(sw_blocks),
            ))
            budget -= num_new

        view = StepView(
            tuple(new_views), tuple(cached_views), frozenset(self._finished_for_workers),
            frozenset(r.req_id for r in preempted),
        )
        self._finished_for_workers.clear()
        meta = None
        if self.connector is not None:
            with self._measure("sched_connector"):
                meta = self.connector.build_connector_meta(view)
        return ScheduledStep(view, tuple(chunks), frozenset(preempted_blocks)), meta

    def _park(self, request: SimRequest, external: int) -> bool:
        """An asynchronous hit: blocks for the hit only, `update_state_after_alloc`, WAITING_FOR_REMOTE_KVS
        (scheduler.py 1241-1327: `num_new_tokens = 0`, `delay_cache_blocks`, `skip_request`)."""
        admitted = self._allocate_admission(external, external)
        if admitted is None:
            return False
        blocks, sw_blocks = admitted
        self.waiting.popleft()
        request.blocks, request.sw_blocks = blocks, sw_blocks
        request.num_computed = external
        request.recv_reports, request.recv_failed = 0, False
        request.loads += 1
        assert self.connector is not None
        groups = (tuple(sw_blocks),) if self.config.hybrid else ()
        with self._measure("sched_connector"):
            self.connector.update_state_after_alloc(request.view(), tuple(blocks), external, groups)
        request.status = Status.RECVING
        self.recving.append(request)
        self.async_loads_total += 1
        return True

    def _promote_received(self) -> None:
        """`_update_waiting_for_remote_kv` (scheduler.py 3123-3173) for every parked request all ranks reported:
        a failed receive under "recompute" restarts at zero with its blocks freed; a full hit recomputes its
        last token; back to the front of the waiting queue (in parking order)."""
        ready = [r for r in self.recving if r.recv_reports >= self.world_size]
        for request in reversed(ready):
            self.recving.remove(request)
            if request.recv_failed:
                request.num_computed = 0
            if request.num_computed == 0:
                self._release(request)
            elif request.num_computed >= len(request.tokens):
                request.num_computed = len(request.tokens) - 1
            request.status = Status.WAITING
            self.waiting.appendleft(request)

    def _schedule_received(
        self, request: SimRequest, budget: int, new_views: list[NewRequestView], cached_views: list[CachedRequestView],
        chunks: list[ScheduledChunk],
    ) -> int | None:
        """Schedule a request whose asynchronous load ended, on the blocks it holds; None when the pool is short."""
        computed = request.num_computed
        num_new = min(len(request.tokens) - computed, budget)
        if self._allocate_for(request, computed + num_new) is None:
            return None
        self.waiting.popleft()
        if self.connector is not None:
            with self._measure("sched_connector"):
                self.connector.update_state_after_alloc(request.view(), tuple(request.blocks), 0)
        groups = (tuple(request.sw_blocks),) if self.config.hybrid else ()
        if request.resumed:
            cached_views.append(CachedRequestView(request.req_id, tuple(request.blocks), True, computed, num_new, groups))
        else:
            new_views.append(NewRequestView(
                request.req_id, tuple(request.tokens), request.num_prompt, tuple(request.blocks), computed, num_new, groups
            ))
        request.admitted, request.resumed, request.status = True, False, Status.RUNNING
        self.running.append(request)
        chunks.append(ScheduledChunk(
            request.req_id, tuple(request.blocks), computed, num_new, tuple(request.tokens[computed:computed + num_new]),
            True, tuple(request.sw_blocks),
        ))
        return num_new

    def _blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.config.block_size)

    def _allocate_for(self, request: SimRequest, num_tokens: int) -> tuple[list[int], list[int]] | None:
        """`allocate_slots` for a running request: the (full, sliding-window) blocks it gained, or None when
        the pool is short. A hybrid model first frees the window's skipped blocks, even when the
        allocation then fails (`v1/core/kv_cache_manager.py` 546-559), and allocates all groups or none."""
        if not self.config.hybrid:
            missing = self._blocks_needed(num_tokens) - len(request.blocks)
            if missing <= 0:
                return [], []
            blocks = self.pool.allocate(missing)
            if blocks is None:
                return None
            request.blocks.extend(blocks)
            return blocks, []
        self.window_freed_total += self._remove_skipped_blocks(request)
        needed = self._blocks_needed(num_tokens)
        missing_full = max(0, needed - len(request.blocks))
        missing_sw = max(0, needed - len(request.sw_blocks))  # the table counts null positions too
        if missing_full + missing_sw > self.pool.num_free:
            return None
        new_sw = self.pool.allocate(missing_sw) or []  # vLLM's group order: the sliding-window group first
        new_full = self.pool.allocate(missing_full) or []
        request.sw_blocks.extend(new_sw)
        request.blocks.extend(new_full)
        return new_full, new_sw

    def _allocate_admission(self, num_computed: int, num_tokens: int) -> tuple[list[int], list[int]] | None:
        """Blocks of a request admitted with `num_computed` external tokens: (full, sliding-window) tables,
        or None when the pool is short. The sliding-window table starts with null blocks for the positions
        already out of the window (`single_type_kv_cache_manager.py` 290-311, `add_local_computed_blocks`)."""
        needed = self._blocks_needed(num_tokens)
        if not self.config.hybrid:
            blocks = self.pool.allocate(needed)
            return None if blocks is None else (blocks, [])
        assert self.config.sliding_window is not None
        nulls = skipped_blocks(num_computed, self.config.sliding_window, self.config.block_size)
        if needed + (needed - nulls) > self.pool.num_free:
            return None
        sw_blocks = [NULL_BLOCK] * nulls + (self.pool.allocate(needed - nulls) or [])
        blocks = self.pool.allocate(needed) or []
        return blocks, sw_blocks

    def _remove_skipped_blocks(self, request: SimRequest) -> int:
        """vLLM's `remove_skipped_blocks` on the tokens computed so far: free the sliding-window blocks that
        left the window and null their positions; returns how many were freed.

        `_remove_blocks_in_range` (`single_type_kv_cache_manager.py` 645-670) walks back from the last
        skipped position and stops at the first null; the freed blocks go to the front of the free queue,
        the highest position first, so the next allocation (this request's own next block, often) reuses it.
        """
        window = self.config.sliding_window
        if window is None:
            return 0
        table = request.sw_blocks
        skipped = min(skipped_blocks(request.num_computed, window, self.config.block_size), len(table))
        freed: list[int] = []
        for position in range(skipped - 1, -1, -1):
            if table[position] == NULL_BLOCK:
                break
            freed.append(table[position])
            table[position] = NULL_BLOCK
        self.pool.free(reversed(freed), by_window=True)  # the last appended is handed out first
        return len(freed)

    def _preempt(self, request: SimRequest) -> list[int]:
        """Free at once, reset computed tokens, back to the front of the queue; no request_finished."""
        freed = request.held_blocks()
        self._release(request, by_preemption=True)
        request.num_computed = 0
        request.status = Status.WAITING
        request.resumed = request.admitted
        self.waiting.appendleft(request)
        self.preempted_total += 1
        return freed

    def _release(self, request: SimRequest, *, by_preemption: bool = False) -> None:
        """Every block back to the pool, group by group in vLLM's order (`coordinator.free`: the
        sliding-window group, then the full-attention group; each table tail first)."""
        self.pool.free([block for block in request.sw_blocks if block != NULL_BLOCK], by_preemption=by_preemption)
        self.pool.free(request.blocks, by_preemption=by_preemption)
        request.blocks = []
        request.sw_blocks = []

    # ----------------------------------------------------------------- update
    def update(
        self, step: ScheduledStep, reports: Mapping[str, int], failed_blocks: Iterable[int] = (),
        recv_reports: Mapping[str, int] | None = None, failed_recving: Iterable[str] = (),
    ) -> StepOutcome:
        """`update_from_output`: advance computed tokens, sample, finish; free requests all ranks reported."""
        outcome = StepOutcome()
        self._apply_failed_recving(set(failed_recving), outcome)
        if failed_blocks and self.recving:
            self._apply_async_load_failures(set(failed_blocks), outcome)
        skipped = self._apply_load_failures(step, set(failed_blocks), outcome) if failed_blocks else set()
        for chunk in step.chunks:
            request = self.requests.get(chunk.req_id)
            if request is None or request.status is not Status.RUNNING or chunk.req_id in skipped:
                continue
            request.num_computed = chunk.start + chunk.num_tokens
            if request.num_computed >= len(request.tokens):
                request.tokens.append(self.moves.sample(request))
                if request.num_output >= request.max_output:
                    self._finish(request, outcome)
        for request in self.moves.aborts(self.unfinished()):
            self.aborted_total += 1
            self._finish(request, outcome)
        for req_id, count in (recv_reports or {}).items():
            self._received(req_id, count, outcome)
        if outcome.received and self.connector is not None:  # vLLM's aggregated output, every rank's report
            with self._measure("sched_connector"):
                self.connector.update_connector_output(outcome.received)
        for req_id, count in reports.items():
            request = self.requests.get(req_id)
            if request is None or request.status is not Status.HELD:
                # vLLM's scheduler asserts here (EngineCore crash); the simulation records it and goes on.
                outcome.violations.append(
                    f"NoUnexpectedReportInv: finished_sending reported {req_id}, which awaits no delayed free"
                )
                continue
            request.reports += count
            if request.reports > self.world_size:
                outcome.violations.append(f"ReportOnceInv: {req_id} reported {request.reports} times by {self.world_size} rank(s)")
                continue
            if request.reports == self.world_size:
                self._free(request)
                outcome.freed_after_reports.append(req_id)
        return outcome

    def _received(self, req_id: str, count: int, outcome: StepOutcome) -> None:
        """finished_recving from `count` ranks (`_update_from_kv_xfer_finished`, scheduler.py 3222-3230): a parked
        request is promoted at the next schedule once every rank reported; one finished meanwhile is freed."""
        request = self.requests.get(req_id)
        if request is None or request.status not in (Status.RECVING, Status.HELD_RECV):
            # vLLM asserts here (the id must be a request, parked or finished): the engine core dies.
            outcome.violations.append(
                f"NoUnexpectedReportInv: finished_recving reported {req_id}, which awaits no load"
            )
            return
        request.recv_reports += count
        if request.recv_reports > self.world_size:
            outcome.violations.append(f"ReportOnceInv: {req_id} reported received {request.recv_reports} times")
            return
        if request.recv_reports == self.world_size:
            outcome.received.append(req_id)
            if request.status is Status.HELD_RECV:  # not a finished_sending free: the watch checks those
                self._free(request)

    def _apply_failed_recving(self, failed: set[str], outcome: StepOutcome) -> None:
        """`_handle_failed_recving` (scheduler.py 3341-3354): a parked request whose receive failed restarts at
        zero under "recompute" (at its promotion), and fails under "fail"."""
        for req_id in sorted(failed):
            request = self.requests.get(req_id)
            if request is None or request.status is not Status.RECVING:
                continue
            request.recv_failed = True
            if self.config.kv_load_failure_policy == "fail":
                outcome.failed_loads.append(req_id)
                self._finish(request, outcome)
            else:
                outcome.recomputed_loads.append(req_id)

    def _apply_async_load_failures(self, failed: set[int], outcome: StepOutcome) -> None:
        """`_handle_invalid_blocks` for parked requests (scheduler.py 3378-3390, `evict_blocks=False`): truncate
        computed tokens at the first failed block; under "fail" the request fails."""
        bs = self.config.block_size
        for request in list(self.recving):
            for index in range(min(-(-request.num_computed // bs), len(request.blocks))):
                if request.blocks[index] in failed:
                    request.num_computed = index * bs
                    if self.config.kv_load_failure_policy == "fail":
                        outcome.failed_loads.append(request.req_id)
                        self._finish(request, outcome)
                    else:
                        outcome.recomputed_loads.append(request.req_id)
                    break
        failed.difference_update(b for r in self.recving for b in r.blocks)

    def _apply_load_failures(self, step: ScheduledStep, failed: set[int], outcome: StepOutcome) -> set[str]:
        """Requests whose loaded blocks failed, as vLLM 0.32 treats them (`v1/core/sched/scheduler.py`).

        `_update_requests_with_invalid_blocks` (lines 3237-3354) scans each running request's blocks that
        hold tokens computed before this step (`num_computed_tokens - num_scheduled_tokens`, rounded up to
        blocks) and truncates `num_computed_tokens` to the first invalid block (`idx * block_size`, line
        3315); `update_from_output` then skips the request this step (line 2088). With
        `kv_load_failure_policy="fail"` (the default, line 184: `recompute_kv_load_failures = policy ==
        "recompute"`) the affected requests finish with FINISHED_ERROR (lines 2306-2307), which goes through
        `request_finished` like any finish; with "recompute" they stay running and the next steps recompute
        from the truncation point (`_handle_invalid_blocks` returns them to be skipped, line 3436).
        """
        bs = self.config.block_size
        if self.config.hybrid:
            # vLLM 0.32 raises here (`_handle_invalid_blocks`, scheduler.py 3365-3374: "block-level load
            # failures ... not supported for models with multiple KV cache groups"): the engine core dies.
            # The simulation records it and goes on as if the failed positions were one group's.
            outcome.violations.append(
                f"HybridLoadErrors (Python-only): a rank reported block-level load errors {sorted(failed)} under "
                "two KV-cache groups, where vLLM 0.32 raises RuntimeError"
            )
        affected: set[str] = set()
        for chunk in step.chunks:
            request = self.requests.get(chunk.req_id)
            if request is None or request.status is not Status.RUNNING:
                continue
            computed_blocks = -(-chunk.start // bs)
            for index in range(min(computed_blocks, len(request.blocks))):
                sw_block = request.sw_blocks[index] if index < len(request.sw_blocks) else NULL_BLOCK
                if request.blocks[index] in failed or (sw_block != NULL_BLOCK and sw_block in failed):
                    request.num_computed = index * bs
                    affected.add(chunk.req_id)
                    break
        for req_id in sorted(affected):
            request = self.requests[req_id]
            if self.config.kv_load_failure_policy == "fail":
                outcome.failed_loads.append(req_id)
                self._finish(request, outcome)
            else:
                outcome.recomputed_loads.append(req_id)
        return affected

    def _finish(self, request: SimRequest, outcome: StepOutcome) -> None:
        loading = request.status is Status.RECVING and request.recv_reports < self.world_size
        if request.status is Status.RUNNING:
            self.running.remove(request)
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
        elif request.status is Status.RECVING:
            self.recving.remove(request)
        delay = False
        if self.connector is not None:
            with self._measure("sched_connector"):
                if self.config.hybrid:
                    delay, params = self._connector_finished_all_groups(request)
                else:
                    delay, params = self.connector.request_finished(request.view(), tuple(request.blocks))
            if params is not None:
                outcome.violations.append(
                    f"RequestFinished (Python-only): {request.req_id} returned kv_transfer_params {params!r}"
                )
        outcome.finished[request.req_id] = delay
        self._finished_for_workers.add(request.req_id)
        self.finished_total += 1
        if loading:  # vLLM delays this free itself until finished_recving (scheduler.py 2700-2707)
            if delay:  # a second delayed free: vLLM would free at finished_recving, then assert at finished_sending
                outcome.violations.append(
                    f"NoUnexpectedReportInv: request_finished delayed {request.req_id}, whose load vLLM already waits for"
                )
            request.status = Status.HELD_RECV
        elif delay:
            request.status = Status.HELD
        else:
            self._free(request)

    def _connector_finished_all_groups(self, request: SimRequest) -> tuple[bool, dict[str, Any] | None]:
        """vLLM's finish path with a `SupportsHMA` connector (`scheduler.py` 3005-3058): free the window's
        skipped blocks first, then `request_finished_all_groups` with one table per group, each clipped to
        the computed tokens (`kv_cache_manager.py` 731-749, `get_block_ids_for_computed_tokens`)."""
        assert self.connector is not None
        self.finish_window_freed_total += self._remove_skipped_blocks(request)
        valid = self._blocks_needed(request.num_computed)
        tables = (tuple(request.blocks[:valid]), tuple(request.sw_blocks[:valid]))
        return self.connector.request_finished_all_groups(request.view(), tables)

    def _free(self, request: SimRequest) -> None:
        self._release(request)
        request.status = Status.DONE
        del self.requests[request.req_id]
        self.freed_total += 1

    def _measure(self, phase: str) -> Any:
        if self._timed is None:
            return _NULL_CONTEXT
        return self._timed(phase)


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


_NULL_CONTEXT = _NullContext()
