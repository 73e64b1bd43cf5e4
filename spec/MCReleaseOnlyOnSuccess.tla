----------------------------- MODULE MCReleaseOnlyOnSuccess ------------------------
(* Mutant ReleaseOnlyOnSuccess: _wait_pending_dump_task releases the event handle only after a successful wait.
   The table as merged with this one change. *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == <<Direct, "_wait_pending_dump_task">> :> "release_on_success" @@ RealBehaviour
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
