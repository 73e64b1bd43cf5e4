------------------------------ MODULE DeferDump ------------------------------
(***************************************************************************)
(* UCM PR #989 inside vLLM's scheduler/worker loop: KV dumps submitted     *)
(* asynchronously in wait_for_save/save_kv_layer, the scheduler delaying   *)
(* the free of requests that had dumps (request_finished), the workers     *)
(* waiting the tasks of finished requests in get_finished and of preempted *)
(* requests in handle_preemptions, per-task event handles, the             *)
(* KVOutputAggregator and a MultiConnector with a second delaying child.   *)
(*                                                                         *)
(* Grain (spec/README.md, "Abstractions"): one TLA+ action per engine-loop *)
(* phase -- `schedule` (Scheduler.schedule + build_connector_meta),        *)
(* `execute_model` (every rank's worker step for the oldest unexecuted     *)
(* SchedulerOutput), `update_from_output` (request_finished +              *)
(* _update_from_kv_xfer_finished) -- or, with FusedStep, all three as one  *)
(* `engine_step`; plus the store's `task_complete`.                       *)
(* The connector methods are operators named as the methods; every         *)
(* connector call dispatches through Connectors!Effective (the MRO).       *)
(* The history variable `action` records each step and its calls.          *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets, TLC, Connectors

CONSTANTS
    Req,            \* requests (model values; symmetric)
    Block,          \* KV-cache blocks of the pool (model values; symmetric)
    Rank,           \* worker ranks (integers)
    Rank0,          \* the rank with tp_rank 0 (the one that dumps under MLA)
    PromptBlocks,   \* prompt length of every request, in blocks
    Layers,         \* attention layers (LayerWise submits one task per layer)
    MaxPreempt,     \* bound on preemptions in a behaviour
    MaxInflight,    \* scheduled but unprocessed steps: 1 = sync, 2 = async scheduling
    InnerClass,     \* the UCM connector class under check (the variant)
    Wrapper,        \* is the outer UCMConnector wrapped around InnerClass?
    HMA,            \* does vLLM call request_finished_all_groups (HMA path)?
    Multi,          \* MultiConnector(UCM, a second delaying child), non-HMA path
    MLA,            \* MLA model: ranks other than 0 track ids but do not dump
    Faults,         \* SUBSET {"submit", "wait", "check", "lost"}: store faults on
    Lockstep,       \* ranks see the same store events (README "Abstractions")
    FusedStep,      \* sync scheduling as one engine_step action (MaxInflight = 1)
    StoreHits,      \* may an admission's lookup find the whole prompt in the store?
    ShortReqs,      \* requests whose prompt fills no block (never dumped, no plan)
    DeferFinalize,  \* spec decode: get_finished runs before wait_for_save in a step
    Hybrid,         \* two KV-cache groups (full attention + sliding window); with ~HMA a model
                    \*   whose every layer is sliding-window (see the ASSUME below)
    Moves,          \* SUBSET MoveNames: engine/store behaviours beyond the base model (README
                    \*   "Breadth moves"); {} keeps every earlier model's state graph
    Bugs,           \* SUBSET BugNames: small buggy-behaviour switches of mutants; {} in models
    Record          \* does `action` record every connector call of a step (TRUE: conformance
                    \*   traces, counterexamples, explain) or only the step's name (FALSE: the
                    \*   passing models, where nothing reads it)?  README, "The `action`
                    \*   history variable"

ASSUME TableOK
ASSUME InnerClass \in Classes /\ (Wrapper => "UCMConnector" \in Classes)
ASSUME Faults \subseteq {"submit", "wait", "check", "lost"}   \* "lost": a load never completes
ASSUME Lockstep \in BOOLEAN /\ FusedStep \in BOOLEAN /\ (FusedStep => MaxInflight = 1)
ASSUME Rank0 \in Rank /\ PromptBlocks \in Nat \ {0} /\ Layers \in Nat \ {0}
ASSUME StoreHits \in BOOLEAN /\ ShortReqs \subseteq Req
ASSUME DeferFinalize \in BOOLEAN /\ Record \in BOOLEAN
\* A sliding-window group on either path. On the HMA path it is a hybrid model (full attention + sliding
\* window). Without SupportsHMA vLLM turns the hybrid manager off, which promotes sliding-window layers to
\* full attention only beside full-attention ones (kv_cache_utils.py ~1690-1703): a model whose every layer is
\* sliding-window keeps its one sliding-window group and frees running requests' blocks on the non-HMA path
\* too (tests/vllm/test_vllm_sliding_window.py). Hybrid /\ ~HMA stands for that model; the full-attention
\* group it keeps is freed only at finish and preemption, as in the one-group models, so it adds no hazard
\* of its own. Short prompts are not combined with it, and its hits load asynchronously: vLLM 0.32
\* recovers a failed load on a hybrid model only through failed_recving (a block-level error raises,
\* scheduler.py ~3365-3374), which acts on requests waiting for remote KV only (~3341-3354).
ASSUME Hybrid \in BOOLEAN /\ (Hybrid => ~Multi /\ (StoreHits => "async_loads" \in Moves) /\ ShortReqs = {})

(* The moves (README "Breadth moves"), each off unless named in Moves:     *)
(* "several_victims": one schedule may preempt several running requests     *)
(*   (the allocation retry loop; reset_prefix_cache preempts them all);    *)
(* "split_reports": the second child reports on each rank in its own step;  *)
(* "some_delayed": the second child delays only some finished requests;    *)
(* "load_failure": a store hit's load may fail, policy "recompute";        *)
(* "shutdown": the engine may shut down, each rank's connector draining;   *)
(* "store_visibility": a hit names the prompt it loads, and the store's    *)
(*   lookup sees a prompt only once no dump of it is running;              *)
(* "partial_hits": a hit loads the first of two prompt blocks and the same *)
(*   step computes (and dumps) the second; with "load_failure" the store   *)
(*   decides during the step which loads fail, so the worker knows it      *)
(*   before it submits the step's dumps;                                   *)
(* "defer_block_free": vLLM's deferred block frees (scheduler.py ~186-192: *)
(*   async scheduling with a KV consumer): blocks a request frees while a  *)
(*   non-empty step that ran it is still in flight are parked in          *)
(*   deferred_frees and returned once that step's output is processed;    *)
(* "async_loads": every hit loads asynchronously (README "Asynchronous     *)
(*   loads"): get_num_new_matched_tokens answers load_async, the request   *)
(*   waits in WAITING_FOR_REMOTE_KVS holding its block, start_load_kv      *)
(*   submits a load task, get_finished reports finished_recving (with      *)
(*   "load_failure": failed_recving), and requests may be aborted          *)
(*   (finish_requests) while they wait.                                    *)
(* "shared_prefix": every request has the same prompt, so an admission may *)
(*   share a block another running request holds, or one this schedule     *)
(*   allocates for a hit, instead of taking a free one (vLLM's prefix      *)
(*   cache: allocate_slots caches a hit's blocks at allocation); a failed  *)
(*   load leaves its block's KV invalid until a recompute rewrites it, and *)
(*   the chunk of a recompute that rewrites it may come in a later step    *)
(*   (chunked prefill, the token budget).                                  *)
MoveNames == {"several_victims", "split_reports", "some_delayed", "load_failure",
              "shutdown", "store_visibility", "partial_hits", "defer_block_free", "async_loads",
              "shared_prefix"}
(* The bug switches (one per mutant that is not a class-table change):     *)
(* "agg_first": the aggregator forwards a request after the first report;  *)
(* "redo_untracked": a recompute after a failed load is dumped untracked;  *)
(* "shutdown_no_release": shutdown drains the tasks but keeps the handles; *)
(* "lookup_sees_running": the lookup sees a prompt whose dump still runs.  *)
(* The field's bugs (docs/real-bugs.md, "Saves, preemption, ranks,        *)
(* windows"; the row in brackets):                                         *)
(* "preempt_late" [P1]: the worker acts on a preemption only after the    *)
(*   step's forward (it learns of it from later metadata);                 *)
(* "extra_not_shipped" [P5]: MultiConnector's count of extra asynchronous *)
(*   saves never reaches the worker side;                                  *)
(* "count_not_forwarded" [P6]: ranks other than Rank0 drop their reports  *)
(*   (the child lowered its finished count to 1) while the aggregator     *)
(*   still expects one report per rank;                                    *)
(* "rfag_delays_all" [P7]: request_finished_all_groups lacks the early    *)
(*   return: it delays requests with no asynchronous save;                 *)
(* "report_lost_on_error" [P9]: a wait error in get_finished skips the    *)
(*   request's report;                                                     *)
(* "wait_one_save" [P13]: get_finished waits one save of a finished       *)
(*   request and reports it while its other saves still run;              *)
(* "idle_ignores_delayed" [N12]: the engine loop does not count requests  *)
(*   held by a delayed free as work, and stops stepping;                   *)
(* "preempt_fenced" [N1]: the allocation loop preempts victims whose      *)
(*   blocks a deferred free will hold (their preemption frees nothing);   *)
(* "fence_counts_empty" [P3]: a deferred free's fence counts every step,  *)
(*   the current (possibly empty) one included, while the drain runs only *)
(*   after non-empty steps;                                                *)
(* "count_per_req" [P2]: the worker counts a request's pending saves per  *)
(*   request id (OffloadingConnector's design) and a preemption resets the *)
(*   count while the completion of the save it waited is still queued: the *)
(*   re-admitted request's count takes that stale completion, reaches 0    *)
(*   with its new save running, and get_finished reports it unwaited.      *)
(* "sharer_reads_invalid" [N11]: a request that shares a block whose load  *)
(*   failed runs on it while the recompute that rewrites it is still to   *)
(*   come: vLLM 0.32's _update_requests_with_invalid_blocks (scheduler.py  *)
(*   ~3297-3305, ~3327-3336) lets only the first affected request in       *)
(*   `running` recompute a shared invalid block, and the others "can still *)
(*   consider this block as computed"; so does an admission that shares   *)
(*   the block after the failure (under "recompute" it is not evicted,     *)
(*   ~3409-3413).  Without the switch a request holding a block whose KV   *)
(*   is invalid is not run before a step that rewrites it (the ordering   *)
(*   the policy assumes: any sharer "will only access them after they're  *)
(*   recomputed", PR #26813's review).                                     *)
(* "sharers_recompute" (N11, a fix that is not one): every running request *)
(*   sharing a block whose load failed is rolled back and recomputes it in *)
(*   place too (and the block is not shared until rewritten): a second     *)
(*   recompute rewrites the block while the first one's dump still reads  *)
(*   it.                                                                   *)
BugNames == {"agg_first", "redo_untracked", "shutdown_no_release", "lookup_sees_running",
             "preempt_late", "extra_not_shipped", "count_not_forwarded", "rfag_delays_all",
             "report_lost_on_error", "wait_one_save", "idle_ignores_delayed",
             "preempt_fenced", "fence_counts_empty", "count_per_req", "sharer_reads_invalid",
             "sharers_recompute"}
(* The bug switches of the asynchronous-load mutants (README "Asynchronous *)
(* loads"; the rows of docs/real-bugs.md):                                 *)
(* "abort_no_recv_delay": finish_requests frees a request waiting for     *)
(*   remote KV at once (vLLM before #32255);                               *)
(* "abort_always_delays": it delays the free even when the receive had    *)
(*   already finished (the hole #32255's review found);                    *)
(* "drop_aborted_recv": the worker drops an aborted request from the ids  *)
(*   whose receive completions it reports (vllm-ascend #16662);            *)
(* "abort_frees_finished": finish_requests frees a request that already   *)
(*   finished and waits for its delayed free (vLLM #25067);                *)
(* "track_through_load": the connector keeps tracking the dumps of a      *)
(*   request it now loads asynchronously (tracked before a preemption), so *)
(*   an abort during the load is reported by finished_sending too;         *)
(* "async_empty_hit": a hit with nothing to transfer answers load_async   *)
(*   but submits no load (vLLM #56640);                                    *)
(* "retry_failed_hit": the lookup offers a failed load's hit again          *)
(*   (vLLM #49176);                                                        *)
(* "no_load_expiry": a lost load (fault "lost": a push-mode sender that    *)
(*   crashed) is never given up, so its receive is never reported (vLLM    *)
(*   #46283);                                                              *)
(* "both_children_load" [N2]: the top connector is a MultiConnector whose  *)
(*   second child also loads (a loading sibling, not the saving one of     *)
(*   Multi): both children start a load of an admitted request into its   *)
(*   blocks and each reports its own finished_recving, which MultiConnector *)
(*   unions (vLLM #53049; #51786: a child given 0 tokens reports the id    *)
(*   at once, its load being empty, which is the sibling's load completing *)
(*   first).  vLLM 0.32 assigns the request to the first child with a hit  *)
(*   (multi_connector.py ~434-452) and gives the others 0 external tokens  *)
(*   (~467-479), so they load nothing: with the switch off the sibling is  *)
(*   invisible on the receive side.                                        *)
(* "recompute_in_place" [N10]: a request whose load failed keeps the       *)
(*   blocks allocated for its hit and recomputes its prompt in them (vLLM  *)
(*   #56733, a hybrid model): the sliding-window group's list holds the    *)
(*   null block where the hit's first block had left the window, so the   *)
(*   recompute writes that position's KV into the null block, which every *)
(*   request shares.  vLLM 0.32 frees the blocks of a request that failed  *)
(*   with nothing valid (num_computed_tokens = 0, scheduler.py ~3146-3151, *)
(*   which _handle_failed_recving sets, ~3341-3354) and admits it afresh.  *)
AsyncBugNames == {"abort_no_recv_delay", "abort_always_delays", "drop_aborted_recv",
                  "abort_frees_finished", "track_through_load", "async_empty_hit",
                  "retry_failed_hit", "no_load_expiry", "both_children_load",
                  "recompute_in_place"}
ASSUME Moves \subseteq MoveNames /\ Bugs \subseteq BugNames \cup AsyncBugNames
Bug(x) == x \in Bugs
ASSUME ("some_delayed" \in Moves \/ "split_reports" \in Moves) => Multi
ASSUME ("load_failure" \in Moves \/ "store_visibility" \in Moves) => StoreHits
Mv(x) == x \in Moves
\* A hit is of the whole prompt, which one allocated block holds, or under "partial_hits" of
\* the first of two prompt blocks, or on a hybrid model of a whole two-block prompt (HybridHit:
\* the sliding-window group holds only the last block, the first one having left the window)
\* (README "Abstractions").
ASSUME StoreHits => PromptBlocks = 1 \/ (Mv("partial_hits") /\ PromptBlocks = 2) \/ (Hybrid /\ PromptBlocks = 2)
ASSUME Mv("partial_hits") => StoreHits
ASSUME Mv("defer_block_free") => MaxInflight = 2 /\ ~FusedStep /\ ~Hybrid /\ ~StoreHits
\* Shared prefixes: whole-prompt hits of one block, loaded in the step (a failure is known when the
\* step's output is processed, before the next schedule: one step in flight).
SP == Mv("shared_prefix")
ASSUME SP => /\ StoreHits /\ Mv("load_failure") /\ PromptBlocks = 1 /\ MaxInflight = 1 /\ ShortReqs = {}
             /\ ~Hybrid /\ ~Multi /\ ~Mv("async_loads") /\ ~Mv("partial_hits")
             /\ ~Mv("store_visibility") /\ ~Mv("defer_block_free")
ASSUME ("sharer_reads_invalid" \in Bugs \/ "sharers_recompute" \in Bugs) => SP
ASSUME ("preempt_fenced" \in Bugs \/ "fence_counts_empty" \in Bugs) => Mv("defer_block_free")
\* The store fails a step's loads while the step runs (the worker sees the error before it
\* dumps) rather than in the scheduler's view of the step's output.
EarlyFail == Mv("partial_hits") /\ Mv("load_failure")
\* Asynchronous loads: whole-prompt hits of one block, one KV-cache group, no MultiConnector (its
\* finished_recving is an uncounted union), and none of the moves that name a hit's source.
AL == Mv("async_loads")
ASSUME AL => /\ StoreHits /\ ~Multi /\ (PromptBlocks = 1 \/ Hybrid)
             /\ ~Mv("store_visibility") /\ ~Mv("shutdown")
\* A hit of a two-block prompt on a hybrid model: two full-attention blocks, and in the sliding-window
\* group the null block for the first (out of the window: SlidingWindowManager's cache hit marks it
\* null, and allocation takes no block for it) and one block for the last.
HybridHit == Hybrid /\ StoreHits /\ PromptBlocks = 2
\* Does a hit take a second full block (the computed second block of a partial hit, or the loaded
\* second block of a hybrid hit)?
TwoBlockHits == Mv("partial_hits") \/ HybridHit
ASSUME "lost" \in Faults => AL
\* N2: the children that load an admitted request (a load task and its record name the child);
\* the loading sibling is not combined with the saving one (Multi) nor with the receive bugs
\* that read the rank's report set rather than its load tasks.
BothLoad == Bug("both_children_load")
LoadChildren == {"ucm", "sib"}
ASSUME BothLoad => AL /\ ~Multi /\ ~Hybrid /\ {"drop_aborted_recv", "async_empty_hit"} \cap Bugs = {}
ASSUME "recompute_in_place" \in Bugs => AL /\ Mv("load_failure")

NumRanks == Cardinality(Rank)

VARIABLES
    \* ---- vLLM scheduler -------------------------------------------------
    reqState,     \* [Req -> ReqStates]: waiting, running, preempted,
                  \*   delayed (finished, blocks held for a delayed free), done (freed)
    blocksOf,     \* [Req -> Seq(Block)]: blocks held; i-th = prompt block i
                  \*   (the full-attention group under Hybrid)
    swBlocksOf,   \* [Req -> Seq(Block \cup {0})]: the sliding-window group's block of
                  \*   prompt block i, 0 (vLLM's null block) once it left the window
                  \*   and was freed; <<>> everywhere unless Hybrid
    freedSince,   \* blocks freed since the last schedule (Hybrid only, else {}):
                  \*   shipped in the next metadata for the pre-forward fence
    finishedIds,  \* Scheduler.finished_req_ids: finished since the last schedule
    preemptions,  \* number of preemptions so far (bounded by MaxPreempt)
    inflight,     \* Seq of SchedulerOutputs scheduled but not yet processed
    executed,     \* how many entries at the head of `inflight` the workers ran
    agg,          \* KVOutputAggregator: [Req -> reports received so far]
    \* ---- UCM scheduler-side connector -----------------------------------
    schedAsync,   \* UCMDirectConnector._async_dump_req_ids (scheduler process)
    extraSaves,   \* MultiConnector._extra_async_saves (count 1 each), not yet shipped
    \* ---- UCM worker-side connector, per rank ----------------------------
    workerAsync,  \* [Rank -> SUBSET Req]: the rank's _async_dump_req_ids
    pending,      \* [Rank -> set of Task]: the rank's _pending_dump_tasks
    live,         \* [Rank -> SUBSET TaskIds]: live device event handles (device.events)
    releaseErrors,\* [Rank -> SUBSET TaskIds]: handles released while not live (history)
    workerExtra,  \* [Rank -> SUBSET Req]: MultiConnector worker extra_async_saves
    sibPending,   \* [Rank -> SUBSET Req]: ids the second child has yet to report
    reported,     \* [Rank -> [Req -> 0..2]]: finished_sending reports sent (capped)
    \* ---- breadth moves (constant unless their move is on) ---------------
    sibDelayed,   \* finished since the last schedule and delayed by the second child
                  \*   ("some_delayed"; else {}): the sibling's own finished ids
    parked,       \* Scheduler.deferred_frees ("defer_block_free"; else {}): a set of
                  \*   [blocks, wait, by]: blocks returned to the pool once `wait` more
                  \*   in-flight steps are processed; `by`: "preempt" or "free"
    recompute,    \* requests whose hit load failed in a processed step: the next
                  \*   schedule recomputes their block ("load_failure"; else {})
    down,         \* has the engine shut down ("shutdown"; else FALSE)?
    dirtyLoads,   \* has a load read a prompt whose dump was still running on the
                  \*   rank ("store_visibility"; history; else FALSE)?
    dirtyDumps,   \* has a rank submitted a dump of a block its forward computed over a
                  \*   load that failed in the same step (history; FALSE unless a failed
                  \*   step dumps, i.e. "partial_hits" with "load_failure")?
    nullWrites,   \* has a forward written vLLM's null block, which every request's list
                  \*   shares for its out-of-window positions (history; FALSE unless Hybrid)?
    \* ---- asynchronous loads (constant unless "async_loads" is on) -------
    recvDone,     \* Scheduler.finished_recving_kv_req_ids: received, not yet promoted
    recvFailed,   \* Scheduler.failed_recving_kv_req_ids: their receive failed
    aggRecv,      \* KVOutputAggregator._recv_remaining_count: [Req -> receive reports so far]
    aggRecvFail,  \* KVOutputAggregator._failed_recving_pending: failures not yet emitted
    noHit,        \* requests whose asynchronous load failed: the connector's lookup finds
                  \*   nothing for them again, so they recompute
    \* ---- shared prefixes (constant unless "shared_prefix" is on) --------
    invalidKV,    \* blocks whose KV a failed load left invalid, not yet rewritten (or
                  \*   scheduled to be) by a recompute or a new allocation
    staleReads,   \* has a schedule run a request over a block in invalidKV (history)?
    loadTasks,    \* [Rank -> set of LoadTask]: the rank's load tasks not yet reported
    workerRecv,   \* [Rank -> SUBSET Req]: ids whose receive completion the rank will report
    staleSaves,   \* [Rank -> SUBSET Req]: requests with a save completion still queued from a
                  \*   life cycle that a preemption ended ("count_per_req", P2; else {})
    \* ---- history -------------------------------------------------------
    dumpOverwrites, \* has a forward rewritten a block that a still-running
                  \*   dump task was reading (freed and reused under the dump)?
    unexpectedReports, \* requests the scheduler got finished_sending for while
                  \*   not delayed (vLLM: `assert req_id in self.requests` fails)
    blockingWaits,\* has some wait_for_save waited a still-running task?
    preemptOverWaits, \* has some handle_preemptions waited a task holding no
                  \*   preempted request and reading no freed block?
    tick,         \* flips at the end of every engine step (liveness premise only)
    action        \* the step just taken: [name |-> method/event, params...]

schedVars  == <<reqState, blocksOf, finishedIds, preemptions, inflight, executed, agg,
                schedAsync, extraSaves, swBlocksOf, freedSince, sibDelayed, recompute, parked,
                recvDone, recvFailed, aggRecv, aggRecvFail, noHit, invalidKV, staleReads>>
workerVars == <<workerAsync, pending, live, releaseErrors, workerExtra, sibPending,
                reported, loadTasks, workerRecv, staleSaves>>
historyVars == <<unexpectedReports, blockingWaits, preemptOverWaits, dumpOverwrites,
                 dirtyLoads, dirtyDumps, nullWrites, down>>
vars == <<schedVars, workerVars, historyVars, tick, action>>

(* The fingerprint view of the safety models: everything but `action` and  *)
(* `tick` (no invariant reads them, so merging states that differ only in *)
(* how they were reached loses nothing).                                   *)
View == <<schedVars, workerVars, historyVars>>

-----------------------------------------------------------------------------
(* Constants derived from the class table: the effective label of every    *)
(* connector method (evaluated once by TLC).                               *)

UcmTop == IF Wrapper THEN "UCMConnector" ELSE InnerClass
Eff(m) == Effective(UcmTop, InnerClass, m)

\* vLLM calls request_finished_all_groups on an HMA top-level connector; a
\* non-HMA MultiConnector calls each child's request_finished.
RFLabel ==
    IF HMA /\ ~Multi
    THEN LET l == Eff("request_finished_all_groups")
         IN  IF l = "call_request_finished"
             THEN Effective(InnerClass, InnerClass, "request_finished")
             ELSE l
    ELSE Eff("request_finished")
BCMLabel  == Eff("build_connector_meta")
HPLabel   == Eff("handle_preemptions")
SKLLabel  == Eff("save_kv_layer")
WFSLabel  == Eff("wait_for_save")
GFLabel   == Eff("get_finished")
\* an internal helper: called on the inner connector itself, never through the wrapper
WaitLabel == Effective(InnerClass, InnerClass, "_wait_pending_dump_task")
\* the helper that lists a step's dump slices (inner connector): "skip_failed_loads" leaves
\* out the requests whose load failed in the step; "all_slices" or none ("base") keeps them
SliceLabel == Effective(InnerClass, InnerClass, "_dumping_requests")

-----------------------------------------------------------------------------
(* Value domains.                                                          *)

\* "remote": WAITING_FOR_REMOTE_KVS, an admitted request whose asynchronous load runs ("async_loads")
ReqStates == {"waiting", "running", "preempted", "delayed", "done", "remote"}
MaxTasks  == Cardinality(Req) * PromptBlocks * (MaxPreempt + 1) * Layers + 1
TaskIds   == 1..MaxTasks
TaskStatus == {"running", "done", "failed"}
IsTask(t) ==
    /\ DOMAIN t = {"id", "reqs", "blocks", "layer", "status", "event"}
    /\ t.id \in TaskIds /\ t.event \in TaskIds
    /\ t.reqs \subseteq Req /\ t.reqs # {}
    /\ t.blocks \subseteq Block /\ t.blocks # {}
    /\ t.layer \in 0..Layers
    /\ t.status \in TaskStatus

Dumps(w) == ~MLA \/ w = Rank0     \* does this rank submit dumps?

\* Blocks a request's prompt occupies: a short prompt sits in one partial block.
NeedBlocks(r) == IF r \in ShortReqs THEN 1 ELSE PromptBlocks

-----------------------------------------------------------------------------
Init ==
    /\ reqState = [r \in Req |-> "waiting"]
    /\ blocksOf = [r \in Req |-> <<>>]
    /\ swBlocksOf = [r \in Req |-> <<>>]
    /\ freedSince = {}
    /\ finishedIds = {}
    /\ preemptions = 0
    /\ inflight = <<>>
    /\ executed = 0
    /\ agg = [r \in Req |-> 0]
    /\ schedAsync = {}
    /\ extraSaves = {}
    /\ workerAsync = [w \in Rank |-> {}]
    /\ pending = [w \in Rank |-> {}]
    /\ live = [w \in Rank |-> {}]
    /\ releaseErrors = [w \in Rank |-> {}]
    /\ workerExtra = [w \in Rank |-> {}]
    /\ sibPending = [w \in Rank |-> {}]
    /\ reported = [w \in Rank |-> [r \in Req |-> 0]]
    /\ unexpectedReports = {}
    /\ blockingWaits = FALSE
    /\ preemptOverWaits = FALSE
    /\ dumpOverwrites = FALSE
    /\ sibDelayed = {}
    /\ recompute = {}
    /\ parked = {}
    /\ down = FALSE
    /\ dirtyLoads = FALSE
    /\ dirtyDumps = FALSE
    /\ nullWrites = FALSE
    /\ recvDone = {}
    /\ recvFailed = {}
    /\ aggRecv = [r \in Req |-> 0]
    /\ aggRecvFail = {}
    /\ noHit = {}
    /\ invalidKV = {}
    /\ staleReads = FALSE
    /\ loadTasks = [w \in Rank |-> {}]
    /\ workerRecv = [w \in Rank |-> {}]
    /\ staleSaves = [w \in Rank |-> {}]
    /\ tick = 0
    /\ action = [name |-> "init"]

-----------------------------------------------------------------------------
(***************************************************************************)
(* Scheduler.  The phases are written as operators from a state record to *)
(* the set of possible results, so that they compose: `schedule`,          *)
(* `execute_model` and `update_from_output` apply one phase each;          *)
(* `engine_step` (FusedStep, sync scheduling) applies all three at once.   *)
(***************************************************************************)

SchedState == [rs |-> reqState, bo |-> blocksOf, fin |-> finishedIds, pre |-> preemptions,
               sa |-> schedAsync, ex |-> extraSaves, agg |-> agg, unexp |-> unexpectedReports,
               sw |-> swBlocksOf, fs |-> freedSince, sd |-> sibDelayed, rc |-> recompute,
               pk |-> parked, rd |-> recvDone, rf |-> recvFailed, ar |-> aggRecv, arf |-> aggRecvFail,
               nh |-> noHit, inv |-> invalidKV, stale |-> staleReads]

SetSched(S) ==
    /\ reqState' = S.rs /\ blocksOf' = S.bo /\ finishedIds' = S.fin /\ preemptions' = S.pre
    /\ schedAsync' = S.sa /\ extraSaves' = S.ex /\ agg' = S.agg /\ unexpectedReports' = S.unexp
    /\ swBlocksOf' = S.sw /\ freedSince' = S.fs /\ sibDelayed' = S.sd /\ recompute' = S.rc
    /\ parked' = S.pk
    /\ recvDone' = S.rd /\ recvFailed' = S.rf /\ aggRecv' = S.ar /\ aggRecvFail' = S.arf
    /\ noHit' = S.nh
    /\ invalidKV' = S.inv /\ staleReads' = S.stale

(* The sliding-window group (Hybrid).  vLLM's null block id is 0.  With a  *)
(* window below the block size only the block holding the last computed    *)
(* token stays in the window: SlidingWindowManager.get_num_skipped_tokens  *)
(* = num_computed_tokens - sliding_window + 1 skips every earlier block.   *)
NullBlock == 0
SwHeld(seq) == {seq[i] : i \in {j \in DOMAIN seq : seq[j] # NullBlock}}
(* Blocks of the group that left the window: all held ones but the last.   *)
SwOut(seq) == {seq[i] : i \in {j \in 1..(Len(seq) - 1) : seq[j] # NullBlock}}
SwKeepLast(seq) == [i \in DOMAIN seq |-> IF i = Len(seq) THEN seq[i] ELSE NullBlock]

(* The one-to-one maps from D into F (a pick of distinct free blocks),     *)
(* built slot by slot: [D -> F] filtered would enumerate |F|^|D| maps.     *)
RECURSIVE Injections(_, _)
Injections(D, F) ==
    IF D = {} THEN {[x \in {} |-> x]}
    ELSE LET d == CHOOSE x \in D : TRUE
         IN  UNION {{(d :> b) @@ f : f \in Injections(D \ {d}, F \ {b})} : b \in F}

HeldIn(S) == UNION {Range(S.bo[r]) \cup SwHeld(S.sw[r]) : r \in Req} \cup UNION {e.blocks : e \in S.pk}

(* Reduction "fresh blocks" (README "Reductions"): a block that no variable *)
(* refers to is interchangeable with any other such block, since every      *)
(* action and property treats blocks alike (the models' SYMMETRY).  A pick *)
(* of free blocks then need not try every fresh block for every slot: the  *)
(* slots a pick fills with fresh blocks take them in one fixed way          *)
(* (FreshFill), and every other pick is that one with fresh blocks renamed. *)
(* Referenced(S): the blocks scheduler state S, the ranks' dump and load    *)
(* tasks refer to; none is fresh while a scheduled step is in flight        *)
(* (its metadata names blocks).  `action` is left out: no action reads it. *)
Referenced(S) ==
    HeldIn(S) \cup S.fs \cup S.inv
    \cup UNION {UNION {t.blocks : t \in pending[w]} \cup {t.block : t \in loadTasks[w]} : w \in Rank}
Fresh(S) == IF inflight = <<>> THEN Block \ Referenced(S) ELSE {}

(* The slots of D filled one-to-one with blocks of FF, in one fixed way    *)
(* (CHOOSE is deterministic); needs Cardinality(D) <= Cardinality(FF).     *)
RECURSIVE FreshFill(_, _)
FreshFill(D, FF) ==
    IF D = {} THEN [x \in {} |-> x]
    ELSE LET d == CHOOSE x \in D : TRUE
             b == CHOOSE y \in FF : TRUE
         IN  (d :> b) @@ FreshFill(D \ {d}, FF \ {b})

(* The one-to-one maps from a subset of D into F.                           *)
RECURSIVE PartialInjections(_, _)
PartialInjections(D, F) ==
    IF D = {} THEN {[x \in {} |-> x]}
    ELSE LET d == CHOOSE x \in D : TRUE
         IN  PartialInjections(D \ {d}, F)
             \cup UNION {{(d :> b) @@ f : f \in PartialInjections(D \ {d}, F \ {b})} : b \in F}

(* Injections(D, F) up to renaming the fresh blocks FF (a subset of F):    *)
(* each way to fill some slots with the other blocks of F, the remaining    *)
(* slots filled with fresh blocks by FreshFill.                            *)
Picks(D, F, FF) ==
    IF FF = {} THEN Injections(D, F)
    ELSE {g @@ FreshFill(D \ DOMAIN g, FF) :
            g \in {h \in PartialInjections(D, F \ FF) : Cardinality(D \ DOMAIN h) <= Cardinality(FF)}}

(* "defer_block_free": the non-empty steps in flight from position k on   *)
(* (a step is non-empty iff it ran some request: `ran`), and the requests *)
(* one of them ran (Request.last_sched_seq > processed_step_seq,           *)
(* _request_blocks_can_be_freed, scheduler.py ~2759-2764).                 *)
InflightFrom(k) == {i \in k..Len(inflight) : inflight[i].ran # {}}
FencedFrom(k) == UNION {inflight[i].ran : i \in k..Len(inflight)}
(* The fence of a free made now, counted in steps to process: vLLM 0.32   *)
(* takes sched_step_seq, which counts the non-empty steps scheduled       *)
(* (~1551); "fence_counts_empty" counts every step, `cur` (1 while        *)
(* scheduling) the current one included.                                   *)
FenceWait(k, cur) == IF Bug("fence_counts_empty") THEN Len(inflight) - k + 1 + cur
                     ELSE Cardinality(InflightFrom(k))
Park(blocks, wait, by) == IF blocks = {} THEN {} ELSE {[blocks |-> blocks, wait |-> wait, by |-> by]}

(* UCMDirectConnector.build_connector_meta: one dump slice per request     *)
(* whose scheduled chunk completed a prompt block (a computed one: a block *)
(* loaded from a store hit is not dumped, nor the partial block of a short *)
(* prompt; a missed block is dumped again after a resume); one load slice  *)
(* per hit; "track" adds the requests given a dump slice to               *)
(* _async_dump_req_ids (_track_async_dump_requests).  Under Hybrid a slice *)
(* reads the chunk's block of both groups (`sw`: the sliding-window one),  *)
(* and the metadata carries the blocks freed since the previous schedule   *)
(* (`freed`: window frees, finish and preemption frees), which the fence   *)
(* labels of handle_preemptions read.                                      *)
DumpSlice(a) == IF Hybrid THEN [req |-> a.req, block |-> a.block, sw |-> a.sw]
                ELSE [req |-> a.req, block |-> a.block]
LoadSlice(a) == IF Mv("store_visibility") THEN [req |-> a.req, block |-> a.block, src |-> a.src]
                ELSE [req |-> a.req, block |-> a.block]
build_connector_meta(S, alloc, preempted, freed, redo) ==
    LET dump == IF BCMLabel = "base" THEN {}
                ELSE {DumpSlice(a) :
                        a \in {x \in alloc : ~x.hit /\ x.req \notin ShortReqs}}
        load == IF BCMLabel = "base" THEN {}
                ELSE {LoadSlice(a) : a \in {x \in alloc : x.hit}}
        untracked == IF "redo_untracked" \in Bugs THEN redo ELSE {}
        newly == IF BCMLabel = "track" THEN {d.req : d \in dump} \ untracked ELSE {}
    IN  [meta |-> [writes    |-> alloc,
                   dump      |-> dump,
                   load      |-> load,
                   preempted |-> IF BCMLabel = "base" THEN {} ELSE preempted,
                   freed     |-> IF BCMLabel = "base" THEN {} ELSE freed,
                   finished  |-> S.fin,
                   sibNow    |-> FALSE,
                   sibFin    |-> S.sd,
                   \* "extra_not_shipped": the count stays in the scheduler process
                   extra     |-> IF Bug("extra_not_shipped") THEN {} ELSE S.ex,
                   sending   |-> [w \in Rank |-> {}],
                   ran       |-> {},  \* requests the step runs ("defer_block_free"; else {})
                   failed    |-> {}],  \* the step's failed loads, set when it executes (EarlyFail)
         tracked |-> newly]

(* Scheduler.has_requests: unfinished requests, or finished ids not yet   *)
(* shown to the workers (has_finished_requests, scheduler.py ~2813: the     *)
(* engine steps once more so the workers see the last finished ids).      *)
(* "idle_ignores_delayed" (N12, before vLLM #46579): has_finished_requests *)
(* without ~2816-2821, so a request held by a delayed free is no work.     *)
NoWorkStates == IF Bug("idle_ignores_delayed") THEN {"done", "delayed"} ELSE {"done"}
CanSchedule(S) == (\E r \in Req : S.rs[r] \notin NoWorkStates) \/ S.fin # {}

(* Scheduler.schedule: each request in `adv` is given a one-block chunk    *)
(* (admission for waiting/preempted ones, the next prefill chunk for       *)
(* running ones); running requests with a complete prompt decode (never    *)
(* dumped).  With StoreHits an admitted request's lookup may find its whole*)
(* prompt (`hits`): its block is loaded, and only the last token computed *)
(* (under "partial_hits": its first block, loaded, and the second block,   *)
(* computed and dumped in the same step, in a second free block `xb`).    *)
(* If the free blocks do not suffice, one running victim is preempted: its *)
(* blocks are freed at once, request_finished is NOT called and nothing    *)
(* waiting is admitted in that step.  Under Hybrid a chunk takes one block *)
(* of each group, and every scheduled running request (a prefill chunk or  *)
(* a decode) first frees its sliding-window blocks that left the window    *)
(* (KVCacheManager.allocate_slots -> remove_skipped_blocks, before it      *)
(* allocates): they may be picked again in the same schedule, by another   *)
(* request or by the same one.  Results:                                   *)
(* [S |-> new scheduler state, meta |-> SchedulerOutput, rec |-> record].  *)
ScheduleResults(S) ==
    LET running == {r \in Req : S.rs[r] = "running"}
        admit   == {r \in Req : S.rs[r] \in {"waiting", "preempted"}}
        prefill == {r \in running : Len(S.bo[r]) < NeedBlocks(r)}
        Groups == IF Hybrid THEN {"full", "sw"} ELSE {"full"}
        Need(adv) == Cardinality(adv) * Cardinality(Groups)
        Slides(adv, p) == IF Hybrid
                          THEN {r \in running \ p : r \in adv \/ Len(S.bo[r]) = NeedBlocks(r)}
                          ELSE {}
        SwFreed(adv, p) == UNION {SwOut(S.sw[r]) : r \in Slides(adv, p)}
        \* "defer_block_free": a fenced victim's blocks are parked, not freed (_free_request_blocks)
        Fenced == IF Mv("defer_block_free") THEN FencedFrom(1) ELSE {}
        \* (a block another request shares stays held: "shared_prefix")
        Victims(p) == UNION {Range(S.bo[v]) \cup SwHeld(S.sw[v]) : v \in p \ Fenced}
                      \ UNION {Range(S.bo[q]) : q \in Req \ p}
        Free(adv, p) == (Block \ HeldIn(S)) \cup SwFreed(adv, p) \cup Victims(p)
        \* "several_victims": the allocation retry loop (scheduler.py ~777-842) may
        \* preempt several running requests for one allocation, and
        \* reset_prefix_cache(reset_running_requests=True) (~2850-2860) preempts
        \* every running request whatever the free blocks.
        Reset(p) == Mv("several_victims") /\ p = running
        OK(adv, p) ==
            \* vLLM 0.32 never preempts a fenced victim (scheduler.py ~802-804, the fix of #49674)
            /\ (p # {} /\ ~Bug("preempt_fenced")) => p \cap Fenced = {}
            /\ (p # {}) => /\ S.pre + Cardinality(p) <= MaxPreempt
                           /\ Cardinality(Free(adv, {})) < Need(adv) \/ Reset(p)
                           /\ adv \cap admit = {}
                           /\ p \cap adv = {}
            /\ Need(adv) <= Cardinality(Free(adv, p))
        VictimSets == IF Mv("several_victims") THEN (SUBSET running) \ {{}}
                      ELSE {{v} : v \in running}
        \* "preempt_fenced": the retry loop preempts fenced victims, which free nothing, until it
        \* preempts the requester q itself (~829-831): a cascade after which q is not scheduled.
        Cascade(adv, p) ==
            /\ Bug("preempt_fenced") /\ p # {} /\ p \subseteq Fenced
            /\ S.pre + Cardinality(p) <= MaxPreempt
            /\ adv \cap admit = {} /\ p \cap adv = {}
            /\ Need(adv) <= Cardinality(Free(adv, p))
            /\ \E q \in (prefill \cap p) \ adv : Cardinality(Free(adv, {})) < Need(adv \cup {q})
        CascadeSets == IF Bug("preempt_fenced") THEN (SUBSET running) \ {{}} ELSE {}
        Opts == {o \in (SUBSET (admit \cup prefill)) \X ({{}} \cup VictimSets) :
                    OK(o[1], o[2])}
                \cup {o \in (SUBSET (admit \cup prefill)) \X CascadeSets : Cascade(o[1], o[2])}
        Pick(adv, p) == Picks(adv \X Groups, Free(adv, p), Fresh(S))
        \* "partial_hits": a hit takes a second block, for the prompt block the step computes
        \* after the loaded one (a hit needs the free blocks for it); HybridHit: for the second
        \* loaded block.  (A request whose asynchronous load failed gets no hit again: NoRehit.)
        HitSets(adv) == SUBSET {r \in adv \cap admit : r \notin ShortReqs}
        Hits(adv, p) == IF ~StoreHits THEN {{}}
                        ELSE IF TwoBlockHits
                        THEN {h \in HitSets(adv) : Need(adv) + Cardinality(h) <= Cardinality(Free(adv, p))}
                        ELSE HitSets(adv)
        Xs(adv, p, pk, hits) ==
            IF TwoBlockHits
            THEN Picks(hits, Free(adv, p) \ Range(pk), Fresh(S) \ Range(pk))
            ELSE {[r \in {} |-> r]}
        Idx(r) == IF r \in admit THEN 1 ELSE Len(S.bo[r]) + 1
        \* "store_visibility": a hit loads the prompt of some request `src`
        \* (this one's, dumped before a preemption, or an identical one); the
        \* store's lookup sees it only while no dump of it is running.
        Visible(q) == "lookup_sees_running" \in Bugs
                      \/ ~\E w \in Rank : \E t \in pending[w] : t.status = "running" /\ q \in t.reqs
        Srcs(hits) == IF Mv("store_visibility") THEN [hits -> {q \in Req : Visible(q)}]
                      ELSE {[r \in {} |-> r]}
        \* HybridHit: the hit's first block left the window (the null block in the group).
        AllocRec(r, pk, hits, src) ==
            IF Hybrid
            THEN [req |-> r, idx |-> Idx(r), block |-> pk[<<r, "full">>], hit |-> r \in hits,
                  sw |-> IF HybridHit /\ r \in hits THEN NullBlock ELSE pk[<<r, "sw">>]]
            ELSE IF Mv("store_visibility")
            THEN [req |-> r, idx |-> Idx(r), block |-> pk[<<r, "full">>], hit |-> r \in hits,
                  src |-> IF r \in hits THEN src[r] ELSE r]
            ELSE [req |-> r, idx |-> Idx(r), block |-> pk[<<r, "full">>], hit |-> r \in hits]
        \* A computed prompt block i of r, written in block b (never a hit).
        CompRec(r, i, b) == IF Mv("store_visibility")
                            THEN [req |-> r, idx |-> i, block |-> b, hit |-> FALSE, src |-> r]
                            ELSE [req |-> r, idx |-> i, block |-> b, hit |-> FALSE]
        \* "load_failure": a running request whose hit load failed was rolled back to
        \* its first failed block, the first one (_update_requests_with_invalid_blocks
        \* truncates num_computed_tokens there, scheduler.py ~3315; the request keeps its
        \* blocks, not even evicted from the prefix cache under "recompute", ~3412); this
        \* schedule recomputes every block from there in place (the held blocks): the
        \* forward rewrites them, and they are dumped.  In one step: a chunked recompute
        \* rewrites the later block later, which only gives its dump more time.
        \* Under Hybrid a block is recomputed in both groups' blocks of its position: the
        \* sliding-window one may be the null block ("recompute_in_place", N10).
        Redo(p) == {r \in S.rc : S.rs[r] = "running"} \ p
        \* "shared_prefix": the recomputes this schedule runs (the others' chunk comes later, and
        \* they stay in `rc`), and the admissions that share a block (`sb`: request -> block) held
        \* by a running request whose prompt is in, or allocated for a hit in this schedule
        \* (none in a schedule that preempts: nothing waiting is admitted then).
        RedoChoices(p) == IF SP THEN SUBSET Redo(p) ELSE {Redo(p)}
        \* ("sharers_recompute" keeps a block whose KV is invalid out of the prefix cache)
        Sharable(pk, hits) == ({S.bo[q][1] : q \in {x \in running : Len(S.bo[x]) = 1}}
                               \cup {pk[<<q, "full">>] : q \in hits})
                              \ (IF Bug("sharers_recompute") THEN S.inv ELSE {})
        ShareChoices(adv, p, pk, hits) ==
            IF SP /\ p = {}
            THEN UNION {[D -> Sharable(pk, hits)] : D \in SUBSET (admit \ adv)}
            ELSE {[r \in {} |-> r]}
        RedoRecs(r) == IF Hybrid
                       THEN {[req |-> r, idx |-> i, block |-> S.bo[r][i], hit |-> FALSE, sw |-> S.sw[r][i]]
                               : i \in DOMAIN S.bo[r]}
                       ELSE {CompRec(r, i, S.bo[r][i]) : i \in DOMAIN S.bo[r]}
        \* The second block a hit takes: computed (partial hit) or loaded (HybridHit, the last
        \* block, the one the sliding-window group holds).
        SecondRec(r, pk, xb) == IF HybridHit
                                THEN [req |-> r, idx |-> 2, block |-> xb[r], hit |-> TRUE,
                                      sw |-> pk[<<r, "sw">>]]
                                ELSE CompRec(r, 2, xb[r])
        Result(adv, p, pk, hits, src, xb, sb, redo) ==
            LET alloc == {AllocRec(r, pk, hits, src) : r \in adv}
                         \cup {SecondRec(r, pk, xb) : r \in DOMAIN xb}
                         \cup UNION {RedoRecs(r) : r \in redo}
                slides == Slides(adv, p)
                freed == IF Hybrid THEN S.fs \cup SwFreed(adv, p) \cup Victims(p) ELSE {}
                bcm == build_connector_meta(S, alloc, p, freed, redo)
                Kept(r) == IF r \in slides THEN SwKeepLast(S.sw[r]) ELSE S.sw[r]
                \* "shared_prefix": every allocated block is written in this step (computed or
                \* loaded), before any request of the step reads it; a request runs in the step
                \* unless its recompute was left for later; one that holds a block whose KV is
                \* still invalid reads it ("sharer_reads_invalid"; otherwise it is held back).
                inv1 == S.inv \ {a.block : a \in alloc}
                deferred == Redo(p) \ redo
                Holds(r) == IF r \in DOMAIN sb THEN {sb[r]} ELSE IF r \in p THEN {} ELSE Range(S.bo[r])
                stale == {r \in ({x \in running : x \notin p} \cup adv \cup DOMAIN sb) \ deferred :
                            Holds(r) \cap inv1 # {}}
            IN  [S |-> [S EXCEPT
                          !.rs = [r \in Req |-> IF r \in p THEN "preempted"
                                                ELSE IF r \in adv \cup DOMAIN sb THEN "running" ELSE S.rs[r]],
                          !.bo = [r \in Req |-> IF r \in p THEN <<>>
                                                ELSE IF r \in DOMAIN sb THEN <<sb[r]>>
                                                ELSE IF r \in adv
                                                     THEN (IF r \in admit THEN <<>> ELSE S.bo[r])
                                                          \o <<pk[<<r, "full">>]>>
                                                          \o (IF r \in DOMAIN xb THEN <<xb[r]>> ELSE <<>>)
                                                ELSE S.bo[r]],
                          !.sw = [r \in Req |-> IF r \in p THEN <<>>
                                                ELSE IF Hybrid /\ r \in DOMAIN xb
                                                THEN <<NullBlock, pk[<<r, "sw">>]>>
                                                ELSE IF Hybrid /\ r \in adv
                                                     THEN (IF r \in admit THEN <<>> ELSE Kept(r))
                                                          \o <<pk[<<r, "sw">>]>>
                                                ELSE Kept(r)],
                          !.pre = @ + Cardinality(p),
                          !.sa = @ \cup bcm.tracked,
                          !.fin = {},
                          !.ex = {},
                          !.fs = {},
                          !.sd = {},
                          !.rc = deferred,
                          !.inv = IF SP THEN inv1 ELSE {},
                          !.stale = @ \/ ((Bug("sharer_reads_invalid") \/ Bug("sharers_recompute"))
                                           /\ stale # {}),
                          !.pk = @ \cup Park(UNION {Range(S.bo[v]) : v \in p \cap Fenced},
                                              FenceWait(1, 1), "preempt")],
                 meta |-> IF Mv("defer_block_free")
                          THEN [bcm.meta EXCEPT !.ran = {r \in Req : r \in adv \/ (S.rs[r] = "running" /\ r \notin p)}]
                          ELSE bcm.meta,
                 rec |-> IF ~Record THEN [name |-> "schedule"]
                         ELSE IF SP
                         THEN [name |-> "schedule", allocated |-> alloc, preempted |-> p,
                               shared |-> {<<r, sb[r]>> : r \in DOMAIN sb}, recompute_later |-> deferred,
                               invalid_reads |-> IF Bug("sharer_reads_invalid") THEN stale ELSE {},
                               held_back |-> IF Bug("sharer_reads_invalid") THEN {} ELSE stale,
                               calls |-> << [name |-> "build_connector_meta",
                                             dump |-> bcm.meta.dump,
                                             load |-> bcm.meta.load,
                                             tracked |-> bcm.tracked,
                                             preempted_req_ids |-> bcm.meta.preempted,
                                             finished_req_ids |-> bcm.meta.finished,
                                             extra_async_saves |-> bcm.meta.extra,
                                             freed_blocks |-> bcm.meta.freed] >>]
                         ELSE
                         [name |-> "schedule", allocated |-> alloc, preempted |-> p,
                          sw_freed |-> SwFreed(adv, p),
                          calls |-> << [name |-> "build_connector_meta",
                                        dump |-> bcm.meta.dump,
                                        load |-> bcm.meta.load,
                                        tracked |-> bcm.tracked,
                                        preempted_req_ids |-> bcm.meta.preempted,
                                        finished_req_ids |-> bcm.meta.finished,
                                        extra_async_saves |-> bcm.meta.extra,
                                        freed_blocks |-> bcm.meta.freed] >>]]
    IN  UNION {UNION {UNION {{Result(o[1], o[2], pk, hits, src, xb, sb, redo) :
                                src \in Srcs(hits), xb \in Xs(o[1], o[2], pk, hits),
                                sb \in ShareChoices(o[1], o[2], pk, hits), redo \in RedoChoices(o[2])}
                             : pk \in Pick(o[1], o[2])}
                      : hits \in Hits(o[1], o[2])}
               : o \in Opts}

(* Scheduler.schedule's waiting loop, asynchronous loads ("async_loads"): *)
(* First _handle_blocked_waiting_request (scheduler.py ~3175-3199) promotes *)
(* every request in WAITING_FOR_REMOTE_KVS whose receive has finished       *)
(* (_update_waiting_for_remote_kv, ~3123-3173): after a good load the       *)
(* blocks are cached and the request runs on them (only its last token is *)
(* computed, ~3168-3172); after a failed one _handle_failed_recving reset   *)
(* num_computed_tokens to 0 (~3341-3354), so the block is freed (~3147)    *)
(* and the request waits again, to be admitted afresh; the connector's    *)
(* lookup finds nothing for it again (`noHit`), so it recomputes (bug      *)
(* "retry_failed_hit": it finds the failing hit again, vLLM #49176).       *)
(* The model runs a promoted request in the same schedule; vLLM may leave *)
(* it waiting with its blocks when the budget is short, which changes no   *)
(* block's owner.                                                          *)
(* Under Hybrid the freed blocks (both groups) join the blocks freed since  *)
(* the last schedule, for the fence.  Bug "recompute_in_place" (N10): the   *)
(* request keeps its blocks, runs, and this schedule recomputes its prompt *)
(* in them (`rc`, as after a failed synchronous load).                     *)
Promote(S) ==
    LET ready == {r \in Req : S.rs[r] = "remote" /\ r \in S.rd}
        bad   == ready \cap S.rf
        inPlace == Bug("recompute_in_place")
        gone  == IF inPlace THEN {} ELSE bad
    IN  [S EXCEPT !.rs = [r \in Req |-> IF r \in ready \ gone THEN "running"
                                        ELSE IF r \in gone THEN "waiting" ELSE S.rs[r]],
                  !.bo = [r \in Req |-> IF r \in gone THEN <<>> ELSE S.bo[r]],
                  !.sw = [r \in Req |-> IF r \in gone THEN <<>> ELSE S.sw[r]],
                  !.fs = @ \cup (IF Hybrid THEN UNION {Range(S.bo[r]) \cup SwHeld(S.sw[r]) : r \in gone}
                                 ELSE {}),
                  !.rc = @ \cup (IF inPlace THEN bad ELSE {}),
                  !.rd = S.rd \ ready,
                  !.rf = S.rf \ ready,
                  !.nh = S.nh \cup gone]

(* Then the admissions: get_num_new_matched_tokens answers load_async for  *)
(* a hit, so the request's block is allocated and it enters                 *)
(* WAITING_FOR_REMOTE_KVS instead of running (scheduler.py ~1320-1340):    *)
(* the forward does not write the block; the connector's metadata carries *)
(* a receive slice (`recv`) that every rank's start_load_kv submits.  The  *)
(* load is the request's only transfer until its receive is reported: its  *)
(* dumps from before a preemption were waited then, so the connector       *)
(* untracks it (else an abort during the load would be reported twice,    *)
(* and vLLM frees a finished request on the first report of either kind,  *)
(* scheduler.py ~3222-3235, while the load still writes).                 *)
(* Bug "async_empty_hit": the hit had nothing to transfer (vLLM #56640),   *)
(* so the connector records no load although it answered load_async.      *)
(* Bug "both_children_load" (N2): MultiConnector.update_state_after_alloc  *)
(* gives the external tokens to both children (vLLM 0.32 gives the second *)
(* 0, multi_connector.py ~467-479), so each child sends a receive slice.   *)
AsyncAdmit(S, x) ==
    LET m     == x.meta
        hits  == {a \in m.writes : a.hit}
        rq    == {a.req : a \in hits}
        ready == {r \in Req : S.rs[r] = "remote" /\ r \in S.rd}
        \* Under Hybrid a hit's load also writes its sliding-window blocks (not the null one).
        swLoads == IF Hybrid THEN {[req |-> a.req, block |-> a.sw] : a \in {h \in hits : h.sw # NullBlock}}
                   ELSE {}
        recv  == IF "async_empty_hit" \in Bugs THEN {}
                 ELSE IF BothLoad
                 THEN {[req |-> a.req, block |-> a.block, child |-> c] : a \in hits, c \in LoadChildren}
                 ELSE {[req |-> a.req, block |-> a.block] : a \in hits} \cup swLoads
        \* N2: MultiConnector's calls for the admission, each child's share of the hit
        alloc == IF BothLoad
                 THEN <<[name |-> "update_state_after_alloc", ucm_external |-> rq, sibling_external |-> rq]>>
                 ELSE <<>>
    IN  [S |-> [x.S EXCEPT !.rs = [r \in Req |-> IF r \in rq THEN "remote" ELSE x.S.rs[r]],
                           !.sa = IF "track_through_load" \in Bugs THEN x.S.sa ELSE x.S.sa \ rq],
         meta |-> [writes |-> m.writes \ hits, dump |-> m.dump, load |-> {},
                   preempted |-> m.preempted, freed |-> m.freed, finished |-> m.finished,
                   sibNow |-> m.sibNow, sibFin |-> m.sibFin, extra |-> m.extra,
                   sending |-> m.sending, failed |-> m.failed,
                   recv |-> recv,                            \* receive slices to submit
                   recving |-> [w \in Rank |-> {}],          \* set when the step runs
                   rfailed |-> [w \in Rank |-> {}]],
         rec |-> IF ~Record THEN x.rec
                 ELSE [x.rec EXCEPT !.calls =
                         <<[name |-> "_update_waiting_for_remote_kv", reqs |-> ready,
                            failed |-> ready \cap S.rf],
                           [name |-> "get_num_new_matched_tokens", load_async |-> rq]>> \o alloc \o @]]

NoRehit(S, x) == "retry_failed_hit" \in Bugs \/ \A a \in x.meta.writes : a.hit => a.req \notin S.nh
SchedResults(S) ==
    IF AL THEN LET P == Promote(S) IN {AsyncAdmit(S, x) : x \in {y \in ScheduleResults(P) : NoRehit(P, y)}}
    ELSE ScheduleResults(S)

-----------------------------------------------------------------------------
(***************************************************************************)
(* Worker ranks.  A rank's connector state is a record                     *)
(*   [async, pending, live, relErr, extra, sib, blocked, overWait,        *)
(*    overwrote, dirty, dirtyDump]                                         *)
(* threaded through the connector calls of one step in vLLM's runner       *)
(* order: handle_preemptions -> forward (writes) -> save_kv_layer ->       *)
(* wait_for_save -> get_finished.  Each call returns [s |-> new state,     *)
(* call |-> its record for `action`].                                      *)
(***************************************************************************)

Local(w) == [async |-> workerAsync[w], pending |-> pending[w], live |-> live[w],
             relErr |-> releaseErrors[w], extra |-> workerExtra[w],
             sib |-> sibPending[w], blocked |-> FALSE, overWait |-> FALSE,
             overwrote |-> FALSE, dirty |-> FALSE, dirtyDump |-> FALSE, nullWrite |-> FALSE,
             loads |-> loadTasks[w], recv |-> workerRecv[w], stale |-> staleSaves[w]]

(* A call's record when `action` records no calls (Record = FALSE).        *)
NoCall == <<>>

WaitOutcome(t) == IF t.status = "failed" THEN "error" ELSE "ok"

(* UCMDirectConnector._wait_pending_dump_task on every task of T: the      *)
(* store drains the transfer (blocking if still running), then returns or  *)
(* raises; the task is dropped either way; the event handle is released in *)
(* `finally` ("release_finally") or, in a mutant, only after a success.    *)
WaitTasks(s, T) ==
    LET rel == {t.event : t \in {u \in T : WaitLabel # "release_on_success"
                                           \/ WaitOutcome(u) = "ok"}}
    IN  [s EXCEPT !.pending = @ \ T, !.live = @ \ rel, !.relErr = @ \cup (rel \ s.live)]
WaitRecords(T) == {[task |-> t.id, reqs |-> t.reqs, outcome |-> WaitOutcome(t),
                    blocking |-> t.status = "running"] : t \in T}

NewId(s) == MinOf(TaskIds \ ({t.id : t \in s.pending} \cup s.live))

(* store.dump_data with a fresh event handle; on a submit failure the      *)
(* handle is released at once and no pending entry is created.            *)
Submit(s, reqs, blocks, layer, fails) ==
    IF fails THEN [s |-> s, id |-> 0]
    ELSE LET id == NewId(s)
             t  == [id |-> id, reqs |-> reqs, blocks |-> blocks,
                    layer |-> layer,
                    status |-> "running", event |-> id]
         IN  [s |-> [s EXCEPT !.pending = @ \cup {t}, !.live = @ \cup {id}], id |-> id]

(* handle_preemptions, the only worker hook before the forward.            *)
(* "wait_preempted": the preempted requests' tasks; "wait_all": every task *)
(* when anything was preempted; the fences (a fix for hybrid models):      *)
(* "wait_freed" also every task that reads a block freed since the last    *)
(* schedule (m.freed; a task surviving earlier fences read no block freed  *)
(* before them, so this is "freed since it was submitted");                *)
(* "wait_all_on_free" every task whenever a block was freed or a request   *)
(* preempted; "wait_all_always" every task in every step (a drain before   *)
(* each forward: it also covers blocks freed by a finish, which `freed`    *)
(* holds on hybrid models only).  A wait of a task that holds no preempted *)
(* request and reads no freed block is an over-wait.                       *)
handle_preemptions(w, m, s) ==
    LET ReadsFreed(t) == t.blocks \cap m.freed # {}
        Preempted(t) == t.reqs \cap m.preempted # {}
        One == IF m.preempted = {} THEN {} ELSE {CHOOSE r \in m.preempted : TRUE}
        T == CASE HPLabel = "wait_preempted" -> {t \in s.pending : Preempted(t)}
               [] HPLabel = "wait_one_preempted" -> {t \in s.pending : t.reqs \cap One # {}}
               [] HPLabel = "wait_all" -> IF m.preempted = {} THEN {} ELSE s.pending
               [] HPLabel = "wait_freed" -> {t \in s.pending : Preempted(t) \/ ReadsFreed(t)}
               [] HPLabel = "wait_all_on_free" ->
                      IF m.preempted = {} /\ m.freed = {} THEN {} ELSE s.pending
               [] HPLabel = "wait_all_always" -> s.pending
               [] OTHER -> {}
        over == \E t \in T : ~Preempted(t) /\ ~ReadsFreed(t)
        \* "count_per_req" (P2): the preemption ends the request's life cycle and resets its
        \* count; the completions of the saves waited here stay queued for the same id
        stale == IF Bug("count_per_req") THEN {r \in m.preempted : \E t \in T : r \in t.reqs} ELSE {}
    IN  [s |-> [WaitTasks(s, T) EXCEPT !.overWait = @ \/ over, !.stale = @ \cup stale],
         call |-> IF ~Record THEN NoCall ELSE
                  [name |-> "handle_preemptions", preempted_req_ids |-> m.preempted,
                   freed_blocks |-> m.freed, waited |-> WaitRecords(T)]]

(* start_load_kv ("async_loads"): the rank submits one load task per       *)
(* receive slice of the step (store.load_data into the request's block),   *)
(* and will report the request in finished_recving once its loads are over *)
(* (`recv`); it untracks the request's dumps (see AsyncAdmit).  The task   *)
(* writes its block until it completes.  A LoadTask is [req, block,        *)
(* status]: "running", then "done", "failed" or (fault "lost") "lost": it  *)
(* writes no more and never completes.  Under "both_children_load" (N2)   *)
(* it also names the child that submitted it (`child`, "ucm" or "sib"):   *)
(* MultiConnector.start_load_kv calls every child's (~319-321).           *)
IsLoadTask(t) ==
    /\ \/ DOMAIN t = {"req", "block", "status"}
       \/ BothLoad /\ DOMAIN t = {"req", "block", "status", "child"} /\ t.child \in LoadChildren
    /\ t.req \in Req /\ t.block \in Block /\ t.status \in {"running", "done", "failed", "lost"}
start_load_kv(w, m, s) ==
    LET new == IF AL /\ BothLoad
               THEN {[req |-> l.req, block |-> l.block, status |-> "running", child |-> l.child] : l \in m.recv}
               ELSE IF AL THEN {[req |-> l.req, block |-> l.block, status |-> "running"] : l \in m.recv}
               ELSE {}
        untrack == IF "track_through_load" \in Bugs THEN {} ELSE {t.req : t \in new}
    IN  [s |-> [s EXCEPT !.loads = @ \cup new, !.recv = @ \cup {t.req : t \in new},
                         !.async = @ \ untrack],
         call |-> IF ~Record THEN NoCall
                  ELSE IF BothLoad
                  THEN [name |-> "start_load_kv",
                        submitted |-> {<<t.req, t.block>> : t \in {u \in new : u.child = "ucm"}},
                        sibling_submitted |-> {<<t.req, t.block>> : t \in {u \in new : u.child = "sib"}}]
                  ELSE [name |-> "start_load_kv", submitted |-> {<<t.req, t.block>> : t \in new}]]

(* The model's forward: each newly allocated block is written with its     *)
(* request's prompt block (by the attention layers, or by the load of a    *)
(* store hit).  A still-running dump task reading such a block is being    *)
(* overwritten: the block was freed and reused under it.                   *)
(* Under Hybrid both groups' new blocks are written (`sw_writes`).         *)
SwWrites(m) == IF Hybrid THEN {<<a.sw, a.req, a.idx>> : a \in m.writes} ELSE {}
(* Under "store_visibility" a load of prompt `src` while a dump of that     *)
(* prompt still runs on this rank reads a half-written block (`dirty`).    *)
forward(w, m, s) ==
    LET wb == {a.block : a \in m.writes} \cup {x[1] : x \in SwWrites(m)}
        hit == \E t \in s.pending : t.status = "running" /\ t.blocks \cap wb # {}
        dirty == Mv("store_visibility") /\
                 \E l \in m.load : \E t \in s.pending : t.status = "running" /\ l.src \in t.reqs
        null == NullBlock \in wb
    IN  [s |-> [s EXCEPT !.overwrote = @ \/ hit, !.dirty = @ \/ dirty, !.nullWrite = @ \/ null],
         call |-> IF ~Record THEN NoCall ELSE
                  [name |-> "forward", writes |-> {<<a.block, a.req, a.idx>> : a \in m.writes},
                   sw_writes |-> SwWrites(m)]]

DumpReqs(m)   == {d.req : d \in m.dump}
\* (a slice's sliding-window block is the null block only in a recompute in place, N10: the
\* connector dumps no null block)
DumpBlocks(m) == {d.block : d \in m.dump} \cup (IF Hybrid THEN {d.sw : d \in m.dump} \ {NullBlock} ELSE {})

(* _dumping_requests: the slices a rank submits.  Every slice is tracked   *)
(* (DumpReqs: the scheduler tracks them all, and a request whose slice is  *)
(* skipped must still be reported), but "skip_failed_loads" submits none   *)
(* for a request whose load failed in this step (m.failed): its blocks    *)
(* hold KV computed over the failed load, and the scheduler rolls it back *)
(* and recomputes them in place in the next step.                         *)
SubSlices(m) == IF SliceLabel = "skip_failed_loads" THEN {d \in m.dump : d.req \notin m.failed}
                ELSE m.dump
SubReqs(m)   == {d.req : d \in SubSlices(m)}
SubBlocks(m) == {d.block : d \in SubSlices(m)} \cup (IF Hybrid THEN {d.sw : d \in SubSlices(m)} \ {NullBlock} ELSE {})

(* UCMLayerWiseConnector.save_kv_layer, once per layer: one task per layer *)
(* (layer l fails to submit iff l \in failed).                             *)
RECURSIVE SubmitLayers(_, _, _, _, _)
SubmitLayers(s, m, l, failed, recs) ==
    IF l > Layers THEN [s |-> s, calls |-> recs]
    ELSE LET r == Submit(s, SubReqs(m), SubBlocks(m), l, l \in failed)
         IN  SubmitLayers(r.s, m, l + 1, failed,
                          IF ~Record THEN recs
                          ELSE Append(recs, [name |-> "save_kv_layer", layer |-> l,
                                             submitted |-> r.id, submit_error |-> l \in failed]))

LayerSubmits(w, m) == SKLLabel = "submit_layer" /\ SubReqs(m) # {} /\ Dumps(w)

(* "sync_save": the step's dump slices are copied out before the call      *)
(* returns (vLLM's ExampleConnector.save_kv_layer: .cpu() then             *)
(* safetensors.torch.save_file); no task outlives the call, nothing to     *)
(* track or wait.  `saved` lists the blocks read.                          *)
SyncSaves(w, m, label) == label = "sync_save" /\ DumpReqs(m) # {} /\ Dumps(w)
SyncSaved(w, m, label) == IF SyncSaves(w, m, label) THEN DumpBlocks(m) ELSE {}

save_kv_layer(w, m, s, failed) ==
    IF LayerSubmits(w, m) THEN SubmitLayers(s, m, 1, failed, <<>>)
    ELSE IF SyncSaves(w, m, SKLLabel)
    THEN [s |-> s, calls |-> IF ~Record THEN <<>> ELSE [l \in 1..Layers |->
                                 [name |-> "save_kv_layer", layer |-> l, submitted |-> 0,
                                  submit_error |-> FALSE, saved |-> DumpBlocks(m)]]]
    ELSE [s |-> s, calls |-> <<>>]

(* Does wait_for_save submit a task on this rank in this step?             *)
StepSubmits(w, m) ==
    /\ WFSLabel \in {"poll_track_submit", "blocking", "track_after_mla_return"}
    /\ SubReqs(m) # {} /\ Dumps(w)

DoneTasks(s) == {t \in s.pending : t.status # "running"}

(* wait_for_save: poll-and-reap completed tasks (check raising keeps them),*)
(* record the step's dump requests in the worker set (before the MLA early *)
(* return, except in the "track_after_mla_return" mutant), then (Direct)   *)
(* submit one task for the step without waiting ("blocking": pre-PR, wait  *)
(* it at once). "wait_all": wait every pending task, running or done (the  *)
(* step's layer tasks and any older one) instead of polling: a connector   *)
(* whose wait_for_save drains its whole task list.                         *)
wait_for_save(w, m, s, checkErr, submitFails) ==
    IF WFSLabel = "sync_save" THEN
        [s |-> s, call |-> [name |-> "wait_for_save", reaped |-> {}, check_error |-> FALSE,
                            tracked |-> {}, submitted |-> 0, submit_error |-> FALSE,
                            blocked |-> {}, saved |-> SyncSaved(w, m, WFSLabel)]]
    ELSE IF WFSLabel = "base" THEN
        [s |-> s, call |-> [name |-> "wait_for_save", reaped |-> {}, check_error |-> FALSE,
                            tracked |-> {}, submitted |-> 0, submit_error |-> FALSE,
                            blocked |-> {}]]
    ELSE
    LET chk  == checkErr /\ DoneTasks(s) # {}
        reap == IF WFSLabel = "wait_all" THEN s.pending ELSE IF chk THEN {} ELSE DoneTasks(s)
        s1 == WaitTasks(s, reap)
        trk == IF WFSLabel = "track_after_mla_return" /\ ~Dumps(w) THEN {} ELSE DumpReqs(m)
        s2 == [s1 EXCEPT !.async = @ \cup trk]
        sub == IF StepSubmits(w, m) THEN Submit(s2, SubReqs(m), SubBlocks(m), 0, submitFails)
               ELSE [s |-> s2, id |-> 0]
        blk == IF WFSLabel = "blocking" /\ sub.id # 0
               THEN {t \in sub.s.pending : t.id = sub.id} ELSE {}
        s3 == [WaitTasks(sub.s, blk) EXCEPT !.blocked = @ \/ blk # {}]
    IN  [s |-> s3,
         call |-> IF ~Record THEN NoCall ELSE
                  [name |-> "wait_for_save", reaped |-> WaitRecords(reap),
                   check_error |-> chk, tracked |-> trk, submitted |-> sub.id,
                   submit_error |-> StepSubmits(w, m) /\ submitFails,
                   blocked |-> {t.id : t \in blk}]]

(* get_finished(finished_req_ids): wait every pending task overlapping a   *)
(* finished tracked request, report those requests (finished_sending).     *)
(* Under MultiConnector the second child reports its ids now or later, and *)
(* an id is emitted only by the last saving child (extra_async_saves).     *)
(* "wait_one_save" (P13): of each finished request's tasks only the one   *)
(* with the least id is waited.  "report_lost_on_error" (P9): a request   *)
(* whose wait raised is neither reported nor untracked.                   *)
(* "count_not_forwarded" (P6): ranks other than Rank0 report nothing.     *)
(* With "async_loads" it also reports finished_recving: every request it   *)
(* loads whose load tasks are over (failed_recving: one failed), dropping  *)
(* those tasks (a loading request is not tracked for dumps: start_load_kv). *)
(* Bug "drop_aborted_recv": the rank forgets the receives of finished      *)
(* requests.  Bug "both_children_load" (N2): each child reports a request *)
(* once its own load tasks of it are over, and MultiConnector reports the *)
(* union, uncounted (get_transfer_results, multi_connector.py ~358-377:    *)
(* finished_recving.update per child, unlike the count of extra saves), so *)
(* the child that finishes later reports the request a second time.      *)
get_finished(w, m, s, sibNow) ==
    LET af   == IF GFLabel \in {"wait_finished", "report_before_wait"}
                THEN m.finished \cap s.async ELSE {}
        Of(r) == {t \in s.pending : r \in t.reqs}
        \* "count_per_req" (P2): a finished request with a stale completion queued counts one
        \* save fewer than it has pending; its one save of this life cycle counts as done
        wf   == af \ s.stale
        T    == IF GFLabel = "wait_finished" /\ af # {}
                THEN IF Bug("wait_one_save")
                     THEN {CHOOSE t \in Of(r) : \A u \in Of(r) : t.id <= u.id : r \in {x \in af : Of(x) # {}}}
                     ELSE {t \in s.pending : t.reqs \cap wf # {}}
                ELSE {}
        s1   == WaitTasks(s, T)
        lost == IF Bug("report_lost_on_error")
                THEN {r \in af : \E t \in T : r \in t.reqs /\ WaitOutcome(t) = "error"} ELSE {}
        rin  == IF "drop_aborted_recv" \in Bugs THEN s.recv \ m.finished ELSE s.recv
        \* a lost load is given up once its expiry passes (abstracted: at any later get_finished)
        \* and reported failed; "no_load_expiry" waits for it forever
        Gone(t) == IF t.status = "lost" THEN "no_load_expiry" \notin Bugs ELSE t.status # "running"
        Over(r) == \A t \in s.loads : t.req = r => Gone(t)
        \* N2: the requests child c reports now (its load tasks of them are all over)
        ChildDone(c) == LET mine == {t \in s.loads : t.child = c}
                        IN  {r \in {t.req : t \in mine} : \A t \in mine : t.req = r => Gone(t)}
        childDone == IF BothLoad THEN [c \in LoadChildren |-> ChildDone(c)] ELSE <<>>
        Reported(t) == t.req \in childDone[t.child]
        rdone == IF BothLoad THEN UNION {childDone[c] : c \in LoadChildren}
                 ELSE {r \in rin : Over(r)}
        rfail == IF BothLoad
                 THEN {r \in rdone : \E t \in s.loads : t.req = r /\ Reported(t) /\ t.status \in {"failed", "lost"}}
                 ELSE {r \in rdone : \E t \in s.loads : t.req = r /\ t.status \in {"failed", "lost"}}
        loads1 == IF BothLoad THEN {t \in s.loads : ~Reported(t)} ELSE {t \in s.loads : t.req \notin rdone}
        recv1 == IF BothLoad THEN {t.req : t \in loads1} ELSE rin \ rdone
        ucm  == af \ lost
        sibAll == IF Multi THEN s.sib \cup (IF Mv("some_delayed") THEN m.sibFin ELSE m.finished)
                  ELSE {}
        sib  == IF sibNow THEN sibAll ELSE {}
        ex0  == s.extra \cup m.extra
        emitU == ucm \ ex0
        ex1  == ex0 \ ucm
        emitS == sib \ ex1
        ex2  == ex1 \ sib
        out  == IF Bug("count_not_forwarded") /\ w # Rank0 THEN {} ELSE emitU \cup emitS
    IN  [s |-> [s1 EXCEPT !.async = @ \ ucm, !.extra = ex2, !.sib = sibAll \ sib, !.stale = @ \ af,
                          !.loads = loads1, !.recv = recv1],
         out |-> out,
         recv |-> rdone,
         rfail |-> rfail,
         call |-> IF ~Record THEN NoCall
                  ELSE IF BothLoad
                  THEN [name |-> "get_finished", finished_req_ids |-> m.finished,
                        waited |-> WaitRecords(T), ucm_sending |-> ucm,
                        sibling_sending |-> sib, finished_sending |-> out,
                        ucm_recving |-> childDone["ucm"], sibling_recving |-> childDone["sib"],
                        finished_recving |-> rdone, failed_recving |-> rfail]
                  ELSE IF AL
                  THEN [name |-> "get_finished", finished_req_ids |-> m.finished,
                        waited |-> WaitRecords(T), ucm_sending |-> ucm,
                        sibling_sending |-> sib, finished_sending |-> out,
                        finished_recving |-> rdone, failed_recving |-> rfail]
                  ELSE [name |-> "get_finished", finished_req_ids |-> m.finished,
                        waited |-> WaitRecords(T), ucm_sending |-> ucm,
                        sibling_sending |-> sib, finished_sending |-> out]]

(* The nondeterministic choices of one rank's step, offered only where     *)
(* they are observable: which submits fail, whether check raises in the    *)
(* poll, whether the second child reports now.                             *)
ChoiceSets(w, m, pf) ==
    LET hp == pf.hp
        subF == IF "submit" \in Faults /\ StepSubmits(w, m) THEN BOOLEAN ELSE {FALSE}
        layF == IF "submit" \in Faults /\ LayerSubmits(w, m) THEN {{}, 1..Layers} ELSE {{}}
        chkF == IF "check" \in Faults /\ WFSLabel \notin {"base", "sync_save", "wait_all"} /\ DoneTasks(hp.s) # {}
                THEN BOOLEAN ELSE {FALSE}
    IN  [submit |-> subF, layers |-> layF, check |-> chkF]
Choices(w, m, pf) ==
    LET cs == ChoiceSets(w, m, pf) IN [submit: cs.submit, layers: cs.layers, check: cs.check]

(* vLLM's order within a rank's step; with DeferFinalize (a speculative-   *)
(* decoding drafter, `defer_finalize`) the runner collects get_finished    *)
(* (get_transfer_results) before the drafter and runs wait_for_save after  *)
(* it, in finalize_kv_connector: the step's tracking and submit come last. *)
(* Does the second child report on rank w in this step?  "split_reports":  *)
(* each rank decides on its own, so the aggregator holds partial counts.   *)
SibNow(m, w) == IF Mv("split_reports") THEN m.sibNow[w] ELSE m.sibNow

(* Does the rank dump (submit, or copy out) a slice of a request whose     *)
(* load failed in this step?                                               *)
DumpsFailed(w, m) ==
    /\ StepSubmits(w, m) \/ LayerSubmits(w, m) \/ SyncSaves(w, m, SKLLabel)
       \/ SyncSaves(w, m, WFSLabel)
    /\ SubReqs(m) \cap m.failed # {}

(* The part of a rank's step that no choice of the step changes: the      *)
(* pre-forward hook and the forward (they read neither the sibling's report *)
(* timing nor the step's failed loads), computed once per rank and step.   *)
(* "preempt_late" (P1): the forward runs first, the preemption waits after *)
(* it (the step's record keeps that order).                               *)
RankPrefix(w, m, s0) ==
    IF Bug("preempt_late")
    THEN LET sl == start_load_kv(w, m, s0)
             fw == forward(w, m, sl.s)
             hp == handle_preemptions(w, m, fw.s)
         IN  [hp |-> hp, sl |-> sl, fw |-> [s |-> hp.s, call |-> fw.call]]
    ELSE LET hp == handle_preemptions(w, m, s0)
             sl == start_load_kv(w, m, hp.s)
         IN  [hp |-> hp, sl |-> sl, fw |-> forward(w, m, sl.s)]

(* The rest of the step in two parts, so that the part before the second  *)
(* child's report (which the report timing `m.sibNow` does not change) is  *)
(* computed once for both timings: RankMid runs save_kv_layer (and, in the *)
(* usual order, wait_for_save), RankEnd the calls after it.                *)
RankMid(w, m, c, pf) ==
    LET skl == save_kv_layer(w, m, pf.fw.s, c.layers)
    IN  IF DeferFinalize THEN [s |-> skl.s, calls |-> skl.calls]
        ELSE LET wfs == wait_for_save(w, m, skl.s, c.check, c.submit)
             IN  [s |-> wfs.s, calls |-> IF ~Record THEN <<>> ELSE skl.calls \o <<wfs.call>>]
RankEnd(w, m, c, pf, mid) ==
    LET dd == DumpsFailed(w, m)
        head == IF ~Record THEN <<>>
                ELSE IF Bug("preempt_late")
                THEN (IF AL THEN <<pf.sl.call>> ELSE <<>>) \o <<pf.fw.call, pf.hp.call>> \o mid.calls
                ELSE <<pf.hp.call>> \o (IF AL THEN <<pf.sl.call>> ELSE <<>>) \o <<pf.fw.call>>
                     \o mid.calls
    IN  IF DeferFinalize
        THEN LET gf  == get_finished(w, m, mid.s, SibNow(m, w))
                 wfs == wait_for_save(w, m, gf.s, c.check, c.submit)
             IN  [s |-> [wfs.s EXCEPT !.dirtyDump = dd], out |-> gf.out, failed |-> m.failed,
                  recv |-> gf.recv, rfail |-> gf.rfail,
                  calls |-> IF ~Record THEN <<>> ELSE head \o <<gf.call, wfs.call>>]
        ELSE LET gf  == get_finished(w, m, mid.s, SibNow(m, w))
             IN  [s |-> [gf.s EXCEPT !.dirtyDump = dd], out |-> gf.out, failed |-> m.failed,
                  recv |-> gf.recv, rfail |-> gf.rfail,
                  calls |-> IF ~Record THEN <<>> ELSE head \o <<gf.call>>]
RankStep(w, m, c, pf) == RankEnd(w, m, c, pf, RankMid(w, m, c, pf))

(* Lockstep: one choice for all ranks, offered where some rank observes it.*)
GlobalChoices(m, P) ==
    LET cs == [w \in Rank |-> ChoiceSets(w, m, P[w])]
    IN  [submit: UNION {cs[w].submit : w \in Rank},
         layers: UNION {cs[w].layers : w \in Rank},
         check:  UNION {cs[w].check : w \in Rank}]

(* A rank's possible step results (each computed once, TLCEval-forced).   *)
RankResults(w, m, pf) == {TLCEval(RankStep(w, m, c, pf)) : c \in Choices(w, m, pf)}

(* Every combination of the ranks' results, as functions on ranks.         *)
RECURSIVE ResultFuns(_, _, _)
ResultFuns(m, P, S) ==
    IF S = {} THEN {<<>>}
    ELSE LET w == CHOOSE x \in S : TRUE
         IN  {(w :> x) @@ f : x \in RankResults(w, m, P[w]), f \in ResultFuns(m, P, S \ {w})}

Workers == [w \in Rank |-> Local(w)]

(* GPUModelRunner.execute_model on every rank for SchedulerOutput m: the   *)
(* set of per-rank result functions (ranks share nothing within a step, so *)
(* running them in one action loses no behaviour; README "Abstractions"). *)
(* Under EarlyFail the store also decides here which of the step's loads  *)
(* fail (`lf`, on every rank: the aggregator unions the ranks'             *)
(* invalid_block_ids, so a failure on any rank rolls the request back).    *)
SibNows == IF Mv("split_reports") THEN [Rank -> BOOLEAN] ELSE IF Multi THEN BOOLEAN ELSE {FALSE}
ExecResults(m, W) ==
    LET P == TLCEval([w \in Rank |-> RankPrefix(w, m, W[w])])
        Lfs == IF EarlyFail THEN SUBSET {l.req : l \in m.load} ELSE {{}}
    IN  IF Lockstep
        THEN UNION {LET ml == [m EXCEPT !.failed = lf]
                    IN  UNION {LET mid == TLCEval([w \in Rank |-> RankMid(w, ml, c, P[w])])
                               IN  {LET mm == [ml EXCEPT !.sibNow = sn]
                                    IN  [w \in Rank |-> TLCEval(RankEnd(w, mm, c, P[w], mid[w]))]
                                    : sn \in SibNows}
                               : c \in GlobalChoices(ml, P)}
                    : lf \in Lfs}
        ELSE UNION {ResultFuns([m EXCEPT !.sibNow = sn, !.failed = lf], P, Rank) : sn \in SibNows, lf \in Lfs}

SetWorkers(post) ==
    /\ workerAsync' = [w \in Rank |-> post[w].s.async]
    /\ pending' = [w \in Rank |-> post[w].s.pending]
    /\ live' = [w \in Rank |-> post[w].s.live]
    /\ releaseErrors' = [w \in Rank |-> post[w].s.relErr]
    /\ workerExtra' = [w \in Rank |-> post[w].s.extra]
    /\ sibPending' = [w \in Rank |-> post[w].s.sib]
    /\ reported' = [w \in Rank |-> [r \in Req |->
                      IF r \in post[w].out THEN IF reported[w][r] >= 2 THEN 2 ELSE reported[w][r] + 1
                      ELSE reported[w][r]]]
    /\ blockingWaits' = (blockingWaits \/ \E w \in Rank : post[w].s.blocked)
    /\ preemptOverWaits' = (preemptOverWaits \/ \E w \in Rank : post[w].s.overWait)
    /\ dumpOverwrites' = (dumpOverwrites \/ \E w \in Rank : post[w].s.overwrote)
    /\ dirtyLoads' = (dirtyLoads \/ \E w \in Rank : post[w].s.dirty)
    /\ dirtyDumps' = (dirtyDumps \/ \E w \in Rank : post[w].s.dirtyDump)
    /\ nullWrites' = (nullWrites \/ \E w \in Rank : post[w].s.nullWrite)
    /\ loadTasks' = [w \in Rank |-> post[w].s.loads]
    /\ workerRecv' = [w \in Rank |-> post[w].s.recv]
    /\ staleSaves' = [w \in Rank |-> post[w].s.stale]

Failed(post) == post[Rank0].failed
ExecRecord(post) == IF ~Record THEN [name |-> "execute_model"]
                    ELSE IF EarlyFail
                    THEN [name |-> "execute_model", ranks |-> [w \in Rank |-> post[w].calls],
                          load_errors |-> Failed(post)]
                    ELSE [name |-> "execute_model", ranks |-> [w \in Rank |-> post[w].calls]]
Sending(post) == [w \in Rank |-> post[w].out]
Recving(post) == [w \in Rank |-> post[w].recv]
RecvFails(post) == [w \in Rank |-> post[w].rfail]

-----------------------------------------------------------------------------
(***************************************************************************)
(* Scheduler: processing a step's output.                                  *)
(***************************************************************************)

(* UCMDirectConnector.request_finished (through the dispatch): delay iff   *)
(* tracked (and untrack).  Under MultiConnector the second child always    *)
(* delays, so async_saves = 1 + UCM's answer.                              *)
(* "rfag_delays_all" (P7): on the HMA path (scheduler.py ~3054-3057)      *)
(* request_finished_all_groups delays every request, tracked or not.      *)
(* Label "delay_all": a definition that always answers (True, ...) (a      *)
(* connector whose worker reports every finished request it is given).    *)
request_finished(S, r) ==
    \/ RFLabel = "delay_if_tracked" /\ r \in S.sa
    \/ RFLabel = "delay_all"
    \/ Bug("rfag_delays_all") /\ HMA /\ ~Multi

(* Scheduler.update_from_output for a step whose ranks sent `sending`:     *)
(* requests in `fin` stop or are aborted (running or preempted ones), call *)
(* request_finished and join finished_req_ids; then                        *)
(* _update_from_kv_xfer_finished frees the delayed requests every rank has *)
(* now reported.  A report for a request that is not delayed is the        *)
(* engine's `assert req_id in self.requests`.  Under Hybrid the finish     *)
(* path first frees the sliding-window blocks out of the window            *)
(* (Scheduler._connector_finished -> remove_skipped_blocks), so the lists  *)
(* request_finished_all_groups gets (`block_ids`, one per group) show them *)
(* as the null block and a delayed free no longer holds them.              *)
(* "sharers_recompute": the running requests that share a block whose load *)
(* failed are rolled back with the request whose load failed and recompute *)
(* it in place as well.                                                    *)
Sharers(S, fin, failed) ==
    IF Bug("sharers_recompute")
    THEN {q \in Req : /\ S.rs[q] = "running" /\ q \notin fin
                      /\ Range(S.bo[q]) \cap UNION {Range(S.bo[r]) : r \in failed} # {}}
    ELSE {}
UpdateResult(S, sending, fin, sibD, failed) ==
    LET ucmDelays == {r \in fin : request_finished(S, r)}
        delays    == IF Multi THEN ucmDelays \cup sibD ELSE ucmDelays
        st1 == [r \in Req |-> IF r \in fin THEN IF r \in delays THEN "delayed" ELSE "done"
                                         ELSE S.rs[r]]
        counts == [r \in Req |-> S.agg[r] + Cardinality({w \in Rank : r \in sending[w]})]
        emitted == {r \in Req : counts[r] >= IF "agg_first" \in Bugs THEN 1 ELSE NumRanks}
        unexpected == {r \in emitted : st1[r] # "delayed"}
        freed == {r \in emitted : st1[r] = "delayed"}
        sw1 == [r \in Req |-> IF r \in fin THEN SwKeepLast(S.sw[r]) ELSE S.sw[r]]
        gone == freed \cup (fin \ delays)
        \* "defer_block_free": processing the head step first advances the fences and drains
        \* (update_from_output ~2044-2048: only after a non-empty step), then a freed request
        \* that a later in-flight step ran is parked (_free_request_blocks ~2766-2776).
        h == IF Mv("defer_block_free") THEN Head(inflight) ELSE [ran |-> {}]
        Advance(e) == IF (h.ran # {} \/ Bug("fence_counts_empty")) /\ e.wait > 0
                      THEN [e EXCEPT !.wait = @ - 1] ELSE e
        pk1 == {e \in {Advance(x) : x \in S.pk} : h.ran = {} \/ e.wait > 0}
        fencedGone == IF Mv("defer_block_free") THEN gone \cap FencedFrom(2) ELSE {}
        pk2 == pk1 \cup Park(UNION {Range(S.bo[r]) : r \in fencedGone}, FenceWait(2, 0), "free")
        freedBlocks == IF Hybrid
                       THEN UNION {SwOut(S.sw[r]) : r \in fin}
                            \cup UNION {Range(S.bo[r]) \cup SwHeld(sw1[r]) : r \in gone}
                       ELSE {}
    IN  [S |-> [S EXCEPT
                  !.rs = [r \in Req |-> IF r \in freed THEN "done" ELSE st1[r]],
                  !.bo = [r \in Req |-> IF r \in gone THEN <<>> ELSE S.bo[r]],
                  !.sw = [r \in Req |-> IF r \in gone THEN <<>> ELSE sw1[r]],
                  !.fs = @ \cup freedBlocks,
                  !.sa = IF RFLabel = "delay_if_tracked" THEN @ \ fin ELSE @,
                  !.ex = @ \cup (IF Multi THEN ucmDelays \cap sibD ELSE {}),
                  !.sd = @ \cup (IF Mv("some_delayed") THEN sibD ELSE {}),
                  !.rc = @ \cup failed \cup Sharers(S, fin, failed),
                  \* "shared_prefix": the failed loads' blocks hold invalid KV (not evicted under
                  \* "recompute", scheduler.py ~3409-3413) until rewritten; the request whose load
                  \* failed is the first in `running` that holds it, and recomputes it (~3302-3336)
                  !.inv = @ \cup (IF SP THEN UNION {Range(S.bo[r]) : r \in failed} ELSE {}),
                  !.pk = pk2,
                  !.fin = @ \cup fin,
                  !.agg = [r \in Req |-> IF r \in emitted THEN 0 ELSE counts[r]],
                  !.unexp = @ \cup unexpected],
         rec |-> IF ~Record THEN [name |-> "update_from_output"] ELSE
                 [name |-> "update_from_output", finished |-> fin,
                  calls |-> << [name |-> "request_finished", reqs |-> fin,
                                ucm_delayed |-> ucmDelays, delayed |-> delays,
                                block_ids |-> IF Hybrid THEN [r \in fin |-> <<S.bo[r], sw1[r]>>]
                                              ELSE <<>>],
                               [name |-> "_update_from_kv_xfer_finished",
                                finished_sending |-> emitted, unexpected |-> unexpected] >>
                           \o (IF failed = {} THEN <<>>
                               ELSE IF SP
                               \* `affected`: every running request holding a failed block; `reqs`
                               \* recompute it, the others keep it as computed
                               THEN <<[name |-> "_update_requests_with_invalid_blocks", reqs |-> failed,
                                       affected |-> {q \in Req : S.rs[q] = "running" /\ q \notin fin
                                                      /\ Range(S.bo[q]) \cap UNION {Range(S.bo[r]) : r \in failed} # {}}]>>
                               ELSE <<[name |-> "_update_requests_with_invalid_blocks",
                                       reqs |-> failed]>>)]]

(* The step's outputs: which running or preempted requests finish; under  *)
(* "some_delayed" which of them the second child delays (`sibD`; else all  *)
(* of them: MultiConnector.request_finished, multi_connector.py ~578-593,  *)
(* delays iff some child does and records the extra saves); under          *)
(* "load_failure" which of the step's hit loads failed (`failed`: with     *)
(* kv_load_failure_policy "recompute", _update_requests_with_invalid_blocks *)
(* (scheduler.py ~3237-3354) rolls the request back to its first failed    *)
(* block; it keeps its blocks and recomputes them in the next schedule).   *)
(* Under EarlyFail the failed loads `lf` were decided in the step itself.  *)
UpdateResults(S, sending, loads, lf) ==
    UNION {LET Fails == IF EarlyFail
                        THEN {(lf \cap {r \in Req : S.rs[r] = "running"}) \ fin}
                        ELSE IF Mv("load_failure")
                        THEN SUBSET (({l.req : l \in loads} \cap {r \in Req : S.rs[r] = "running"}) \ fin)
                        ELSE {{}}
               SibDs == IF Mv("some_delayed") THEN SUBSET fin ELSE {fin}
           IN  {UpdateResult(S, sending, fin, sibD, failed) : sibD \in SibDs, failed \in Fails}
           : fin \in SUBSET {r \in Req : S.rs[r] \in {"running", "preempted"}}}

(* The receive side of update_from_output ("async_loads"): the aggregator  *)
(* counts each rank's finished_recving like finished_sending and emits an *)
(* id's failed_recving with its completion (KVOutputAggregator.aggregate, *)
(* kv_connector/utils.py ~102-185); _handle_failed_recving marks a waiting *)
(* request's receive failed (scheduler.py ~3341-3354, policy "recompute"), *)
(* and _update_from_kv_xfer_finished (~3222-3231) marks a waiting request  *)
(* received, frees a finished one (aborted while it waited), and asserts   *)
(* on any other (`unexpected`).  vLLM processes the receives before the    *)
(* sends of the same output; here they come after the sends, which        *)
(* changes only which of two reports for one request is the unexpected   *)
(* one.                                                                    *)
RecvUpdate(z, recving, rfailed) ==
    LET S == z.S
        counts  == [r \in Req |-> S.ar[r] + Cardinality({w \in Rank : r \in recving[w]})]
        fpend   == S.arf \cup UNION {rfailed[w] : w \in Rank}
        emitted == {r \in Req : counts[r] >= NumRanks}
        efail   == fpend \cap emitted
        remote  == {r \in emitted : S.rs[r] = "remote"}
        freed   == {r \in emitted : S.rs[r] = "delayed"}
        unexpected == emitted \ (remote \cup freed)
    IN  [S |-> [S EXCEPT !.rs = [r \in Req |-> IF r \in freed THEN "done" ELSE S.rs[r]],
                         !.bo = [r \in Req |-> IF r \in freed THEN <<>> ELSE S.bo[r]],
                         !.sw = [r \in Req |-> IF r \in freed THEN <<>> ELSE S.sw[r]],
                         !.fs = @ \cup (IF Hybrid
                                        THEN UNION {Range(S.bo[r]) \cup SwHeld(S.sw[r]) : r \in freed}
                                        ELSE {}),
                         !.rd = @ \cup remote,
                         !.rf = @ \cup (efail \cap remote),
                         !.ar = [r \in Req |-> IF r \in emitted THEN 0 ELSE counts[r]],
                         !.arf = fpend \ emitted,
                         !.unexp = @ \cup unexpected],
         rec |-> IF ~Record THEN z.rec
                 ELSE [z.rec EXCEPT !.calls =
                         @ \o <<[name |-> "_update_from_kv_xfer_finished",
                                 finished_recving |-> emitted, failed_recving |-> efail,
                                 unexpected |-> unexpected]>>]]

UpdResults(S, sending, loads, lf, recving, rfailed) ==
    IF AL THEN {RecvUpdate(z, recving, rfailed) : z \in UpdateResults(S, sending, loads, lf)}
    ELSE UpdateResults(S, sending, loads, lf)

NoRecv == [w \in Rank |-> {}]

-----------------------------------------------------------------------------
(***************************************************************************)
(* The engine loop's actions.                                              *)
(***************************************************************************)

schedule ==
    /\ ~FusedStep /\ ~down
    /\ Len(inflight) < MaxInflight
    /\ CanSchedule(SchedState)
    /\ \E x \in SchedResults(SchedState) :
         /\ SetSched(x.S)
         /\ inflight' = Append(inflight, x.meta)
         /\ action' = x.rec
    /\ UNCHANGED <<tick, executed, workerVars, blockingWaits, preemptOverWaits, dumpOverwrites,
                   dirtyLoads, dirtyDumps, nullWrites, down>>

execute_model ==
    /\ ~FusedStep /\ ~down
    /\ executed < Len(inflight)
    /\ \E post \in ExecResults(inflight[executed + 1], Workers) :
         /\ SetWorkers(post)
         /\ inflight' = IF AL
                         THEN [inflight EXCEPT ![executed + 1].sending = Sending(post),
                                               ![executed + 1].failed = Failed(post),
                                               ![executed + 1].recving = Recving(post),
                                               ![executed + 1].rfailed = RecvFails(post)]
                         ELSE [inflight EXCEPT ![executed + 1].sending = Sending(post),
                                               ![executed + 1].failed = Failed(post)]
         /\ executed' = executed + 1
         /\ action' = ExecRecord(post)
    /\ UNCHANGED <<tick, reqState, blocksOf, finishedIds, preemptions, agg, schedAsync, extraSaves,
                   recvDone, recvFailed, aggRecv, aggRecvFail, noHit, invalidKV, staleReads,
                   swBlocksOf, freedSince, sibDelayed, recompute, parked,
                   unexpectedReports, down>>

update_from_output ==
    /\ ~FusedStep
    /\ executed >= 1
    /\ ~down
    /\ \E z \in UpdResults(SchedState, Head(inflight).sending, Head(inflight).load,
                           Head(inflight).failed,
                           IF AL THEN Head(inflight).recving ELSE NoRecv,
                           IF AL THEN Head(inflight).rfailed ELSE NoRecv) :
         /\ SetSched(z.S)
         /\ action' = z.rec
    /\ inflight' = Tail(inflight)
    /\ executed' = executed - 1
    /\ tick' = 1 - tick
    /\ UNCHANGED <<workerVars, blockingWaits, preemptOverWaits, dumpOverwrites, dirtyLoads,
                   dirtyDumps, nullWrites, down>>

(* Sync scheduling in one action: schedule, every rank's execute_model,    *)
(* update_from_output.  Sound for these properties because the scheduler   *)
(* reads nothing the workers change within the step except the reports it *)
(* processes at its end, and store events commute with the scheduler's    *)
(* phases (README "Abstractions").                                         *)
engine_step ==
    /\ FusedStep /\ ~down
    /\ CanSchedule(SchedState)
    /\ \E x \in SchedResults(SchedState) :
       \E post \in ExecResults(x.meta, Workers) :
         \* the workers' variables first: once per rank result, not once per update result
         /\ SetWorkers(post)
         /\ \E z \in UpdResults(x.S, Sending(post), x.meta.load, Failed(post),
                                Recving(post), RecvFails(post)) :
              /\ SetSched(z.S)
              /\ action' = IF ~Record THEN [name |-> "engine_step"]
                            ELSE [name |-> "engine_step", phases |-> <<x.rec, ExecRecord(post), z.rec>>]
    /\ tick' = 1 - tick
    /\ UNCHANGED <<inflight, executed, down>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Store environment.                                                      *)
(***************************************************************************)

(* A dump task finishes asynchronously: it stops reading its blocks, with  *)
(* success or (fault "wait") an error that its later wait raises.  With    *)
(* Lockstep the ranks' stores finish all their running tasks together (a  *)
(* still-running task is the only hazard and completion only removes       *)
(* hazards, so this keeps every worst case; README "Abstractions").        *)
Running(w) == {t \in pending[w] : t.status = "running"}
Outcomes == IF "wait" \in Faults THEN {"ok", "error"} ELSE {"ok"}
Finish(t, outcome) == [t EXCEPT !.status = IF outcome = "ok" THEN "done" ELSE "failed"]

task_complete ==
    /\ ~down
    /\ IF Lockstep
       THEN LET ranks == {w \in Rank : Running(w) # {}}
            IN  /\ ranks # {}
                /\ \E outcome \in Outcomes :
                     /\ pending' = [w \in Rank |-> (pending[w] \ Running(w))
                                                   \cup {Finish(t, outcome) : t \in Running(w)}]
                     /\ action' = IF ~Record THEN [name |-> "task_complete"] ELSE
                                  [name |-> "task_complete", ranks |-> ranks,
                                   tasks |-> [w \in ranks |-> {t.id : t \in Running(w)}],
                                   outcome |-> outcome]
       ELSE \E w \in Rank : \E t \in Running(w) : \E outcome \in Outcomes :
              /\ pending' = [pending EXCEPT ![w] = (@ \ {t}) \cup {Finish(t, outcome)}]
              /\ action' = IF ~Record THEN [name |-> "task_complete"] ELSE
                            [name |-> "task_complete", rank |-> w, task |-> t.id,
                            outcome |-> outcome]
    /\ UNCHANGED <<schedVars, workerAsync, live, releaseErrors, workerExtra, sibPending,
                   reported, loadTasks, workerRecv, staleSaves, historyVars, tick>>

(* EngineCore keeps stepping while the scheduler has requests, finished    *)
(* ids not yet shown to the workers included (has_finished_requests,       *)
(* scheduler.py ~2813).                                                    *)
HasWork == (\E r \in Req : reqState[r] \notin NoWorkStates) \/ inflight # <<>> \/ finishedIds # {}

(* "shutdown": the worker process shuts down between two engine phases;   *)
(* KVConnectorBase_V1.shutdown (base.py ~431: "ensure that all the async   *)
(* operations are completed and the connector is cleaned up") waits every  *)
(* pending dump task of the rank and releases its event handle; nothing    *)
(* runs afterwards.  Bug "shutdown_no_release": the tasks are drained but  *)
(* their handles kept.                                                     *)
shutdown ==
    /\ Mv("shutdown") /\ ~down
    /\ down' = TRUE
    /\ LET post == [w \in Rank |-> WaitTasks(Local(w), pending[w])]
       IN  /\ pending' = [w \in Rank |-> {}]
           /\ live' = IF "shutdown_no_release" \in Bugs THEN live ELSE [w \in Rank |-> post[w].live]
           /\ releaseErrors' = IF "shutdown_no_release" \in Bugs THEN releaseErrors
                               ELSE [w \in Rank |-> post[w].relErr]
    /\ action' = IF ~Record THEN [name |-> "shutdown"]
                  ELSE [name |-> "shutdown", ranks |-> [w \in Rank |-> WaitRecords(pending[w])]]
    /\ UNCHANGED <<schedVars, workerAsync, workerExtra, sibPending, reported, loadTasks, workerRecv, staleSaves,
                   unexpectedReports,
                   blockingWaits, preemptOverWaits, dumpOverwrites, dirtyLoads, dirtyDumps, nullWrites,
                   tick>>

(* Scheduler.finish_requests (scheduler.py ~2649-2712): an abort from the  *)
(* API server, processed between engine phases.  A request waiting for    *)
(* remote KV gets a delayed free unless its receive has already finished   *)
(* (~2702-2708, PR #32255; bugs "abort_no_recv_delay", "abort_always_delays" *)
(* get it wrong each way); like any finish it calls request_finished       *)
(* (_free_request -> _connector_finished, ~2714-2744), which may delay the *)
(* free too, and joins finished_req_ids.  An abort of a finished request   *)
(* is skipped (~2673: is_finished()); bug "abort_frees_finished" frees a   *)
(* delayed one.  (Aborts of running requests are the stops of             *)
(* update_from_output.)                                                    *)
AbortRecord(r, from, ucmD, delayed) ==
    IF ~Record THEN [name |-> "finish_requests"]
    ELSE [name |-> "finish_requests", req |-> r, status |-> from, delayed |-> delayed,
          calls |-> IF from = "remote"
                    THEN <<[name |-> "request_finished", reqs |-> {r},
                            ucm_delayed |-> ucmD, delayed |-> delayed]>>
                    ELSE <<>>]
(* An abort that frees request r (`frees`) frees its sliding-window blocks  *)
(* too, which join the blocks freed since the last schedule (Hybrid).      *)
FreeSw(r, frees) ==
    /\ swBlocksOf' = IF frees THEN [swBlocksOf EXCEPT ![r] = <<>>] ELSE swBlocksOf
    /\ freedSince' = IF frees /\ Hybrid
                     THEN freedSince \cup Range(blocksOf[r]) \cup SwHeld(swBlocksOf[r])
                     ELSE freedSince
finish_requests ==
    /\ ~down
    /\ \E r \in Req :
         \/ /\ AL /\ reqState[r] = "remote"
            /\ LET recvDelay == CASE "abort_no_recv_delay" \in Bugs -> FALSE
                                  [] "abort_always_delays" \in Bugs -> TRUE
                                  [] OTHER -> r \notin recvDone
                   ucmD  == request_finished(SchedState, r)
                   delay == recvDelay \/ ucmD
               IN  /\ reqState' = [reqState EXCEPT ![r] = IF delay THEN "delayed" ELSE "done"]
                   /\ blocksOf' = IF delay THEN blocksOf ELSE [blocksOf EXCEPT ![r] = <<>>]
                   /\ FreeSw(r, ~delay)
                   /\ schedAsync' = IF RFLabel = "delay_if_tracked" THEN schedAsync \ {r}
                                    ELSE schedAsync
                   /\ finishedIds' = finishedIds \cup {r}
                   /\ recvDone' = recvDone \ {r}
                   /\ recvFailed' = recvFailed \ {r}
                   /\ action' = AbortRecord(r, "remote", IF ucmD THEN {r} ELSE {},
                                            IF delay THEN {r} ELSE {})
         \/ /\ "abort_frees_finished" \in Bugs /\ reqState[r] = "delayed"
            /\ reqState' = [reqState EXCEPT ![r] = "done"]
            /\ blocksOf' = [blocksOf EXCEPT ![r] = <<>>]
            /\ FreeSw(r, TRUE)
            /\ UNCHANGED <<schedAsync, finishedIds, recvDone, recvFailed>>
            /\ action' = AbortRecord(r, "delayed", {}, {})
    /\ UNCHANGED <<preemptions, inflight, executed, agg, extraSaves,
                   sibDelayed, recompute, parked, aggRecv, aggRecvFail, noHit, invalidKV, staleReads,
                   workerVars,
                   historyVars, tick>>

(* The store finishes a load task ("async_loads"): it stops writing its    *)
(* block, with success or (under "load_failure") an error, or (fault       *)
(* "lost") it is lost: it writes no more and never reports.                *)
LoadOutcomes == {"done"} \cup (IF Mv("load_failure") THEN {"failed"} ELSE {})
                \cup (IF "lost" \in Faults THEN {"lost"} ELSE {})
(* Under Hybrid a request's load of one KV-cache group is one store task:  *)
(* its blocks' load tasks end together (the full-attention group's two     *)
(* blocks of a HybridHit; the sliding-window group's one).                 *)
LoadGroup(w, t) ==
    IF Hybrid
    THEN {u \in loadTasks[w] : /\ u.req = t.req /\ u.status = "running"
                               /\ (u.block \in Range(blocksOf[t.req])) = (t.block \in Range(blocksOf[t.req]))}
    ELSE {t}
load_complete ==
    /\ AL /\ ~down
    /\ \E w \in Rank : \E t \in loadTasks[w] : \E o \in LoadOutcomes :
         /\ t.status = "running"
         /\ LET T == LoadGroup(w, t)
            IN  loadTasks' = [loadTasks EXCEPT ![w] = (@ \ T) \cup {[u EXCEPT !.status = o] : u \in T}]
         /\ action' = IF ~Record THEN [name |-> "load_complete"]
                      ELSE IF Hybrid
                      THEN [name |-> "load_complete", rank |-> w, req |-> t.req,
                            blocks |-> {u.block : u \in LoadGroup(w, t)}, outcome |-> o]
                      ELSE IF BothLoad
                      THEN [name |-> "load_complete", rank |-> w, req |-> t.req,
                            block |-> t.block, outcome |-> o, child |-> t.child]
                      ELSE [name |-> "load_complete", rank |-> w, req |-> t.req,
                            block |-> t.block, outcome |-> o]
    /\ UNCHANGED <<schedVars, workerAsync, pending, live, releaseErrors, workerExtra, sibPending,
                   reported, workerRecv, staleSaves, historyVars, tick>>

(* Nothing left, or shut down: the engine idles (stuttering, so TLC sees   *)
(* no deadlock).                                                           *)
Idle == (~HasWork \/ down) /\ UNCHANGED vars

Next == schedule \/ execute_model \/ update_from_output \/ engine_step \/ task_complete
        \/ shutdown \/ finish_requests \/ load_complete \/ Idle

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
(***************************************************************************)
(* Properties.                                                             *)
(***************************************************************************)

TypeInv ==
    /\ reqState \in [Req -> ReqStates]
    /\ \A r \in Req : blocksOf[r] \in Seq(Block) /\ Len(blocksOf[r]) <= NeedBlocks(r)
    /\ \A r \in Req : swBlocksOf[r] \in Seq(Block \cup {NullBlock})
                     /\ Len(swBlocksOf[r]) <= NeedBlocks(r)
                     /\ (~Hybrid => swBlocksOf[r] = <<>>)
    /\ freedSince \subseteq Block /\ (~Hybrid => freedSince = {})
    /\ finishedIds \subseteq Req
    /\ preemptions \in 0..MaxPreempt
    /\ Len(inflight) <= MaxInflight /\ executed \in 0..Len(inflight)
    /\ agg \in [Req -> 0..NumRanks]
    /\ schedAsync \subseteq Req /\ extraSaves \subseteq Req
    /\ workerAsync \in [Rank -> SUBSET Req]
    /\ \A w \in Rank : \A t \in pending[w] : IsTask(t)
    /\ live \in [Rank -> SUBSET TaskIds]
    /\ releaseErrors \in [Rank -> SUBSET TaskIds]
    /\ unexpectedReports \subseteq Req
    /\ blockingWaits \in BOOLEAN /\ preemptOverWaits \in BOOLEAN /\ dumpOverwrites \in BOOLEAN
    /\ workerExtra \in [Rank -> SUBSET Req] /\ sibPending \in [Rank -> SUBSET Req]
    /\ reported \in [Rank -> [Req -> 0..2]]
    /\ sibDelayed \subseteq Req /\ recompute \subseteq Req
    /\ \A e \in parked : /\ DOMAIN e = {"blocks", "wait", "by"} /\ e.blocks \subseteq Block
                         /\ e.wait \in 0..(MaxInflight + 1) /\ e.by \in {"preempt", "free"}
    /\ (~Mv("defer_block_free") => parked = {})
    /\ down \in BOOLEAN /\ dirtyLoads \in BOOLEAN /\ dirtyDumps \in BOOLEAN
    /\ nullWrites \in BOOLEAN /\ (~Hybrid => ~nullWrites)
    /\ invalidKV \subseteq Block /\ staleReads \in BOOLEAN /\ (~SP => invalidKV = {} /\ ~staleReads)
    /\ recvDone \subseteq Req /\ recvFailed \subseteq Req
    /\ aggRecv \in [Req -> 0..NumRanks] /\ aggRecvFail \subseteq Req /\ noHit \subseteq Req
    /\ \A w \in Rank : \A t \in loadTasks[w] : IsLoadTask(t)
    /\ workerRecv \in [Rank -> SUBSET Req]
    /\ staleSaves \in [Rank -> SUBSET Req] /\ (~Bug("count_per_req") => \A w \in Rank : staleSaves[w] = {})
    /\ (~AL => /\ recvDone = {} /\ aggRecvFail = {} /\ noHit = {}
               /\ \A w \in Rank : loadTasks[w] = {} /\ workerRecv[w] = {})
    /\ tick \in {0, 1}
    /\ action.name \in {"init", "schedule", "execute_model", "update_from_output",
                        "engine_step", "task_complete", "shutdown", "finish_requests",
                        "load_complete"}

(* No forward ever rewrites a block that a pending, still-running dump     *)
(* task reads (the block was freed and reused since the submit).  A        *)
(* history flag, because the victim task may be waited later in the same  *)
(* step and leave no trace in the state.                                   *)
NoOverwriteWhileDumpingInv ==
    ~dumpOverwrites

(* No finished_sending reaches the scheduler for a request that was not    *)
(* delayed or is already freed (vLLM's assertion).                         *)
NoUnexpectedReportInv == unexpectedReports = {}

(* Has rank w's connector been told (finished_req_ids) that r finished?    *)
SeenFinished(w, r) ==
    /\ reqState[r] \in {"delayed", "done"}
    /\ r \notin finishedIds
    /\ \A k \in (executed + 1)..Len(inflight) : r \notin inflight[k].finished

(* Each rank reports a request at most once, and only after seeing it in   *)
(* finished_req_ids (the aggregator counts one report per rank).           *)
ReportOnceInv ==
    \A w \in Rank : \A r \in Req :
        /\ reported[w][r] <= 1
        /\ reported[w][r] = 1 => SeenFinished(w, r)

(* Every event handle is released at most once (never when not live).     *)
EventReleasedOnceInv == \A w \in Rank : releaseErrors[w] = {}

(* A handle is live exactly while its task is pending.                     *)
NoEventLeakInv == \A w \in Rank : live[w] = {t.event : t \in pending[w]}

(* wait_for_save never blocks on an incomplete task (the PR's claim).      *)
NoWaitInWaitForSaveInv == ~blockingWaits

(* handle_preemptions waits only tasks that contain a preempted request.   *)
PreemptWaitsOnlyPreemptedInv == ~preemptOverWaits

(* The scheduler tracks only unfinished requests (request_finished untracks *)
(* a finishing one): a tracked id that outlives its request is never       *)
(* untracked, a hang in the making.                                        *)
SchedTracksUnfinishedInv ==
    \A r \in schedAsync : reqState[r] \in {"waiting", "running", "preempted"}

(* Once the steps that dump a request have run, every rank tracks every    *)
(* request the scheduler tracks: a rank that does not will never report it *)
(* and its delayed free never comes (caught here in a few states instead   *)
(* of by the liveness properties).                                         *)
WorkersTrackInv ==
    \A r \in schedAsync :
        (\A k \in (executed + 1)..Len(inflight) : r \notin DumpReqs(inflight[k]))
            => \A w \in Rank : r \in workerAsync[w]

(* Shutdown drains: nothing pending, no live handle, on any rank.          *)
ShutdownDrainedInv == down => \A w \in Rank : pending[w] = {} /\ live[w] = {}

(* The store contract ("store_visibility"): a load never reads a prompt    *)
(* whose dump is still running on the rank.                                *)
NoLoadWhileDumpingInv == ~dirtyLoads

(* No dump reads a block computed over a failed load: with policy         *)
(* "recompute" the step that loads a partial hit may also compute and dump *)
(* the next block, whose KV then attends over whatever the failed load     *)
(* left in the hit blocks; the store would keep wrong KV under that       *)
(* block's key, which every later hit loads.                              *)
NoDumpOfFailedLoadInv == ~dirtyDumps

(* No forward writes vLLM's null block (Hybrid): a position the sliding    *)
(* window left holds the null block in the group's list, which every      *)
(* request shares; KV written there is read back as another position's by *)
(* no one and overwritten by everyone (vLLM #56733).                      *)
NoNullBlockWriteInv == ~nullWrites

(* The block pool (vLLM's BlockPool and its reference counts): a block is  *)
(* held by one request at a time unless two requests share it through the *)
(* prefix cache ("shared_prefix"); a block parked by a deferred free is    *)
(* held by no request; the two groups of a hybrid model never hold the     *)
(* same block.  A free that forgets a holder, or an allocation that picks  *)
(* a held block, breaks it before any forward writes under the holder.     *)
BlocksExclusiveInv ==
    /\ \A r, q \in Req : r # q =>
          /\ SP \/ Range(blocksOf[r]) \cap Range(blocksOf[q]) = {}
          /\ SwHeld(swBlocksOf[r]) \cap SwHeld(swBlocksOf[q]) = {}
    /\ \A r, q \in Req : Range(blocksOf[r]) \cap SwHeld(swBlocksOf[q]) = {}
    /\ \A e \in parked : \A r \in Req : e.blocks \cap (Range(blocksOf[r]) \cup SwHeld(swBlocksOf[r])) = {}

(* No request runs over a block whose KV a failed load left invalid      *)
(* ("shared_prefix"): the request that recomputes it rewrites it first, in *)
(* an earlier step or in the same one (vLLM #49250: a request sharing the  *)
(* block resumed while the one recomputing it was still part-way).         *)
NoStaleReadInv == ~staleReads

(* A preemption frees its victims' blocks for the allocation that made it *)
(* ("defer_block_free"): no victim's blocks are parked by a deferred free *)
(* (vLLM #49674: such preemptions free nothing, and the retry preempts    *)
(* more victims).                                                          *)
NoFruitlessPreemptionInv == \A e \in parked : e.by # "preempt"

(* A deferred free is returned as soon as its fence has passed ("defer_block_free"): *)
(* the count of a parked entry reaches 0 only when a non-empty step's output is    *)
(* processed, and that drain returns it (UCM #1350: a drain skipped after an empty  *)
(* step leaves it parked, and with every block parked every later step is empty).  *)
DrainedWhenDueInv == \A e \in parked : e.wait > 0

(* Asynchronous loads ("async_loads").  No load writes a block after it    *)
(* was freed or handed to another request: while a load task runs, its     *)
(* request holds the block and waits for remote KV or for its delayed free *)
(* (a freed block may be allocated in the next schedule and written by     *)
(* its new owner's forward while the load still writes it).               *)
NoLoadIntoFreedBlockInv ==
    \A w \in Rank : \A t \in loadTasks[w] :
        t.status = "running" => /\ reqState[t.req] \in {"remote", "delayed"}
                               /\ t.block \in Range(blocksOf[t.req]) \cup SwHeld(swBlocksOf[t.req])

(* A freed request has nothing in flight: no running load of it and no     *)
(* running dump task reading it, on any rank (a request with both a save   *)
(* and a load pending is freed only after both).                           *)
FreedAfterTransfersInv ==
    \A r \in Req : reqState[r] = "done" =>
        \A w \in Rank : /\ \A t \in loadTasks[w] : t.status = "running" => t.req # r
                        /\ \A t \in pending[w] : t.status = "running" => r \notin t.reqs

(* A request waiting for remote KV has a load that will be reported: some  *)
(* rank still loads it, or the scheduler knows its receive finished (a     *)
(* request with neither waits forever).  Unfused, a report may also sit  *)
(* in an executed step's output that the scheduler has not processed yet  *)
(* (`recving`).                                                           *)
RemoteHasLoadInv ==
    \A r \in Req : reqState[r] = "remote" =>
        \/ r \in recvDone
        \/ aggRecv[r] > 0
        \/ \E w \in Rank : r \in workerRecv[w]
        \/ \E k \in 1..Len(inflight) : r \in {l.req : l \in inflight[k].recv}
        \/ \E k \in 1..executed : \E w \in Rank : r \in inflight[k].recving[w]

-----------------------------------------------------------------------------
(* Liveness, under fairness stated as premises over state predicates      *)
(* (cheap to check; weak fairness on the big step action is ruinous):      *)
(* EngineFair: while it has work the engine keeps completing steps (`tick` *)
(* flips; vLLM keeps stepping while delayed requests exist).  StoreFair:   *)
(* infinitely often no dump task is running (every task eventually         *)
(* completes; submissions are finite).  SiblingFair: the second child      *)
(* eventually reports what it has seen.  Checked without SYMMETRY.         *)

AnyRunningTask == \E w \in Rank : \/ \E t \in pending[w] : t.status = "running"
                                 \/ \E t \in loadTasks[w] : t.status = "running"
EngineFair == []<>(tick = 0 \/ ~HasWork) /\ []<>(tick = 1 \/ ~HasWork)
StoreFair  == []<>(~AnyRunningTask)
(* Under "idle_ignores_delayed" the sibling's promise is conditional: it   *)
(* reports in some later step if the engine keeps stepping (a stopped     *)
(* engine calls no get_finished).                                         *)
SiblingFair == \/ []<>(\A w \in Rank : sibPending[w] = {})
               \/ Bug("idle_ignores_delayed") /\ (<>[](tick = 0) \/ <>[](tick = 1))
Fair == EngineFair /\ StoreFair /\ SiblingFair

DelayedEventuallyFreedProp ==
    Fair => \A r \in Req : (reqState[r] = "delayed") ~> (reqState[r] = "done")

PendingEventuallyDrainedProp ==
    Fair => \A w \in Rank : (pending[w] # {}) ~> (pending[w] = {})

(* "defer_block_free": every deferred free eventually returns its blocks. *)
ParkedEventuallyFreedProp == Fair => (parked # {} ~> parked = {})

EventsEventuallyReleasedProp ==
    Fair => \A w \in Rank : (live[w] # {}) ~> (live[w] = {})

(* "async_loads": every request waiting for remote KV eventually runs,     *)
(* waits afresh (its load failed) or is freed.                             *)
RemoteEventuallyLeavesProp ==
    Fair => \A r \in Req : (reqState[r] = "remote") ~> (reqState[r] # "remote")

(* Requests and blocks are interchangeable: safety models only (never     *)
(* with liveness).                                                         *)
Symmetry == Permutations(Req) \cup Permutations(Block)
=============================================================================
