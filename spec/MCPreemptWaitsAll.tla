----------------------------- MODULE MCPreemptWaitsAll -----------------------------
(* Mutant PreemptWaitsAll: handle_preemptions waits every pending task when anything was preempted.
   The table as merged with this one change. *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == <<Direct, "handle_preemptions">> :> "wait_all" @@ RealBehaviour
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
