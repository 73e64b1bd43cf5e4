--------------------------- MODULE ContractRefinement ---------------------------
(***************************************************************************)
(* DeferDump refines the connector contract (spec/README.md, "The         *)
(* connector contract"): the contract's variables as expressions of        *)
(* DeferDump's, and the contract's spec and invariants restated on         *)
(* DeferDump's variables.  Unfused phases with MaxInflight = 1 (the        *)
(* contract's grain: one action per engine-loop phase); the class table    *)
(* comes from the MC module extending this one.                            *)
(***************************************************************************)
EXTENDS DeferDump

ASSUME ~FusedStep /\ MaxInflight = 1

\* The engine loop's next phase: nothing scheduled, scheduled but not run, run but not processed.
CPhase == IF inflight = <<>> THEN "sched" ELSE IF executed = 0 THEN "exec" ELSE "update"
\* Both KV-cache groups' blocks (0, the null block, is no block).
CHeld == [r \in Req |-> Range(blocksOf[r]) \cup SwHeld(swBlocksOf[r])]
\* The blocks the scheduled, not yet executed step's forward writes (both groups).
CToWrite == IF inflight # <<>> /\ executed = 0
            THEN {a.block : a \in inflight[1].writes} \cup {x[1] : x \in SwWrites(inflight[1])}
            ELSE {}
\* Every rank's still-running dump task, as the requests and blocks it reads.
CXfer == {[reqs |-> t.reqs, blocks |-> t.blocks] :
            t \in UNION {{u \in pending[w] : u.status = "running"} : w \in Rank}}

C == INSTANCE ConnectorContract
        WITH Need <- PromptBlocks, Loads <- FALSE, Design <- "any",
             phase <- CPhase, rstate <- reqState, held <- CHeld, toWrite <- CToWrite, xfer <- CXfer,
             pinned <- {}, preempts <- preemptions, overwrote <- dumpOverwrites,
             misSent <- unexpectedReports, misRecv <- {}

ContractSpecProp == C!Spec
ContractTypeInv == C!ContractTypeInv
ContractSendingOnlyDelayedInv == C!SendingOnlyDelayedInv
ContractRecvingOnlyWaitingInv == C!RecvingOnlyWaitingInv
ContractNoReuseBeforeReportInv == C!NoReuseBeforeReportInv
ContractNoWriteWhileTransferInv == C!NoWriteWhileTransferInv
\* Under the contract's fairness premises (mapped: the engine keeps stepping, no dump task runs infinitely often).
ContractDelayedEventuallyReportedProp == C!DelayedEventuallyReportedProp
=============================================================================
