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
(* _update_from_kv_xfer_finished) -- plus the store's `task_complete`.     *)
(* The connector methods are operators named as the methods; every         *)
(* connector call dispatches through Connectors!Effective (the MRO).       *)
(* The history variable `action` records each step and its calls.          *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets, TLC, Connectors

CONSTANTS
    Req,            \* requests (model values; symmetric)
    Block,          \* KV-cache blocks of the pool (model values; symmetric)
    Rank,           \* worker ranks (model values)
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
    Faults,         \* SUBSET {"submit", "wait", "check"}: store faults on
    Lockstep        \* ranks see the same store events (README "Abstractions")

ASSUME TableOK
ASSUME InnerClass \in Classes /\ (Wrapper => "UCMConnector" \in Classes)
ASSUME Faults \subseteq {"submit", "wait", "check"}
ASSUME Lockstep \in BOOLEAN
ASSUME Rank0 \in Rank /\ PromptBlocks \in Nat \ {0} /\ Layers \in Nat \ {0}

NumRanks == Cardinality(Rank)

VARIABLES
    \* ---- vLLM scheduler -------------------------------------------------
    reqState,     \* [Req -> ReqStates]: waiting, running, preempted,
                  \*   delayed (finished, blocks held for a delayed free), done (freed)
    blocksOf,     \* [Req -> Seq(Block)]: blocks held; i-th = prompt block i
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
    \* ---- history -------------------------------------------------------
    unexpectedReports, \* requests the scheduler got finished_sending for while
                  \*   not delayed (vLLM: `assert req_id in self.requests` fails)
    blockingWaits,\* has some wait_for_save waited a still-running task?
    preemptOverWaits, \* has some handle_preemptions waited a task holding no
                  \*   preempted request?
    action        \* the step just taken: [name |-> method/event, params...]

schedVars  == <<reqState, blocksOf, finishedIds, preemptions, inflight, executed, agg,
                schedAsync, extraSaves>>
workerVars == <<workerAsync, pending, live, releaseErrors, workerExtra, sibPending,
                reported>>
historyVars == <<unexpectedReports, blockingWaits, preemptOverWaits>>
vars == <<schedVars, workerVars, historyVars, action>>

(* The fingerprint view of the safety models: everything but `action`      *)
(* (the invariants never read `action`, so merging states that differ     *)
(* only in how they were reached loses nothing).                           *)
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
WaitLabel == Eff("_wait_pending_dump_task")

-----------------------------------------------------------------------------
(* Value domains.                                                          *)

ReqStates == {"waiting", "running", "preempted", "delayed", "done"}
MaxTasks  == Cardinality(Req) * PromptBlocks * (MaxPreempt + 1) * Layers + 1
TaskIds   == 1..MaxTasks
TaskStatus == {"running", "done", "failed"}
IsTask(t) ==
    /\ DOMAIN t = {"id", "reqs", "blocks", "clobbered", "layer", "status", "event"}
    /\ t.id \in TaskIds /\ t.event \in TaskIds
    /\ t.reqs \subseteq Req /\ t.reqs # {}
    /\ t.blocks \subseteq Block /\ t.blocks # {}
    /\ t.clobbered \in BOOLEAN
    /\ t.layer \in 0..Layers
    /\ t.status \in TaskStatus

Held    == UNION {Range(blocksOf[r]) : r \in Req}
FreeBlk == Block \ Held
Dumps(w) == ~MLA \/ w = Rank0     \* does this rank submit dumps?

-----------------------------------------------------------------------------
Init ==
    /\ reqState = [r \in Req |-> "waiting"]
    /\ blocksOf = [r \in Req |-> <<>>]
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
    /\ action = [name |-> "init"]

-----------------------------------------------------------------------------
(***************************************************************************)
(* Scheduler.                                                              *)
(***************************************************************************)

(* UCMDirectConnector.build_connector_meta: one dump slice per request     *)
(* whose scheduled chunk completed a prompt block (lookups miss, so every  *)
(* prompt block is dumped, again after a resume); "track" adds those       *)
(* requests to _async_dump_req_ids (_track_async_dump_requests).           *)
build_connector_meta(alloc, preempted) ==
    LET dump == IF BCMLabel = "base" THEN {}
                ELSE {[req |-> a.req, block |-> a.block] : a \in alloc}
        newly == IF BCMLabel = "track" THEN {d.req : d \in dump} ELSE {}
    IN  [meta |-> [writes    |-> alloc,
                   dump      |-> dump,
                   preempted |-> IF BCMLabel = "base" THEN {} ELSE preempted,
                   finished  |-> finishedIds,
                   sibNow    |-> FALSE,
                   extra     |-> extraSaves,
                   sending   |-> [w \in Rank |-> {}]],
         tracked |-> newly]

(* Scheduler.schedule: each request in `adv` is given a one-block chunk    *)
(* (admission for waiting/preempted ones, the next prefill chunk for       *)
(* running ones); running requests with a complete prompt decode (never    *)
(* dumped).  If the free blocks do not suffice, one running victim is      *)
(* preempted: its blocks are freed at once, request_finished is NOT called *)
(* and nothing waiting is admitted in that step.                           *)
schedule ==
    /\ Len(inflight) < MaxInflight
    /\ \E r \in Req : reqState[r] \notin {"done"}
    /\ LET running == {r \in Req : reqState[r] = "running"}
           admit   == {r \in Req : reqState[r] \in {"waiting", "preempted"}}
           prefill == {r \in running : Len(blocksOf[r]) < PromptBlocks}
       IN  \E adv \in SUBSET (admit \cup prefill),
              victim \in {<<>>} \cup {<<v>> : v \in running} :
             LET preempt == Range(victim)
                 free    == FreeBlk \cup UNION {Range(blocksOf[v]) : v \in preempt}
             IN  /\ (preempt # {}) =>
                        /\ preemptions < MaxPreempt
                        /\ Cardinality(FreeBlk) < Cardinality(adv)
                        /\ adv \cap admit = {}
                        /\ preempt \cap adv = {}
                 /\ Cardinality(adv) <= Cardinality(free)
                 /\ \E pick \in [adv -> free] :
                      /\ \A x, y \in adv : x # y => pick[x] # pick[y]
                      /\ LET alloc == {[req |-> r, idx |-> IF r \in admit THEN 1
                                                         ELSE Len(blocksOf[r]) + 1,
                                        block |-> pick[r]] : r \in adv}
                             bcm == build_connector_meta(alloc, preempt)
                         IN  /\ reqState' = [r \in Req |->
                                   IF r \in preempt THEN "preempted"
                                   ELSE IF r \in adv THEN "running" ELSE reqState[r]]
                             /\ blocksOf' = [r \in Req |->
                                   IF r \in preempt THEN <<>>
                                   ELSE IF r \in adv THEN
                                        (IF r \in admit THEN <<>> ELSE blocksOf[r]) \o <<pick[r]>>
                                   ELSE blocksOf[r]]
                             /\ preemptions' = preemptions + Cardinality(preempt)
                             /\ inflight' = Append(inflight, bcm.meta)
                             /\ schedAsync' = schedAsync \cup bcm.tracked
                             /\ finishedIds' = {}
                             /\ extraSaves' = {}
                             /\ action' = [name |-> "schedule",
                                           allocated |-> alloc,
                                           preempted |-> preempt,
                                           calls |-> << [name |-> "build_connector_meta",
                                                         dump |-> bcm.meta.dump,
                                                         tracked |-> bcm.tracked,
                                                         preempted_req_ids |-> bcm.meta.preempted,
                                                         finished_req_ids |-> bcm.meta.finished,
                                                         extra_async_saves |-> bcm.meta.extra] >>]
    /\ UNCHANGED <<executed, agg, workerVars, historyVars>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Worker ranks.  A rank's connector state is a record                     *)
