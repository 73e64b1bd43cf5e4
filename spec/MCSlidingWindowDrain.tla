-------------------------- MODULE MCSlidingWindowDrain --------------------------
(* The coarser fence (UCM's later fix: drain the pending dumps before the   *)
(* forward): handle_preemptions waits every pending task whenever a block   *)
(* was freed or a request preempted ("wait_all_on_free").                   *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == <<Direct, "handle_preemptions">> :> "wait_all_on_free" @@ RealBehaviour
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
