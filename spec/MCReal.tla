------------------------------- MODULE MCReal -------------------------------
(* Every passing model: the protocol with the class table as merged.       *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == RealBehaviour
MCDefines == DefinesFrom(RealBehaviour)
=============================================================================
