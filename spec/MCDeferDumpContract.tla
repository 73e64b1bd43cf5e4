------------------------- MODULE MCDeferDumpContract -------------------------
(* DeferDump with the class table as merged, checked against the connector contract. *)
EXTENDS ContractRefinement, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == RealBehaviour
MCDefines == DefinesFrom(RealBehaviour)
=============================================================================
