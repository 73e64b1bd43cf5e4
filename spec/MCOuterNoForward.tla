----------------------------- MODULE MCOuterNoForward ------------------------------
(* Mutant OuterNoForward: The outer UCMConnector does not forward request_finished (the pre-PR wrapper).
   The table as merged with this one change. *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == Without(RealBehaviour, Outer, "request_finished")
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
