-------------------- MODULE MCContractTrackAfterMLAReturn --------------------
(* Mutant TrackAfterMLAReturn checked against the connector contract: wait_for_save returns on an MLA rank
   other than 0 before tracking the dump ids, so that rank never reports (the table as merged with this
   one change). *)
EXTENDS ContractRefinement, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == <<Direct, "wait_for_save">> :> "track_after_mla_return" @@ RealBehaviour
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
