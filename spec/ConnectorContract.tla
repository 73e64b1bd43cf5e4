--------------------------- MODULE ConnectorContract ---------------------------
(***************************************************************************)
(* The KV-connector contract as vLLM's side sees it, at the level of block *)
(* lifetimes, for ANY connector (spec/README.md, "The connector contract"). *)
(* vLLM's scheduler hands blocks to requests, preempts (frees at once),   *)
(* finishes requests (request_finished: the connector may delay the free) *)
(* and frees a delayed request when the connector reports it               *)
(* (finished_sending); an async load keeps a request waiting for remote    *)
(* KV until finished_recving.  The connector's transfers (saves reading    *)
(* blocks, loads writing them) are abstract records.  Three safety designs *)
(* are admitted: "delay" (request_finished True, finished_sending after    *)
(* the copy), "flush" (handle_preemptions waits the transfers touching a   *)
(* block before the forward rewrites it), "pin" (freed blocks a transfer   *)
(* still touches stay out of the free pool until it ends).  Design "any"   *)
(* is every connector at once (each decision free, nothing blocked): the   *)
(* spec DeferDump refines (MCDeferDumpContract.tla); it is not explored    *)
(* on its own.  The other designs are test connectors, four of them broken.*)
(*                                                                         *)
(* Grain: one action per engine-loop phase as DeferDump (schedule,         *)
(* execute_model, update_from_output with MaxInflight = 1) plus the        *)
(* store's transfer_done.                                                  *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS
    Req,        \* requests (model values)
    Block,      \* KV-cache blocks of the pool (model values)
    Need,       \* blocks a request's prompt fills (prefill allocates up to Need)
    MaxPreempt, \* bound on preemptions in a behaviour
    Loads,      \* may an admission start an async load (request waits for remote KV)?
    Design      \* the connector: "delay" | "flush" | "pin" | "any" | a broken one (below)

(* The broken connectors (mutants), each a correct design with one fault:  *)
(* "report_before_copy": delay, but finished_sending before the copy ends; *)
(* "free_before_copy": never delays, flushes or pins;                     *)
(* "never_report": delays and waits its copies, never reports;            *)
(* "report_undelayed": flush, but also reports the requests it finished.  *)
Broken == {"report_before_copy", "free_before_copy", "never_report", "report_undelayed"}
Designs == {"delay", "flush", "pin", "any"} \cup Broken
ASSUME Design \in Designs /\ Need \in Nat \ {0} /\ MaxPreempt \in Nat /\ Loads \in BOOLEAN

\* Which designs follow each rule (a broken one keeps its base design's other rules).
Delays   == Design \in {"delay", "report_before_copy", "never_report"}
Flushes  == Design \in {"flush", "report_undelayed"}
Pins     == Design = "pin"

RStates == {"waiting", "recving", "running", "preempted", "delayed", "done"}
Xfer == [reqs : SUBSET Req, blocks : SUBSET Block]

VARIABLES
    phase,      \* the engine loop's next phase: "sched" | "exec" | "update"
    rstate,     \* [Req -> RStates]: recving = waits for remote KV (async load);
                \*   delayed = finished, blocks kept for the connector; done = freed
    held,       \* [Req -> SUBSET Block]: the blocks vLLM holds for the request
    toWrite,    \* blocks the scheduled step's forward writes (handed out by the schedule)
    xfer,       \* the connector's running transfers: [reqs, blocks] it reads or writes
    pinned,     \* freed blocks the connector pins (out of the free pool) while a transfer touches them
    preempts,   \* preemptions so far (bounded by MaxPreempt)
    overwrote,  \* history: has a forward written a block a running transfer touches?
    misSent,    \* history: requests named by finished_sending while not delayed
    misRecv     \* history: requests named by finished_recving while not waiting for remote KV

vars == <<phase, rstate, held, toWrite, xfer, pinned, preempts, overwrote, misSent, misRecv>>

Touched(X) == UNION {x.blocks : x \in X}
Of(r, X) == {x \in X : r \in x.reqs}
Running == {r \in Req : rstate[r] = "running"}

-----------------------------------------------------------------------------
ContractTypeInv ==
    /\ phase \in {"sched", "exec", "update"}
    /\ rstate \in [Req -> RStates]
    /\ held \in [Req -> SUBSET Block]
    /\ toWrite \subseteq Block /\ pinned \subseteq Block
    /\ xfer \subseteq Xfer
    /\ preempts \in 0..MaxPreempt
    /\ overwrote \in BOOLEAN /\ misSent \subseteq Req /\ misRecv \subseteq Req

Init ==
    /\ phase = "sched"
    /\ rstate = [r \in Req |-> "waiting"]
    /\ held = [r \in Req |-> {}]
    /\ toWrite = {} /\ xfer = {} /\ pinned = {}
    /\ preempts = 0
    /\ overwrote = FALSE /\ misSent = {} /\ misRecv = {}

-----------------------------------------------------------------------------
(* Scheduler.schedule (with KVCacheManager.allocate_slots): `victims`      *)
(* running requests are preempted (their blocks freed at once, no          *)
(* request_finished); each request of `adv` gets `new` blocks from the     *)
(* free pool (admission of a waiting or preempted request, or the next     *)
(* prefill chunk of a running one); an admission in `recv` starts an async *)
(* load into its blocks (get_num_new_matched_tokens answered load_async:   *)
(* the request waits for remote KV).  The forward will write every new     *)
(* block of a running request (`toWrite`), and under "any" also blocks a   *)
(* running request holds already (a recompute in place).  A pinning        *)
(* connector keeps freed blocks a transfer touches out of the pool.        *)
Pin(freed) == IF Pins THEN pinned \cup (freed \cap Touched(xfer)) ELSE pinned
Victims(victims) == UNION {held[v] : v \in victims}
PoolFree(victims) == (Block \ Pin(Victims(victims))) \ UNION {held[q] : q \in Req \ victims}

(* Reduction "fresh blocks" (README "Reductions"): a block no variable     *)
(* refers to is interchangeable with any other such block (the models'     *)
(* SYMMETRY), so a schedule hands out fresh blocks in one fixed way         *)
(* (CHOOSE is deterministic) instead of trying every one: any other way is  *)
(* that one with fresh blocks renamed.                                      *)
Fresh == Block \ (UNION {held[r] : r \in Req} \cup toWrite \cup Touched(xfer) \cup pinned)
RECURSIVE FirstOf(_, _)
FirstOf(FF, k) == IF k = 0 THEN {} ELSE LET b == CHOOSE x \in FF : TRUE IN {b} \cup FirstOf(FF \ {b}, k - 1)

(* The maps giving each request of D a non-empty set of blocks of F, the  *)
(* sets disjoint and each request within Need blocks, fresh blocks (FF, a   *)
(* subset of F) handed out by FirstOf: built request by request (filtering *)
(* [D -> SUBSET F] enumerates (2^|F|)^|D| maps: 30,000 at 3 requests and 5 *)
(* blocks, every schedule step).                                           *)
RECURSIVE NewBlocks(_, _, _)
NewBlocks(D, F, FF) ==
    IF D = {} THEN {[r \in {} |-> {}]}
    ELSE LET d == CHOOSE r \in D : TRUE
             Room == Need - Cardinality(held[d])
             Sets == {x \cup FirstOf(FF, k) : x \in SUBSET (F \ FF),
                                             k \in 0..Cardinality(FF)}
         IN  UNION {{(d :> s) @@ f : f \in NewBlocks(D \ {d}, F \ s, FF \ s)}
                    : s \in {x \in Sets : x # {} /\ Cardinality(x) <= Room}}

\* "any" states the same rules on the next state (no enumeration: the refinement check binds it).
SchedTrans(a, b) ==
    CASE a = "waiting" -> b \in {"waiting", "running"} \/ (Loads /\ b = "recving")
      [] a = "running" -> b \in {"running", "preempted"}
      [] a = "preempted" -> b \in {"preempted", "running"}
      [] OTHER -> b = a
AnySchedule ==
    LET victims == {r \in Req : rstate[r] = "running" /\ rstate'[r] = "preempted"}
        adv == {r \in Req : rstate'[r] \in {"running", "recving"} /\ held'[r] # held[r]}
        recv == {r \in Req : rstate'[r] = "recving" /\ rstate[r] # "recving"}
        new == [r \in Req |-> held'[r] \ held[r]]
    IN  /\ \A r \in Req : SchedTrans(rstate[r], rstate'[r])
        /\ \A r \in Req : held'[r] = IF r \in victims THEN {}
                                     ELSE IF r \in adv THEN held[r] \cup new[r] ELSE held[r]
        /\ \A r \in Req : rstate[r] \in {"waiting", "preempted"} /\ rstate'[r] # rstate[r] => r \in adv
        /\ \A r \in adv : new[r] \cap pinned' = {} /\ Cardinality(held'[r]) <= Need
        /\ \A r, q \in Req : r # q => held'[r] \cap held'[q] = {}
        /\ preempts' = preempts + Cardinality(victims) /\ preempts' <= MaxPreempt
        /\ UNION {new[r] : r \in adv \ recv} \subseteq toWrite'
        /\ toWrite' \subseteq UNION {held'[r] : r \in {q \in Req : rstate'[q] = "running"}}
        /\ xfer' = xfer \cup {[reqs |-> {r}, blocks |-> new[r]] : r \in recv}
        /\ pinned \subseteq pinned' /\ pinned' \ pinned \subseteq Victims(victims)

schedule ==
    /\ phase = "sched"
    /\ IF Design = "any" THEN AnySchedule ELSE
       \E victims \in {v \in SUBSET Running : preempts + Cardinality(v) <= MaxPreempt} :
       \E adv \in SUBSET ({r \in Req : rstate[r] \in {"waiting", "preempted"}}
                          \cup {r \in Running \ victims : Cardinality(held[r]) < Need}) :
       \E recv \in IF Loads THEN SUBSET {r \in adv : rstate[r] = "waiting"} ELSE {{}} :
       \E new \in NewBlocks(adv, PoolFree(victims), Fresh) :
         /\ rstate' = [r \in Req |-> IF r \in victims THEN "preempted"
                                     ELSE IF r \in recv THEN "recving"
                                     ELSE IF r \in adv THEN "running" ELSE rstate[r]]
         /\ held' = [r \in Req |-> IF r \in victims THEN {}
                                   ELSE IF r \in adv THEN held[r] \cup new[r] ELSE held[r]]
         /\ toWrite' = UNION {new[r] : r \in adv \ recv}
         /\ xfer' = xfer \cup {[reqs |-> {r}, blocks |-> new[r]] : r \in recv}
         /\ pinned' = Pin(Victims(victims))
         /\ preempts' = preempts + Cardinality(victims)
    /\ phase' = "exec"
    /\ UNCHANGED <<overwrote, misSent, misRecv>>

(* GPUModelRunner.execute_model on the workers: handle_preemptions (the     *)
(* connector may wait transfers: `flushed`), the forward writes `toWrite`  *)
(* (a running transfer touching one is overwritten), the connector saves   *)
(* the computed blocks (wait_for_save/save_kv_layer: `started`), and       *)
(* get_finished may wait transfers (`ended`).  A delaying connector waits  *)
(* the preempted requests' transfers before the forward and the delayed    *)
(* requests' after it; a flushing one every transfer touching a block the  *)
(* forward writes; a pinning one nothing.                                   *)
Hit(X) == \E x \in X : x.blocks \cap toWrite # {}
Writers == {r \in Running : held[r] \cap toWrite # {}}
Saves == IF Writers = {} THEN {} ELSE {[reqs |-> Writers, blocks |-> toWrite]}
FlushSet ==
    IF Flushes THEN {x \in xfer : x.blocks \cap toWrite # {}}
    ELSE IF Delays THEN {x \in xfer : \E r \in x.reqs : rstate[r] = "preempted"}
    ELSE {}
EndSet(flushed) ==
    IF Design \in {"delay", "never_report"}
    THEN {x \in xfer \ flushed : \E r \in x.reqs : rstate[r] = "delayed"} ELSE {}
Unpin(X) == IF Pins THEN pinned \cap Touched(X) ELSE pinned
\* "any": the started transfers read blocks of this forward; only the ended ones can have been flushed.
SaveRecs == [reqs : (SUBSET Req) \ {{}}, blocks : (SUBSET toWrite) \ {{}}]

execute_model ==
    /\ phase = "exec"
    /\ IF Design = "any"
       THEN /\ xfer' \subseteq xfer \cup SaveRecs
            /\ \E flushed \in SUBSET (xfer \ xfer') : overwrote' = (overwrote \/ Hit(xfer \ flushed))
            /\ pinned' \subseteq pinned
       ELSE LET flushed == FlushSet
                after == ((xfer \ flushed) \ EndSet(flushed)) \cup Saves
            IN  /\ overwrote' = (overwrote \/ Hit(xfer \ flushed))
                /\ xfer' = after
                /\ pinned' = Unpin(after)
    /\ toWrite' = {}
    /\ phase' = "update"
    /\ UNCHANGED <<rstate, held, preempts, misSent, misRecv>>

(* Scheduler.update_from_output: the requests in `fin` stop (running or     *)
(* preempted ones); request_finished(r) answers whether the free is        *)
(* delayed (a delaying connector: iff a transfer of r still runs); then    *)
(* update_connector_output: finished_sending frees the delayed requests it *)
(* names, finished_recving lets the requests it names run.  A report of a  *)
(* request not waiting for one is recorded (vLLM asserts on it).  Under    *)
(* "any" every answer and report is possible; a request whose free is      *)
(* delayed may keep only some blocks (the sliding-window ones out of the   *)
(* window are freed before the call).                                      *)
request_finished(r) == Delays /\ Of(r, xfer) # {}
finished_sending ==
    CASE Design = "delay" -> {r \in Req : rstate[r] = "delayed" /\ Of(r, xfer) = {}}
      [] Design = "report_before_copy" -> {r \in Req : rstate[r] = "delayed"}
      [] Design = "report_undelayed" -> {r \in Req : rstate[r] = "done"}
      [] OTHER -> {}
finished_recving ==
    IF Design = "never_report" THEN {}
    ELSE {r \in Req : rstate[r] = "recving" /\ (Of(r, xfer) = {} \/ Design = "report_before_copy")}
UpdTrans(a, b) ==
    CASE a \in {"running", "preempted"} -> b \in {a, "delayed", "done"}
      [] a = "delayed" -> b \in {"delayed", "done"}
      [] a = "recving" -> b \in {"recving", "running"}
      [] OTHER -> b = a

update_from_output ==
    /\ phase = "update"
    /\ IF Design = "any"
       THEN /\ \A r \in Req : UpdTrans(rstate[r], rstate'[r])
            /\ \A r \in Req : held'[r] = IF rstate'[r] = "done" THEN {}
                                         ELSE IF rstate'[r] = "delayed" /\ rstate[r] # "delayed"
                                         THEN held'[r] \cap held[r]
                                         ELSE held[r]
            /\ misSent \subseteq misSent' /\ misSent' \ misSent \subseteq {r \in Req : rstate[r] # "delayed"}
            /\ misRecv \subseteq misRecv' /\ misRecv' \ misRecv \subseteq {r \in Req : rstate[r] # "recving"}
            /\ pinned' \ pinned \subseteq UNION {held[r] \ held'[r] : r \in Req}
       ELSE \E fin \in SUBSET {r \in Req : rstate[r] \in {"running", "preempted"}} :
            LET st == [r \in Req |-> IF r \in fin THEN IF request_finished(r) THEN "delayed" ELSE "done"
                                     ELSE IF r \in finished_sending /\ rstate[r] = "delayed" THEN "done"
                                     ELSE IF r \in finished_recving THEN "running" ELSE rstate[r]]
                freed == UNION {held[r] : r \in {q \in Req : st[q] = "done" /\ rstate[q] # "done"}}
            IN  /\ rstate' = st
                /\ held' = [r \in Req |-> IF st[r] = "done" THEN {} ELSE held[r]]
                /\ pinned' = Pin(freed)
                /\ misSent' = misSent \cup {r \in finished_sending : rstate[r] # "delayed"}
                /\ misRecv' = misRecv \cup {r \in finished_recving : rstate[r] # "recving"}
    /\ phase' = "sched"
    /\ UNCHANGED <<toWrite, xfer, preempts, overwrote>>

(* The store: transfers end on their own (a save stops reading, a load    *)
(* has written); a pinning connector then unpins the blocks no transfer    *)
(* touches any more.  Under "any" several may end at once.                 *)
transfer_done ==
    /\ xfer # {}
    /\ IF Design = "any"
       THEN /\ xfer' \subseteq xfer /\ xfer' # xfer
            /\ pinned' \subseteq pinned
       ELSE \E x \in xfer : /\ xfer' = xfer \ {x}
                            /\ pinned' = Unpin(xfer \ {x})
    /\ UNCHANGED <<phase, rstate, held, toWrite, preempts, overwrote, misSent, misRecv>>

Next == schedule \/ execute_model \/ update_from_output \/ transfer_done

Spec == Init /\ [][Next]_vars

(* Fairness as premises over state predicates (cheap to check, as in      *)
(* DeferDump): the engine keeps completing steps, and infinitely often no  *)
(* transfer runs (every transfer ends; a run starts finitely many).        *)
EngineFair == []<>(phase = "update") /\ []<>(phase = "sched")
StoreFair == []<>(xfer = {})
Fair == EngineFair /\ StoreFair

-----------------------------------------------------------------------------
(* The contract.                                                           *)

(* finished_sending names only a request whose free was delayed for it,    *)
(* once per life (a report frees it: a second one finds it done).          *)
SendingOnlyDelayedInv == misSent = {}

(* finished_recving names only a request waiting for remote KV, once.      *)
RecvingOnlyWaitingInv == misRecv = {}

(* No block of a delayed request (or of one waiting for remote KV) is held *)
(* by another request before the connector reports it.                     *)
NoReuseBeforeReportInv ==
    \A r \in Req : rstate[r] \in {"delayed", "recving"} =>
        \A q \in Req \ {r} : held[r] \cap held[q] = {}

(* No forward writes a block while a transfer of the connector still       *)
(* reads or writes it (where flush and pin come in).                       *)
NoWriteWhileTransferInv == ~overwrote

(* In a run where the engine keeps stepping and transfers end (Fair), every *)
(* delayed request is reported, and every async load.                      *)
DelayedEventuallyReportedProp ==
    Fair => \A r \in Req : (rstate[r] \in {"delayed", "recving"}) ~> (rstate[r] \notin {"delayed", "recving"})

Symmetry == Permutations(Req) \cup Permutations(Block)
=============================================================================
