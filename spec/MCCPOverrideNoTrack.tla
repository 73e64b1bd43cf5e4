----------------------------- MODULE MCCPOverrideNoTrack ---------------------------
(* Mutant CPOverrideNoTrack: UCMCPConnector defines build_connector_meta without tracking (the reviewer's hypothesis).
   The table as merged with this one change. *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == <<CP, "build_connector_meta">> :> "notrack" @@ RealBehaviour
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
