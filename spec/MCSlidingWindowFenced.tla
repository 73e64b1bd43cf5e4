-------------------------- MODULE MCSlidingWindowFenced --------------------------
(* The fix for hybrid (sliding-window) models: handle_preemptions, before   *)
(* the forward, also waits every pending task that reads a block freed      *)
(* since it was submitted ("wait_freed").  The table as merged otherwise.   *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == <<Direct, "handle_preemptions">> :> "wait_freed" @@ RealBehaviour
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
