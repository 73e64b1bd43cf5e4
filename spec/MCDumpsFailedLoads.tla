----------------------------- MODULE MCDumpsFailedLoads -----------------------------
(* Mutant DumpsFailedLoads, PR #989 as merged: the worker dumps every slice of a step, a request's
   slice included when its load failed in that step (no _dumping_requests filter).
   The table as merged with this one change. *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == Without(RealBehaviour, Direct, "_dumping_requests")
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