(*   [async, pending, live, relErr, extra, sib, blocked, overWait]         *)
(* threaded through the connector calls of one step in vLLM's runner       *)
(* order: handle_preemptions -> forward (writes) -> save_kv_layer ->       *)
(* wait_for_save -> get_finished.  Each call returns [s |-> new state,     *)
(* call |-> its record for `action`].                                      *)
(***************************************************************************)

Local(w) == [async |-> workerAsync[w], pending |-> pending[w], live |-> live[w],
             relErr |-> releaseErrors[w], extra |-> workerExtra[w],
             sib |-> sibPending[w], blocked |-> FALSE, overWait |-> FALSE]

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
                    clobbered |-> FALSE, layer |-> layer,
                    status |-> "running", event |-> id]
         IN  [s |-> [s EXCEPT !.pending = @ \cup {t}, !.live = @ \cup {id}], id |-> id]

handle_preemptions(w, m, s) ==
    LET T == IF m.preempted = {} THEN {}
             ELSE CASE HPLabel = "wait_preempted" ->
                          {t \in s.pending : t.reqs \cap m.preempted # {}}
                    [] HPLabel = "wait_all" -> s.pending
                    [] OTHER -> {}
        over == \E t \in T : t.reqs \cap m.preempted = {}
    IN  [s |-> [WaitTasks(s, T) EXCEPT !.overWait = @ \/ over],
         call |-> [name |-> "handle_preemptions", preempted_req_ids |-> m.preempted,
                   waited |-> WaitRecords(T)]]

(* The model's forward: each newly allocated block is written with its     *)
(* request's prompt block (by the attention layers, or by a load on a      *)
(* resume).  A still-running dump task reading such a block is clobbered:  *)
(* the block was freed and is being rewritten under it.                    *)
forward(w, m, s) ==
    LET wb == {a.block : a \in m.writes}
        hit(t) == t.status = "running" /\ t.blocks \cap wb # {}
        new == {IF hit(t) THEN [t EXCEPT !.clobbered = TRUE] ELSE t : t \in s.pending}
    IN  [s |-> [s EXCEPT !.pending = new],
         call |-> [name |-> "forward", writes |-> {<<a.block, a.req, a.idx>> : a \in m.writes}]]

DumpReqs(m)   == {d.req : d \in m.dump}
DumpBlocks(m) == {d.block : d \in m.dump}

(* UCMLayerWiseConnector.save_kv_layer, once per layer: one task per layer *)
(* (layer l fails to submit iff l \in failed).                             *)
RECURSIVE SubmitLayers(_, _, _, _, _)
SubmitLayers(s, m, l, failed, recs) ==
    IF l > Layers THEN [s |-> s, calls |-> recs]
    ELSE LET r == Submit(s, DumpReqs(m), DumpBlocks(m), l, l \in failed)
         IN  SubmitLayers(r.s, m, l + 1, failed,
                          Append(recs, [name |-> "save_kv_layer", layer |-> l,
                                        submitted |-> r.id, submit_error |-> l \in failed]))

LayerSubmits(w, m) == SKLLabel = "submit_layer" /\ DumpReqs(m) # {} /\ Dumps(w)

save_kv_layer(w, m, s, failed) ==
    IF LayerSubmits(w, m) THEN SubmitLayers(s, m, 1, failed, <<>>)
    ELSE [s |-> s, calls |-> <<>>]

(* Does wait_for_save submit a task on this rank in this step?             *)
StepSubmits(w, m) ==
    /\ WFSLabel \in {"poll_track_submit", "blocking", "track_after_mla_return"}
    /\ DumpReqs(m) # {} /\ Dumps(w)

DoneTasks(s) == {t \in s.pending : t.status # "running"}

(* wait_for_save: poll-and-reap completed tasks (check raising keeps them),*)
(* record the step's dump requests in the worker set (before the MLA early *)
(* return, except in the "track_after_mla_return" mutant), then (Direct)   *)
(* submit one task for the step without waiting ("blocking": pre-PR, wait  *)
(* it at once).                                                            *)
wait_for_save(w, m, s, checkErr, submitFails) ==
    IF WFSLabel = "base" THEN
        [s |-> s, call |-> [name |-> "wait_for_save", reaped |-> {}, check_error |-> FALSE,
                            tracked |-> {}, submitted |-> 0, submit_error |-> FALSE,
                            blocked |-> {}]]
    ELSE
    LET chk  == checkErr /\ DoneTasks(s) # {}
        reap == IF chk THEN {} ELSE DoneTasks(s)
        s1 == WaitTasks(s, reap)
        trk == IF WFSLabel = "track_after_mla_return" /\ ~Dumps(w) THEN {} ELSE DumpReqs(m)
        s2 == [s1 EXCEPT !.async = @ \cup trk]
        sub == IF StepSubmits(w, m) THEN Submit(s2, DumpReqs(m), DumpBlocks(m), 0, submitFails)
               ELSE [s |-> s2, id |-> 0]
        blk == IF WFSLabel = "blocking" /\ sub.id # 0
               THEN {t \in sub.s.pending : t.id = sub.id} ELSE {}
        s3 == [WaitTasks(sub.s, blk) EXCEPT !.blocked = @ \/ blk # {}]
    IN  [s |-> s3,
         call |-> [name |-> "wait_for_save", reaped |-> WaitRecords(reap),
                   check_error |-> chk, tracked |-> trk, submitted |-> sub.id,
                   submit_error |-> StepSubmits(w, m) /\ submitFails,
                   blocked |-> {t.id : t \in blk}]]

(* get_finished(finished_req_ids): wait every pending task overlapping a   *)
(* finished tracked request, report those requests (finished_sending).     *)
(* Under MultiConnector the second child reports its ids now or later, and *)
(* an id is emitted only by the last saving child (extra_async_saves).     *)
get_finished(w, m, s, sibNow) ==
    LET af   == IF GFLabel \in {"wait_finished", "report_before_wait"}
                THEN m.finished \cap s.async ELSE {}
        T    == IF GFLabel = "wait_finished" /\ af # {}
                THEN {t \in s.pending : t.reqs \cap af # {}} ELSE {}
        s1   == WaitTasks(s, T)
        ucm  == af
        sibAll == IF Multi THEN s.sib \cup m.finished ELSE {}
        sib  == IF sibNow THEN sibAll ELSE {}
        ex0  == s.extra \cup m.extra
        emitU == ucm \ ex0
        ex1  == ex0 \ ucm
        emitS == sib \ ex1
        ex2  == ex1 \ sib
        out  == emitU \cup emitS
    IN  [s |-> [s1 EXCEPT !.async = @ \ af, !.extra = ex2, !.sib = sibAll \ sib],
         out |-> out,
         call |-> [name |-> "get_finished", finished_req_ids |-> m.finished,
                   waited |-> WaitRecords(T), ucm_sending |-> ucm,
                   sibling_sending |-> sib, finished_sending |-> out]]

(* The nondeterministic choices of one rank's step, offered only where     *)
(* they are observable: which submits fail, whether check raises in the    *)
(* poll, whether the second child reports now.                             *)
ChoiceSets(w, m) ==
    LET s0 == Local(w)
        hp == handle_preemptions(w, m, s0)
        subF == IF "submit" \in Faults /\ StepSubmits(w, m) THEN BOOLEAN ELSE {FALSE}
        layF == IF "submit" \in Faults /\ LayerSubmits(w, m) THEN SUBSET (1..Layers) ELSE {{}}
        chkF == IF "check" \in Faults /\ WFSLabel # "base" /\ DoneTasks(hp.s) # {}
                THEN BOOLEAN ELSE {FALSE}
    IN  [submit |-> subF, layers |-> layF, check |-> chkF]
Choices(w, m) ==
    LET cs == ChoiceSets(w, m) IN [submit: cs.submit, layers: cs.layers, check: cs.check]

RankStep(w, m, c) ==
    LET hp  == handle_preemptions(w, m, Local(w))
        fw  == forward(w, m, hp.s)
        skl == save_kv_layer(w, m, fw.s, c.layers)
        wfs == wait_for_save(w, m, skl.s, c.check, c.submit)
        gf  == get_finished(w, m, wfs.s, m.sibNow)
    IN  [s |-> gf.s, out |-> gf.out,
         calls |-> <<hp.call, fw.call>> \o skl.calls \o <<wfs.call, gf.call>>]

(* Lockstep: one choice for all ranks, offered where some rank observes it.*)
GlobalChoices(m) ==
    LET cs == [w \in Rank |-> ChoiceSets(w, m)]
    IN  [submit: UNION {cs[w].submit : w \in Rank},
         layers: UNION {cs[w].layers : w \in Rank},
         check:  UNION {cs[w].check : w \in Rank}]

(* A rank's possible step results (each computed once, TLCEval-forced).   *)
RankResults(w, m) == {TLCEval(RankStep(w, m, c)) : c \in Choices(w, m)}

(* Every combination of the ranks' results, as functions on ranks.         *)
RECURSIVE ResultFuns(_, _)
ResultFuns(m, S) ==
    IF S = {} THEN {<<>>}
    ELSE LET w == CHOOSE x \in S : TRUE
         IN  {(w :> x) @@ f : x \in RankResults(w, m), f \in ResultFuns(m, S \ {w})}

(* GPUModelRunner.execute_model on every rank for the oldest unexecuted    *)
(* SchedulerOutput (ranks share nothing within a step, so running them     *)
(* together loses no behaviour; README "Abstractions").                    *)
execute_model ==
    /\ executed < Len(inflight)
    /\ LET m == inflight[executed + 1]
       IN  \E sibNow \in IF Multi THEN BOOLEAN ELSE {FALSE} :
           \E post \in IF Lockstep
                        THEN {[w \in Rank |-> TLCEval(RankStep(w, [m EXCEPT !.sibNow = sibNow], c))]
                              : c \in GlobalChoices(m)}
                        ELSE ResultFuns([m EXCEPT !.sibNow = sibNow], Rank) :
                /\ workerAsync' = [w \in Rank |-> post[w].s.async]
                 /\ pending' = [w \in Rank |-> post[w].s.pending]
                 /\ live' = [w \in Rank |-> post[w].s.live]
                 /\ releaseErrors' = [w \in Rank |-> post[w].s.relErr]
                 /\ blockingWaits' = (blockingWaits \/ \E w \in Rank : post[w].s.blocked)
                 /\ preemptOverWaits' = (preemptOverWaits \/ \E w \in Rank : post[w].s.overWait)
                 /\ workerExtra' = [w \in Rank |-> post[w].s.extra]
                 /\ sibPending' = [w \in Rank |-> post[w].s.sib]
                 /\ reported' = [w \in Rank |-> [r \in Req |->
                                   IF r \in post[w].out THEN IF reported[w][r] >= 2 THEN 2
                                                             ELSE reported[w][r] + 1
                                   ELSE reported[w][r]]]
                 /\ inflight' = [inflight EXCEPT ![executed + 1].sending =
                                   [w \in Rank |-> post[w].out]]
                 /\ executed' = executed + 1
                 /\ action' = [name |-> "execute_model",
                               ranks |-> [w \in Rank |-> post[w].calls]]
    /\ UNCHANGED <<reqState, blocksOf, finishedIds, preemptions, agg, schedAsync, extraSaves,
                   unexpectedReports>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Scheduler: processing a step's output.                                  *)
(***************************************************************************)

(* UCMDirectConnector.request_finished: delay iff tracked (and untrack).   *)
(* Returns UCM's answer; under MultiConnector the second child always      *)
(* delays, so async_saves = 1 + UCM's answer.                             *)
request_finished(r) == RFLabel = "delay_if_tracked" /\ r \in schedAsync

(* Scheduler.update_from_output for the oldest executed step: requests     *)
(* that stop or are aborted call request_finished (through the dispatch)   *)
(* and join finished_req_ids, then _update_from_kv_xfer_finished frees the *)
(* delayed requests every rank has now reported.  A report for a request   *)
(* that is not delayed is the engine's `assert req_id in self.requests`.   *)
update_from_output ==
    /\ executed >= 1
    /\ LET step == Head(inflight)
       IN  \E fin \in SUBSET {r \in Req : reqState[r] \in {"running", "preempted"}} :
             LET ucmDelays == {r \in fin : request_finished(r)}
                 delays    == IF Multi THEN fin ELSE ucmDelays
                 st1 == [r \in Req |-> IF r \in fin
                                       THEN IF r \in delays THEN "delayed" ELSE "done"
                                       ELSE reqState[r]]
                 counts == [r \in Req |-> agg[r] + Cardinality({w \in Rank : r \in step.sending[w]})]
                 emitted == {r \in Req : counts[r] >= NumRanks}
                 unexpected == {r \in emitted : st1[r] # "delayed"}
                 freed == {r \in emitted : st1[r] = "delayed"}
             IN  /\ reqState' = [r \in Req |-> IF r \in freed THEN "done" ELSE st1[r]]
                 /\ blocksOf' = [r \in Req |-> IF r \in freed \/ (r \in fin /\ r \notin delays)
                                               THEN <<>> ELSE blocksOf[r]]
                 /\ schedAsync' = IF RFLabel = "delay_if_tracked" THEN schedAsync \ fin
                                  ELSE schedAsync
                 /\ extraSaves' = extraSaves \cup (IF Multi THEN ucmDelays ELSE {})
                 /\ finishedIds' = finishedIds \cup fin
                 /\ agg' = [r \in Req |-> IF r \in emitted THEN 0 ELSE counts[r]]
                 /\ inflight' = Tail(inflight)
                 /\ executed' = executed - 1
                 /\ unexpectedReports' = unexpectedReports \cup unexpected
                 /\ action' = [name |-> "update_from_output",
                               finished |-> fin,
                               calls |-> << [name |-> "request_finished", reqs |-> fin,
                                             ucm_delayed |-> ucmDelays, delayed |-> delays],
                                            [name |-> "_update_from_kv_xfer_finished",
                                             finished_sending |-> emitted,
                                             unexpected |-> unexpected] >>]
    /\ UNCHANGED <<preemptions, workerVars, blockingWaits, preemptOverWaits>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Store environment.                                                      *)
(***************************************************************************)

(* A rank's store finishes its running dump tasks (all of them: a         *)
(* still-running task is the hazard, and completion only removes hazards,  *)
(* so completing a rank's tasks together keeps every worst case; README    *)
(* "Abstractions").  With the "wait" fault they finish with an error that  *)
(* their later wait raises.                                                *)
(* Lockstep: the ranks' stores finish together.                          *)
Running(w) == {t \in pending[w] : t.status = "running"}
task_complete ==
    \E ranks \in IF Lockstep THEN {{w \in Rank : Running(w) # {}}}
                             ELSE {{w} : w \in Rank} :
      /\ ranks # {}
      /\ \A w \in ranks : Running(w) # {}
      /\ \E outcome \in IF "wait" \in Faults THEN {"ok", "error"} ELSE {"ok"} :
           /\ pending' = [w \in Rank |->
                            IF w \in ranks
                            THEN (pending[w] \ Running(w)) \cup
                                 {[t EXCEPT !.status = IF outcome = "ok" THEN "done" ELSE "failed"]
                                  : t \in Running(w)}
                            ELSE pending[w]]
           /\ action' = [name |-> "task_complete", ranks |-> ranks,
                         tasks |-> [w \in ranks |-> {t.id : t \in Running(w)}],
                         outcome |-> outcome]
          /\ UNCHANGED <<schedVars, workerAsync, live, releaseErrors, workerExtra,
                         sibPending, reported, historyVars>>

HasWork == (\E r \in Req : reqState[r] # "done") \/ inflight # <<>>

(* Nothing left: the engine idles (stuttering, so TLC sees no deadlock).   *)
Idle == ~HasWork /\ UNCHANGED vars

Next == schedule \/ execute_model \/ update_from_output \/ task_complete \/ Idle

Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------
(***************************************************************************)
(* Properties.                                                             *)
(***************************************************************************)

TypeInv ==
    /\ reqState \in [Req -> ReqStates]
    /\ \A r \in Req : blocksOf[r] \in Seq(Block) /\ Len(blocksOf[r]) <= PromptBlocks
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
    /\ blockingWaits \in BOOLEAN /\ preemptOverWaits \in BOOLEAN
    /\ workerExtra \in [Rank -> SUBSET Req] /\ sibPending \in [Rank -> SUBSET Req]
    /\ reported \in [Rank -> [Req -> 0..2]]
    /\ action.name \in {"init", "schedule", "execute_model", "update_from_output",
                        "task_complete"}

(* No pending, still-running dump task reads a block that was rewritten    *)
(* (freed and reused by another request's forward) since it was submitted. *)
NoOverwriteWhileDumpingInv ==
    \A w \in Rank : \A t \in pending[w] : t.status = "running" => ~t.clobbered

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

-----------------------------------------------------------------------------
(* Liveness, under fairness stated as premises (cheap to check, see the    *)
(* calibration notes): the engine keeps completing steps while it has work *)
(* (vLLM keeps stepping while delayed requests exist), and the store keeps *)
(* completing tasks.  Checked without SYMMETRY.                            *)

AnyRunningTask == \E w \in Rank : \E t \in pending[w] : t.status = "running"
EngineFair == []<>(action.name = "update_from_output" \/ ~HasWork)
StoreFair  == []<>(action.name = "task_complete" \/ ~AnyRunningTask)
SiblingFair == []<>(\A w \in Rank : sibPending[w] = {})
Fair == EngineFair /\ StoreFair /\ SiblingFair

DelayedEventuallyFreedProp ==
    Fair => \A r \in Req : (reqState[r] = "delayed") ~> (reqState[r] = "done")

PendingEventuallyDrainedProp ==
    Fair => \A w \in Rank : (pending[w] # {}) ~> (pending[w] = {})

EventsEventuallyReleasedProp ==
    Fair => \A w \in Rank : (live[w] # {}) ~> (live[w] = {})

(* Requests, blocks and (unless MLA singles out rank 0) ranks are          *)
(* interchangeable: safety models only (never with liveness).             *)
Symmetry == Permutations(Req) \cup Permutations(Block)
            \cup (IF MLA THEN Permutations(Rank \ {Rank0}) ELSE Permutations(Rank))
=============================================================================
