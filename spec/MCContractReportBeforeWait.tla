---------------------- MODULE MCContractReportBeforeWait ----------------------
(* Mutant ReportBeforeWait checked against the connector contract: get_finished reports finished
   requests without waiting their tasks (the table as merged with this one change). *)
EXTENDS ContractRefinement, RealTable

MCClasses == RealClasses
MCBases == RealBases
MCBehaviour == <<Direct, "get_finished">> :> "report_before_wait" @@ RealBehaviour
MCDefines == DefinesFrom(MCBehaviour)
=============================================================================
