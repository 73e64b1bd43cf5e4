----------------------------- MODULE MCTrackAfterMLAReturn -------------------------
(* Mutant TrackAfterMLAReturn: wait_for_save returns on an MLA rank other than 0 before tracking the dump ids.
   The table as merged with this one change. *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == <<Direct, "wait_for_save">> :> "track_after_mla_return" @@ RealBehaviour
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
