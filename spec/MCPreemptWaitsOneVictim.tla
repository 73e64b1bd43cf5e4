------------------------- MODULE MCPreemptWaitsOneVictim -------------------------
(* Mutant PreemptWaitsOneVictim: handle_preemptions waits the tasks of one preempted request only.
   The table as merged with this one change. *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == <<Direct, "handle_preemptions">> :> "wait_one_preempted" @@ RealBehaviour
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
