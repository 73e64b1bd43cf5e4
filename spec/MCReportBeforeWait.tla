----------------------------- MODULE MCReportBeforeWait ----------------------------
(* Mutant ReportBeforeWait: get_finished reports finished requests without waiting their tasks.
   The table as merged with this one change. *)
EXTENDS DeferDump, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == <<Direct, "get_finished">> :> "report_before_wait" @@ RealBehaviour
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
