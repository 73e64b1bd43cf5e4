----------------------------- MODULE MCBlockingWaitForSave -------------------------
(* Mutant BlockingWaitForSave: wait_for_save waits the task it submitted (the pre-PR behaviour).
   The table as merged with this one change. *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == <<Direct, "wait_for_save">> :> "blocking" @@ RealBehaviour
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
