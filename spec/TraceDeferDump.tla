--------------------------- MODULE TraceDeferDump ---------------------------
(***************************************************************************)
(* Trace validation: is a real vLLM run's connector event log (NDJSON,    *)
(* docs/trace-log.md) a behaviour of DeferDump?  `deferdump validate`     *)
(* merges the processes' logs in engine order and generates an MC module  *)
(* that gives TraceLog (the log as a sequence of records) and the         *)
(* constants read from it.  A counter `l` walks the log: each logged      *)
(* event is one action that asserts the logged arguments and results      *)
(* against the state and advances `l`; the hidden store action            *)
(* `task_complete` may run between events, only for the tasks the next    *)
(* event reaps (etcd's and CCF's technique, with TLC 2.15: no Json module *)
(* and no POSTCONDITION, so the log is a literal and the witness of a     *)
(* full match is the invariant TraceNotDoneInv VIOLATED).                 *)
(*                                                                         *)
(* Grain.  Real vLLM schedules chunks of many tokens and many blocks, not *)
(* DeferDump's one block per step, so this module keeps DeferDump's       *)
(* variables and decisions at the log's grain: the request and task       *)
(* state, the scheduler's delay decision (DD!request_finished through the *)
(* class table), the worker's waits, and DeferDump's safety invariants,   *)
(* evaluated by DD on these very variables.                               *)
(*                                                                         *)
(* A field no behaviour reproduces: `Logged` records in `why` the first   *)
(* failed check of the next event instead (TraceAcceptedInv).            *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets, TLC, RealTable

CONSTANTS
    TraceLog,       \* the merged log: a sequence of event records
    TraceReq,       \* request ids in the log (strings)
    TraceBlock,     \* vLLM block ids in the log (integers)
    TraceRank,      \* worker ranks that wrote a log (integers)
    BlockSize,      \* tokens per vLLM block
    Window          \* tokens in the sliding window of the second KV-cache group (a hybrid
                    \*   model); 0: one KV-cache group

(* The constants, through zero-arity definitions: TLC evaluates a         *)
(* constant-level definition once, before the search, and keeps its value, *)
(* but a CONSTANT bound in the cfg to a definition (TraceLog <- GenLog)    *)
(* re-evaluates that definition's body at every reference: a 1,000-event  *)
(* log literal rebuilt several times per state makes the search quadratic *)
(* in the log's length.  Everything below reads these, never the four     *)
(* CONSTANTs (BlockSize and Window are plain integers).                    *)
Log == TraceLog
Reqs == TraceReq
Blocks == TraceBlock
Ranks == TraceRank

VARIABLES
    l,              \* events of Log matched so far
    why,            \* "" while matching; else why the next event matches no behaviour
    reqState,       \* [live requests -> state]: running, preempted, delayed; a request out
                    \*   of the domain is waiting or done (sparse: a log has many requests)
    blocksOf,       \* [live requests -> Seq(block)]: the blocks vLLM holds for the request
                    \*   (the full-attention group's under a hybrid model)
    swOf,           \* [live requests -> Seq(block or 0)]: the sliding-window group's block of
                    \*   each position, 0 (vLLM's null block) once it left the window and was
                    \*   freed; <<>> everywhere with one group
    freedSince,     \* blocks freed since the last schedule (hybrid only, else {}): window,
                    \*   finish and preemption frees, which a fence may wait for
    finishedIds,    \* requests finished since the last schedule (Scheduler.finished_req_ids)
    schedAsync,     \* the scheduler connector's tracked requests (_async_dump_req_ids)
    schedStep,      \* the last step the scheduler built
    metas,          \* [steps -> metadata]: built steps some rank has not yet run
    workerAsync,    \* [Ranks -> SUBSET Reqs]: the worker's tracked requests
    pending,        \* [Ranks -> set of [id, reqs, blocks, status]]: pending dump tasks
    wStep,          \* [Ranks -> step]: the step the rank runs (or last ran)
    wPhase,         \* [Ranks -> last call]: "hp", "wfs" or "gf" (a step's order)
    reports,        \* set of <<req, rank>>: a rank reported the request, not yet delivered
    reportedTwice,  \* has a rank reported a request it had reported, not yet delivered?
    unexpectedReports, \* finished_sending delivered for a request that was not delayed
    dumpOverwrites, \* a forward wrote a block that a still-running dump task reads
    preemptOverWaits, \* handle_preemptions waited a task of no preempted request
    blockingWaits,  \* (never set: a log cannot show a wait_for_save block; kept for DD)
    \* ---- asynchronous loads (receive events; constant in a log without them) ----
    asyncLookup,    \* requests whose last get_num_new_matched_tokens answered load_async
    received,       \* requests waiting for remote KV ("remote") whose finished_recving vLLM got
    recvDelayed,    \* requests aborted while their load ran: vLLM frees them at finished_recving
    wLoads,         \* [Ranks -> set of [req, blocks]]: loads the rank submitted and has not reported
    recvReports     \* set of <<req, rank>>: a rank reported the request in finished_recving, not
                    \*   yet delivered

recvVars == <<asyncLookup, received, recvDelayed, wLoads, recvReports>>
vars == <<l, why, reqState, blocksOf, swOf, freedSince, finishedIds, schedAsync, schedStep, metas, workerAsync,
          pending, wStep, wPhase, reports, reportedTwice, unexpectedReports, dumpOverwrites,
          preemptOverWaits, blockingWaits, recvVars>>

(* A hybrid model: two KV-cache groups, full attention and a sliding window *)
(* (DeferDump's Hybrid).  vLLM's null block id is 0.                       *)
IsHybrid == Window > 0
SwOf(r) == IF r \in DOMAIN swOf THEN swOf[r] ELSE <<>>
SwHeld(seq) == {seq[i] : i \in {j \in DOMAIN seq : seq[j] # 0}}

(* The model under check, on this module's variables; DeferDump's other    *)
(* variables do not exist at the log's grain and are fixed.  The class    *)
(* table is the one merged (RealTable): the reference connector's.        *)
DD == INSTANCE DeferDump WITH
    Classes <- RealClasses, Bases <- RealBases, Behaviour <- RealBehaviour,
    Defines <- DefinesFrom(RealBehaviour),
    Req <- Reqs, Block <- Blocks, Rank <- Ranks, Rank0 <- 0,
    PromptBlocks <- 1, Layers <- 1, MaxPreempt <- 0, MaxInflight <- 2,
    InnerClass <- "UCMDirectConnector", Wrapper <- TRUE, HMA <- IsHybrid, Multi <- FALSE,
    MLA <- FALSE, Faults <- {"submit", "wait", "check"}, Lockstep <- FALSE, FusedStep <- FALSE,
    StoreHits <- FALSE, ShortReqs <- {}, DeferFinalize <- FALSE, Hybrid <- IsHybrid,
    Moves <- {}, Bugs <- {}, Record <- FALSE, sibDelayed <- {}, recompute <- {}, parked <- {}, down <- FALSE,
    dirtyLoads <- FALSE,
    dirtyDumps <- FALSE,
    nullWrites <- FALSE,
    invalidKV <- {}, staleReads <- FALSE,
    swBlocksOf <- [r \in Reqs |-> SwOf(r)], freedSince <- freedSince, preemptions <- 0,
    inflight <- <<>>, executed <- 0, agg <- [r \in Reqs |-> 0], extraSaves <- {},
    live <- [w \in Ranks |-> {}], releaseErrors <- [w \in Ranks |-> {}],
    workerExtra <- [w \in Ranks |-> {}], sibPending <- [w \in Ranks |-> {}],
    reported <- [w \in Ranks |-> [r \in Reqs |-> 0]],
    tick <- 0, action <- [name |-> "init"],
    \* asynchronous loads (move "async_loads", off here): their variables keep their initial values
    recvDone <- {}, recvFailed <- {}, aggRecv <- [r \in Reqs |-> 0], aggRecvFail <- {}, noHit <- {},
    loadTasks <- [w \in Ranks |-> {}], workerRecv <- [w \in Ranks |-> {}],
    \* the worker keys completions per save job (no bug "count_per_req")
    staleSaves <- [w \in Ranks |-> {}]

(* The class table's labels, evaluated once (constant-level definitions). *)
Track == DD!BCMLabel = "track"               \* build_connector_meta tracks dump requests
DelayIfTracked == DD!RFLabel = "delay_if_tracked"  \* request_finished delays iff tracked

(* DD!request_finished(S, r) with its label evaluated once.                *)
Delays(r) == DelayIfTracked /\ r \in schedAsync

Range(f) == {f[i] : i \in DOMAIN f}
Live == DOMAIN reqState
State(r) == IF r \in Live THEN reqState[r] ELSE "idle"   \* idle: waiting or done
BlocksOf(r) == IF r \in DOMAIN blocksOf THEN blocksOf[r] ELSE <<>>
Held(r) == Range(BlocksOf(r)) \cup SwHeld(SwOf(r))
(* f with the keys in D dropped and g's keys set to g's values.            *)
Update(f, D, g) == [x \in (DOMAIN f \ D) \cup DOMAIN g |-> IF x \in DOMAIN g THEN g[x] ELSE f[x]]

Init ==
    /\ l = 0
    /\ why = ""
    /\ reqState = <<>>
    /\ blocksOf = <<>>
    /\ swOf = <<>>
    /\ freedSince = {}
    /\ finishedIds = {}
    /\ schedAsync = {}
    /\ schedStep = 0
    /\ metas = <<>>
    /\ workerAsync = [w \in Ranks |-> {}]
    /\ pending = [w \in Ranks |-> {}]
    /\ wStep = [w \in Ranks |-> 0]
    /\ wPhase = [w \in Ranks |-> "gf"]
    /\ reports = {}
    /\ reportedTwice = FALSE
    /\ unexpectedReports = {}
    /\ dumpOverwrites = FALSE
    /\ preemptOverWaits = FALSE
    /\ blockingWaits = FALSE
    /\ asyncLookup = {}
    /\ received = {}
    /\ recvDelayed = {}
    /\ wLoads = [w \in Ranks |-> {}]
    /\ recvReports = {}

-----------------------------------------------------------------------------
(* build_connector_meta: vLLM's SchedulerOutput and the connector's slices. *)
(* A new or resumed request's `blocks` are all its blocks, a running one's  *)
(* the added ones.  The forward writes token positions                     *)
(* [computed, computed + scheduled), i.e. these block indexes (from 1).    *)
NewList(x) == IF x.new \/ x.resumed THEN x.blocks ELSE BlocksOf(x.req) \o x.blocks
WriteIdx(x) == IF x.scheduled = 0 THEN {}
               ELSE ((x.computed \div BlockSize) + 1)..(((x.computed + x.scheduled - 1) \div BlockSize) + 1)
(* Sliding-window frees before the step's allocation (vLLM's allocate_slots *)
(* -> remove_skipped_blocks, kv_cache_manager.py ~555): a running request's *)
(* leading blocks whose tokens all left the window, SlidingWindowManager.  *)
(* get_num_skipped_tokens = computed - window + 1, whole blocks.  vLLM     *)
(* counts only processed tokens (computed - in flight), so it frees at most *)
(* these: the model's frees are an upper bound, which only ever lets a     *)
(* block's reuse pass the held-by-another check, never the overwrite check.*)
Skipped(x) == IF IsHybrid /\ x.computed + 1 > Window THEN (x.computed - Window + 1) \div BlockSize ELSE 0
Running(x) == ~x.new /\ ~x.resumed
SwKept(x) == LET q == SwOf(x.req) IN [i \in DOMAIN q |-> IF i <= Skipped(x) THEN 0 ELSE q[i]]
SwDropped(x) == IF Running(x) THEN SwHeld(SwOf(x.req)) \ SwHeld(SwKept(x)) ELSE {}
NewSw(x) == IF Running(x) THEN SwKept(x) \o x.sw ELSE x.sw
(* Both groups' blocks at the written positions are written.               *)
Writes(x) == {NewList(x)[i] : i \in WriteIdx(x) \cap DOMAIN NewList(x)}
             \cup {NewSw(x)[i] : i \in {j \in WriteIdx(x) \cap DOMAIN NewSw(x) : NewSw(x)[j] # 0}}
Sched(e) == {x.req : x \in Range(e.reqs)}
Pre(e) == e.preempted \cap Reqs
SchedX(e, r) == CHOOSE x \in Range(e.reqs) : x.req = r
(* What r holds once this schedule's window frees are done (in any order). *)
HeldAfter(e, r) == IF r \in Sched(e) /\ Running(SchedX(e, r))
                   THEN Range(BlocksOf(r)) \cup SwHeld(SwKept(SchedX(e, r))) ELSE Held(r)
OthersHold(e, x) == UNION {HeldAfter(e, r) : r \in Live \ (Pre(e) \cup {x.req})}
(* Asynchronous loads: a request waiting for remote KV whose receive vLLM  *)
(* got is scheduled again (_update_waiting_for_remote_kv): as new, or as   *)
(* resumed after a preemption.  The load slices of requests this schedule  *)
(* does not run are asynchronous: they go into the blocks vLLM allocated   *)
(* when it parked the request.                                            *)
Promotable(r) == State(r) = "remote" /\ r \in received
AsyncSlices(e) == {d \in e.loads : d.req \notin Sched(e)}
AsyncReqs(e) == {d.req : d \in AsyncSlices(e)}
DumpReqs(m) == {d.req : d \in m.dump}
DumpBlocks(m) == UNION {Range(d.blocks) \cup SwHeld(d.sw) : d \in m.dump}
(* The slices a rank submits: all but those of the requests it skipped    *)
(* because their load failed in the step (the connector's                 *)
(* skip_failed_loads: KV computed over a failed load is never dumped).    *)
KeptReqs(m, skipped) == DumpReqs(m) \ skipped
KeptBlocks(m, skipped) == UNION {Range(d.blocks) \cup SwHeld(d.sw) : d \in {x \in m.dump : x.req \notin skipped}}
(* The blocks this schedule frees (hybrid): finishes since the last one,   *)
(* the preempted requests' blocks, the window frees.                      *)
FreedAt(e) == IF IsHybrid
              THEN freedSince \cup UNION {Held(r) : r \in Pre(e)} \cup UNION {SwDropped(x) : x \in Range(e.reqs)}
              ELSE {}

BuildReason(e) ==
    CASE e.step # schedStep + 1 -> "step: not the scheduler's next step"
      [] e.finished # finishedIds -> "finished: not the requests finished since the last schedule"
      [] \E r \in e.preempted : State(r) # "running"
            -> "preempted: a request that is not running"
      [] \E x \in Range(e.reqs) :
            ~(State(x.req) = IF x.new THEN "idle" ELSE IF x.resumed THEN "preempted" ELSE "running")
            /\ ~((x.new \/ x.resumed) /\ Promotable(x.req))
            -> "reqs: a request scheduled as new, resumed or running in another state"
      [] \E x \in Range(e.reqs) : \E i \in WriteIdx(x) : i \notin DOMAIN NewList(x)
            -> "reqs: tokens scheduled beyond the request's blocks"
      [] \E x \in Range(e.reqs) : Writes(x) \cap OthersHold(e, x) # {}
            -> "reqs: a block written by this step is held by another request"
      [] \E d \in e.dump : d.req \notin Sched(e) \/ ~(Range(d.blocks) \subseteq Range(NewList(SchedX(e, d.req))))
                            \/ ~(SwHeld(d.sw) \subseteq SwHeld(NewSw(SchedX(e, d.req))))
            -> "dump: a slice of a request not scheduled, or of blocks it does not hold"
      [] \E d \in AsyncSlices(e) : State(d.req) # "remote" \/ d.req \in received
                                  \/ ~(Range(d.blocks) \subseteq Held(d.req))
            -> "load: an asynchronous load of a request not waiting for remote KV, or into blocks it does not hold"
      [] OTHER -> ""

build_connector_meta(e) ==
    /\ reqState' = Update(reqState, {}, [r \in Pre(e) \cup Sched(e) |->
                                          IF r \in Pre(e) THEN "preempted" ELSE "running"])
    /\ blocksOf' = Update(blocksOf, Pre(e), [r \in Sched(e) \ Pre(e) |-> NewList(SchedX(e, r))])
    /\ swOf' = IF IsHybrid THEN Update(swOf, Pre(e), [r \in Sched(e) \ Pre(e) |-> NewSw(SchedX(e, r))])
              ELSE swOf
    /\ freedSince' = {}
    /\ finishedIds' = {}
    (* a request loaded asynchronously leaves the dump tracking (its load is *)
    (* its only transfer until the receive: the reference's _async_load_meta) *)
    /\ schedAsync' = (schedAsync \ AsyncReqs(e)) \cup (IF Track THEN DumpReqs(e) ELSE {})
    /\ schedStep' = e.step
    /\ metas' = (e.step :> [preempted |-> e.preempted, finished |-> e.finished, dump |-> e.dump,
                            loading |-> e.loading, recv |-> AsyncSlices(e),
                            writes |-> UNION {Writes(x) : x \in Range(e.reqs)}, freed |-> FreedAt(e)])
                @@ metas
    /\ received' = received \ Sched(e)
    /\ UNCHANGED <<workerAsync, pending, wStep, wPhase, reports, reportedTwice, unexpectedReports,
                   dumpOverwrites, preemptOverWaits, blockingWaits, asyncLookup, recvDelayed, wLoads,
                   recvReports>>

(* request_finished: the delay decision is DeferDump's (through the MRO).  *)
FinishReason(e) ==
    CASE State(e.req) \notin {"idle", "running", "preempted", "remote"}
            -> "req: finished while not waiting, running, preempted or waiting for remote KV"
      [] e.blocks # BlocksOf(e.req) -> "block_ids: not the blocks vLLM holds for the request"
      [] \E i \in DOMAIN e.sw : e.sw[i] # 0 /\ (i \notin DOMAIN SwOf(e.req) \/ SwOf(e.req)[i] \notin {e.sw[i], 0})
            -> "group_block_ids: a sliding-window block vLLM does not hold for the request"
      [] e.delayed # Delays(e.req)
            -> IF e.delayed THEN "delayed: true, but the model does not delay (no dump slice)"
               ELSE "delayed: false, but the model delays the free (the request was given a dump slice)"
      [] OTHER -> ""

(* An abort of a request waiting for remote KV whose receive vLLM has not *)
(* got yet: vLLM delays the free itself until finished_recving            *)
(* (scheduler.py finish_requests ~2700-2707), whatever the connector says. *)
RecvDelay(r) == State(r) = "remote" /\ r \notin received
request_finished(e) ==
    LET held == e.delayed \/ RecvDelay(e.req) IN
    /\ reqState' = IF held THEN Update(reqState, {}, e.req :> "delayed")
                   ELSE Update(reqState, {e.req}, <<>>)
    /\ blocksOf' = IF held THEN blocksOf ELSE Update(blocksOf, {e.req}, <<>>)
    /\ recvDelayed' = IF RecvDelay(e.req) THEN recvDelayed \cup {e.req} ELSE recvDelayed
    /\ received' = received \ {e.req}
    (* vLLM nulls the blocks that left the window before the call; without *)
    (* a delay it frees every other block right after it.                  *)
    /\ swOf' = IF e.delayed /\ e.req \in DOMAIN swOf THEN Update(swOf, {}, e.req :> e.sw)
              ELSE Update(swOf, {e.req}, <<>>)
    /\ freedSince' = IF ~IsHybrid THEN freedSince
                     ELSE IF e.delayed THEN freedSince \cup (SwHeld(SwOf(e.req)) \ SwHeld(e.sw))
                     ELSE freedSince \cup Held(e.req) \cup SwHeld(e.sw)
    /\ schedAsync' = IF DelayIfTracked THEN schedAsync \ {e.req} ELSE schedAsync
    /\ finishedIds' = finishedIds \cup {e.req}
    /\ UNCHANGED <<schedStep, metas, workerAsync, pending, wStep, wPhase, reports, reportedTwice,
                   unexpectedReports, dumpOverwrites, preemptOverWaits, blockingWaits, asyncLookup, wLoads,
                   recvReports>>

(* update_connector_output: the aggregated finished_sending of a step.     *)
Ready == {r \in {p[1] : p \in reports} : \A w \in Ranks : <<r, w>> \in reports}
(* The receive side (KVOutputAggregator counts finished_recving per rank as *)
(* it counts finished_sending): a request reported by every rank reaches   *)
(* the scheduler, which frees it if it was aborted while loading, and else *)
(* marks it received.  A failed load's blocks come as invalid_block_ids    *)
(* (one KV-cache group): vLLM truncates the request at the first failed   *)
(* block, and frees its blocks when that is the first one                 *)
(* (_update_waiting_for_remote_kv; done here, before any later schedule). *)
RecvReady == {r \in {p[1] : p \in recvReports} : \A w \in Ranks : <<r, w>> \in recvReports}
RecvFreed(e) == e.recving \cap recvDelayed
LostAll(e, r) == BlocksOf(r) # <<>> /\ BlocksOf(r)[1] \in e.invalid
UpdateReason(e) ==
    CASE e.sending # Ready -> "finished_sending: not exactly the requests every rank reported"
      [] e.recving # RecvReady -> "finished_recving: not exactly the requests every rank reported"
      [] \E r \in e.recving : r \notin recvDelayed /\ State(r) # "remote"
            -> "finished_recving: a request neither waiting for remote KV nor aborted while loading"
      [] ~(e.invalid \subseteq UNION {Held(r) : r \in e.recving})
            -> "invalid_block_ids: a block of no request whose receive this output reports"
      [] OTHER -> ""

update_connector_output(e) ==
    LET gone == e.sending \cup RecvFreed(e)
        lost == {r \in e.recving \ RecvFreed(e) : LostAll(e, r)}
    IN
    /\ unexpectedReports' = unexpectedReports \cup {r \in e.sending : State(r) # "delayed"}
    /\ reqState' = Update(reqState, gone, <<>>)
    /\ blocksOf' = Update(blocksOf, gone \cup lost, [r \in lost |-> <<>>])
    /\ swOf' = Update(swOf, gone, <<>>)
    /\ freedSince' = IF IsHybrid THEN freedSince \cup UNION {Held(r) : r \in gone} ELSE freedSince
    /\ reports' = {p \in reports : p[1] \notin e.sending}
    /\ recvReports' = {p \in recvReports : p[1] \notin e.recving}
    /\ recvDelayed' = recvDelayed \ e.recving
    /\ received' = received \cup (e.recving \ RecvFreed(e))
    /\ UNCHANGED <<finishedIds, schedAsync, schedStep, metas, workerAsync, pending, wStep, wPhase,
                   reportedTwice, dumpOverwrites, preemptOverWaits, blockingWaits, asyncLookup, wLoads>>

(* get_num_new_matched_tokens: remember whether the answer was load_async. *)
(* vLLM asserts external tokens behind an asynchronous load.              *)
LookupReason(e) ==
    CASE e.async /\ e.matched = 0 -> "load_async: true for a lookup of no external tokens"
      [] OTHER -> ""

get_num_new_matched_tokens(e) ==
    /\ asyncLookup' = IF e.async THEN asyncLookup \cup {e.req} ELSE asyncLookup \ {e.req}
    /\ UNCHANGED <<reqState, blocksOf, swOf, freedSince, finishedIds, schedAsync, schedStep, metas, workerAsync,
                   pending, wStep, wPhase, reports, reportedTwice, unexpectedReports, dumpOverwrites,
                   preemptOverWaits, blockingWaits, received, recvDelayed, wLoads, recvReports>>

(* update_state_after_alloc after an asynchronous answer with external     *)
(* tokens: vLLM parks the request in WAITING_FOR_REMOTE_KVS holding these  *)
(* blocks (scheduler.py ~1320-1340); otherwise the request is scheduled in *)
(* the coming build_connector_meta and nothing happens here.               *)
Parks(e) == e.req \in asyncLookup /\ e.external > 0
AllocReason(e) ==
    CASE ~Parks(e) -> ""
      [] ~(State(e.req) \in {"idle", "preempted"} \/ Promotable(e.req))
            -> "req: parked for remote KV while not waiting or preempted"
      [] Range(e.blocks) \cap UNION {Held(r) : r \in Live \ {e.req}} # {}
            -> "block_ids: a block held by another request"
      [] OTHER -> ""

update_state_after_alloc(e) ==
    /\ reqState' = IF Parks(e) THEN Update(reqState, {}, e.req :> "remote") ELSE reqState
    /\ blocksOf' = IF Parks(e) THEN Update(blocksOf, {}, e.req :> e.blocks) ELSE blocksOf
    /\ received' = IF Parks(e) THEN received \ {e.req} ELSE received
    /\ UNCHANGED <<swOf, freedSince, finishedIds, schedAsync, schedStep, metas, workerAsync,
                   pending, wStep, wPhase, reports, reportedTwice, unexpectedReports, dumpOverwrites,
                   preemptOverWaits, blockingWaits, asyncLookup, recvDelayed, wLoads, recvReports>>

-----------------------------------------------------------------------------
(* Worker rank w runs step s: [handle_preemptions] wait_for_save           *)
(* get_finished, in vLLM's runner order.                                   *)
Ids(S) == {t.id : t \in S}
Overlaps(t, R) == t.reqs \cap R # {}
Waited(w, R) == {t \in pending[w] : Overlaps(t, R)}
StartsStep(e) == e.step = wStep[e.rank] + 1 /\ wPhase[e.rank] = "gf"
Meta(e) == metas[e.step]
(* The requests rank w loads asynchronously and has not reported.  Their  *)
(* loads end unseen (the store's threads); a report means the load ended  *)
(* and its blocks were written.                                           *)
LoadReqs(w) == {x.req : x \in wLoads[w]}

PreemptReason(e) ==
    CASE ~StartsStep(e) \/ e.step \notin DOMAIN metas -> "step: not the rank's next scheduled step"
      [] e.preempted # Meta(e).preempted -> "preempted: not the step's preempted_req_ids"
      [] ~(e.waited \subseteq Ids(pending[e.rank])) -> "waited: a task that is not pending"
      [] ~(Ids(Waited(e.rank, e.preempted)) \subseteq e.waited)
            -> "waited: a pending task of a preempted request left running into the forward"
      [] OTHER -> ""

handle_preemptions(e) ==
    LET w == e.rank IN
    (* An over-wait: a task of no preempted request that reads no block freed *)
    (* since the last schedule (DeferDump's handle_preemptions; the freed    *)
    (* set is empty with one group).                                         *)
    /\ preemptOverWaits' = (preemptOverWaits \/
                            \E t \in pending[w] : t.id \in e.waited /\ ~Overlaps(t, e.preempted)
                                                  /\ t.blocks \cap Meta(e).freed = {})
    /\ pending' = [pending EXCEPT ![w] = {t \in @ : t.id \notin e.waited}]
    /\ wStep' = [wStep EXCEPT ![w] = e.step]
    /\ wPhase' = [wPhase EXCEPT ![w] = "hp"]
    /\ UNCHANGED <<reqState, blocksOf, swOf, freedSince, finishedIds, schedAsync, schedStep, metas, workerAsync,
                   reports, reportedTwice, unexpectedReports, dumpOverwrites, blockingWaits, recvVars>>

InStep(e) == StartsStep(e) \/ (e.step = wStep[e.rank] /\ wPhase[e.rank] = "hp")
Submitted(e) == {[id |-> s.id, reqs |-> s.reqs, blocks |-> Range(s.blocks), status |-> "running"]
                   : s \in e.submitted}
SaveReason(e) ==
    CASE ~InStep(e) \/ e.step \notin DOMAIN metas -> "step: not the rank's next scheduled step"
      [] ~(e.reaped \subseteq {t.id : t \in {u \in pending[e.rank] : u.status = "done"}} \cup Ids(Submitted(e)))
            -> "reaped: a task that is not pending and complete"
      [] Meta(e).dump = {} /\ e.submitted # {} -> "submitted: a task in a step without dump slices"
      [] ~(e.skipped \subseteq Meta(e).loading)
            -> "skipped_failed_loads: a request with no load slice in the step"
      [] Meta(e).dump # {} /\ ~e.error /\ DD!Dumps(e.rank) /\
         (UNION {s.reqs : s \in e.submitted} # KeptReqs(Meta(e), e.skipped)
          \/ UNION {Range(s.blocks) : s \in e.submitted} # KeptBlocks(Meta(e), e.skipped))
            -> "submitted: not the requests and blocks of the step's dump slices"
      [] OTHER -> ""

(* The forward (before wait_for_save) writes the step's blocks; then the   *)
(* reap of complete tasks, the tracking and the submit.  A layer-wise      *)
(* connector submits in save_kv_layer, during the forward, so its poll may *)
(* reap a task submitted in this very step (the store finished it).        *)
wait_for_save(e) ==
    LET w == e.rank IN
    /\ dumpOverwrites' = (dumpOverwrites \/
                          \E t \in pending[w] : t.status = "running" /\ t.blocks \cap Meta(e).writes # {})
    /\ pending' = [pending EXCEPT ![w] = {t \in @ \cup Submitted(e) : t.id \notin e.reaped}]
    /\ workerAsync' = [workerAsync EXCEPT ![w] = @ \cup DumpReqs(Meta(e))]
    /\ wStep' = [wStep EXCEPT ![w] = e.step]
    /\ wPhase' = [wPhase EXCEPT ![w] = "wfs"]
    /\ UNCHANGED <<reqState, blocksOf, swOf, freedSince, finishedIds, schedAsync, schedStep, metas, reports, reportedTwice,
                   unexpectedReports, preemptOverWaits, blockingWaits, recvVars>>

(* get_finished reports exactly finished ∩ tracked, after waiting every    *)
(* pending task that overlaps them.                                        *)
FinishedReason(e) ==
    CASE ~(e.step = wStep[e.rank] /\ wPhase[e.rank] = "wfs") -> "step: get_finished without wait_for_save"
      [] e.finished # Meta(e).finished -> "finished_req_ids: not the step's finished_req_ids"
      [] e.reported # e.finished \cap workerAsync[e.rank]
            -> "reported: not the finished requests this rank tracks"
      [] e.waited # Ids(Waited(e.rank, e.reported))
            -> "waited: not the pending tasks of the reported requests"
      [] ~(e.recving \subseteq LoadReqs(e.rank))
            -> "reported_recving: a request this rank has no asynchronous load of"
      [] e.hasReceiving /\ e.receiving # LoadReqs(e.rank) \ e.recving
            -> "receiving: a load dropped without its finished_recving (vLLM never frees the request's blocks)"
      [] OTHER -> ""

get_finished(e) ==
    LET w == e.rank
        doneSteps == {s \in DOMAIN metas : \A v \in Ranks :
                        wStep'[v] > s \/ (wStep'[v] = s /\ wPhase'[v] = "gf")}
    IN
    /\ pending' = [pending EXCEPT ![w] = {t \in @ : t.id \notin e.waited}]
    /\ workerAsync' = [workerAsync EXCEPT ![w] = @ \ e.reported]
    /\ reports' = reports \cup {<<r, w>> : r \in e.reported}
    /\ reportedTwice' = (reportedTwice \/ \E r \in e.reported : <<r, w>> \in reports)
    /\ wPhase' = [wPhase EXCEPT ![w] = "gf"]
    /\ UNCHANGED wStep
    /\ metas' = [s \in DOMAIN metas \ doneSteps |-> metas[s]]
    /\ wLoads' = [wLoads EXCEPT ![w] = {x \in @ : x.req \notin e.recving}]
    /\ recvReports' = recvReports \cup {<<r, w>> : r \in e.recving}
    /\ UNCHANGED <<reqState, blocksOf, swOf, freedSince, finishedIds, schedAsync, schedStep, unexpectedReports,
                   dumpOverwrites, preemptOverWaits, blockingWaits, asyncLookup, received, recvDelayed>>

(* start_load_kv (asynchronous loads): the rank submits exactly the step's *)
(* asynchronous load slices, between handle_preemptions and wait_for_save *)
(* (after the forward when the step has no synchronous load,              *)
(* kv_connector_model_runner_mixin.py ~79-90).                            *)
StartReason(e) ==
    CASE ~InStep(e) \/ e.step \notin DOMAIN metas -> "step: not the rank's next scheduled step"
      [] e.loads # Meta(e).recv -> "loads: not the step's asynchronous load slices"
      [] OTHER -> ""

start_load_kv(e) ==
    /\ wLoads' = [wLoads EXCEPT ![e.rank] = @ \cup e.loads]
    /\ wStep' = [wStep EXCEPT ![e.rank] = e.step]
    /\ wPhase' = [wPhase EXCEPT ![e.rank] = "hp"]
    /\ UNCHANGED <<reqState, blocksOf, swOf, freedSince, finishedIds, schedAsync, schedStep, metas, workerAsync,
                   pending, reports, reportedTwice, unexpectedReports, dumpOverwrites, preemptOverWaits,
                   blockingWaits, asyncLookup, received, recvDelayed, recvReports>>

(* The variables of the logged state (all but the log position).          *)
Quiet == <<reqState, blocksOf, swOf, freedSince, finishedIds, schedAsync, schedStep, metas, workerAsync,
           pending, wStep, wPhase, reports, reportedTwice, unexpectedReports, dumpOverwrites,
           preemptOverWaits, blockingWaits, recvVars>>

(* get_block_ids_with_load_errors: read right after get_finished.  Its     *)
(* blocks reach the scheduler as invalid_block_ids, checked there.        *)
LoadErrorsReason(e) ==
    CASE ~(e.step = wStep[e.rank] /\ wPhase[e.rank] = "gf") -> "step: not right after the rank's get_finished"
      [] OTHER -> ""

ShutdownReason(e) ==
    CASE e.role = "worker" /\ e.waited # Ids(pending[e.rank]) -> "waited: not every pending task"
      [] OTHER -> ""

(* A worker's shutdown drains its dump tasks and stops its loads (nothing *)
(* writes a block after it).                                              *)
shutdown(e) ==
    /\ pending' = IF e.role = "worker" THEN [pending EXCEPT ![e.rank] = {}] ELSE pending
    /\ wLoads' = IF e.role = "worker" THEN [wLoads EXCEPT ![e.rank] = {}] ELSE wLoads
    /\ UNCHANGED <<reqState, blocksOf, swOf, freedSince, finishedIds, schedAsync, schedStep, metas, workerAsync, wStep,
                   wPhase, reports, reportedTwice, unexpectedReports, dumpOverwrites, preemptOverWaits,
                   blockingWaits, asyncLookup, received, recvDelayed, recvReports>>

-----------------------------------------------------------------------------
Reason(e) ==
    CASE e.event = "build_connector_meta" -> BuildReason(e)
      [] e.event = "request_finished" -> FinishReason(e)
      [] e.event = "update_connector_output" -> UpdateReason(e)
      [] e.event = "handle_preemptions" -> PreemptReason(e)
      [] e.event = "wait_for_save" -> SaveReason(e)
      [] e.event = "get_finished" -> FinishedReason(e)
      [] e.event = "shutdown" -> ShutdownReason(e)
      [] e.event = "get_num_new_matched_tokens" -> LookupReason(e)
      [] e.event = "update_state_after_alloc" -> AllocReason(e)
      [] e.event = "start_load_kv" -> StartReason(e)
      [] e.event = "get_block_ids_with_load_errors" -> LoadErrorsReason(e)

Apply(e) ==
    CASE e.event = "build_connector_meta" -> build_connector_meta(e)
      [] e.event = "request_finished" -> request_finished(e)
      [] e.event = "update_connector_output" -> update_connector_output(e)
      [] e.event = "handle_preemptions" -> handle_preemptions(e)
      [] e.event = "wait_for_save" -> wait_for_save(e)
      [] e.event = "get_finished" -> get_finished(e)
      [] e.event = "shutdown" -> shutdown(e)
      [] e.event = "get_num_new_matched_tokens" -> get_num_new_matched_tokens(e)
      [] e.event = "update_state_after_alloc" -> update_state_after_alloc(e)
      [] e.event = "start_load_kv" -> start_load_kv(e)
      [] e.event = "get_block_ids_with_load_errors" -> UNCHANGED Quiet

Next1 == Log[l + 1]

(* The hidden store action: a dump task completes, only one the next       *)
(* logged event reaps (the bound that keeps the search linear), and those *)
(* in task-id order: the order in which tasks complete between two events *)
(* is invisible to every check (a completion only clears the hazards the  *)
(* next event looks at, all of them done by then), so one order stands for *)
(* all k! and the search visits k + 1 states for k completions, not 2^k.  *)
NeedsDone(t, w) == Next1.event = "wait_for_save" /\ Next1.rank = w /\ t.id \in Next1.reaped
NeedsRun(w) == {t \in pending[w] : t.status = "running" /\ NeedsDone(t, w)}
task_complete ==
    /\ why = "" /\ l < Len(Log)
    /\ \E w \in Ranks : \E t \in NeedsRun(w) :
         /\ \A u \in NeedsRun(w) : t.id <= u.id
         /\ pending' = [pending EXCEPT ![w] = (@ \ {t}) \cup {[t EXCEPT !.status = "done"]}]
    /\ UNCHANGED <<l, why, reqState, blocksOf, swOf, freedSince, finishedIds, schedAsync, schedStep, metas, workerAsync,
                   wStep, wPhase, reports, reportedTwice, unexpectedReports, dumpOverwrites,
                   preemptOverWaits, blockingWaits, recvVars>>

Hidden == \E w \in Ranks : NeedsRun(w) # {}

(* The next logged event: taken when the model reproduces its fields;     *)
(* otherwise `why` records the first field no behaviour reproduces (and    *)
(* the search stops at TraceAcceptedInv).  One action, so that the checks  *)
(* are evaluated once per state.                                           *)
Logged ==
    /\ why = "" /\ l < Len(Log)
    /\ ~Hidden
    /\ LET reason == Reason(Next1) IN
       IF reason = ""
       THEN Apply(Next1) /\ l' = l + 1 /\ UNCHANGED why
       ELSE /\ why' = reason
            /\ UNCHANGED <<l, reqState, blocksOf, swOf, freedSince, finishedIds, schedAsync, schedStep, metas, workerAsync,
                           pending, wStep, wPhase, reports, reportedTwice, unexpectedReports, dumpOverwrites,
                           preemptOverWaits, blockingWaits, recvVars>>

Next == Logged \/ task_complete

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
TraceTypeInv ==
    /\ l \in 0..Len(Log)
    /\ DOMAIN reqState \subseteq Reqs /\ \A r \in DOMAIN reqState : reqState[r] \in DD!ReqStates
    /\ DOMAIN blocksOf \subseteq Live /\ \A r \in DOMAIN blocksOf : Range(blocksOf[r]) \subseteq Blocks
    /\ DOMAIN swOf \subseteq Live /\ \A r \in DOMAIN swOf : SwHeld(swOf[r]) \subseteq Blocks
    /\ (~IsHybrid => swOf = <<>>) /\ freedSince \subseteq Blocks /\ (~IsHybrid => freedSince = {})
    /\ finishedIds \subseteq Reqs /\ schedAsync \subseteq Reqs
    /\ workerAsync \in [Ranks -> SUBSET Reqs]
    /\ \A w \in Ranks : \A t \in pending[w] :
         t.reqs \subseteq Reqs /\ t.blocks \subseteq Blocks /\ t.status \in {"running", "done"}
    /\ reports \subseteq Reqs \X Ranks
    /\ reportedTwice \in BOOLEAN
    /\ wStep \in [Ranks -> Nat] /\ wPhase \in [Ranks -> {"hp", "wfs", "gf"}]
    /\ schedStep \in Nat /\ DOMAIN metas \subseteq 1..schedStep
    /\ asyncLookup \subseteq Reqs /\ received \subseteq Reqs /\ recvDelayed \subseteq Reqs
    /\ \A w \in Ranks : \A x \in wLoads[w] : x.req \in Reqs /\ Range(x.blocks) \subseteq Blocks
    /\ recvReports \subseteq Reqs \X Ranks

(* DeferDump's safety invariants, evaluated by the model on this state.    *)
NoOverwriteWhileDumpingInv == DD!NoOverwriteWhileDumpingInv
NoUnexpectedReportInv == DD!NoUnexpectedReportInv
PreemptWaitsOnlyPreemptedInv == DD!PreemptWaitsOnlyPreemptedInv
NoWaitInWaitForSaveInv == DD!NoWaitInWaitForSaveInv

(* No block is written by an asynchronous load after vLLM freed it or     *)
(* handed it to another request: while a rank's load of r runs (submitted, *)
(* not reported), r waits for remote KV or for its delayed free and holds  *)
(* the load's blocks (DeferDump's NoLoadIntoFreedBlockInv at the log's     *)
(* grain: a load runs until its rank reports it).                          *)
TraceNoLoadIntoFreedBlockInv ==
    \A w \in Ranks : \A x \in wLoads[w] :
        State(x.req) \in {"remote", "delayed"} /\ Range(x.blocks) \subseteq Held(x.req)

(* Each rank reports a request at most once.                               *)
TraceReportOnceInv == ~reportedTwice

(* The next event matched (or the log is over).                            *)
TraceAcceptedInv == why = ""

(* VIOLATED = the witness that the whole log matched (listed last).        *)
TraceNotDoneInv == l < Len(Log)
=============================================================================
