----------------------------- MODULE MCNoPreemptWait -------------------------------
(* Mutant NoPreemptWait: UCMDirectConnector does not define handle_preemptions (no wait before the forward).
   The table as merged with this one change. *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == Without(RealBehaviour, Direct, "handle_preemptions")
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
