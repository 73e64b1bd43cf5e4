----------------------------- MODULE RealTable -----------------------------
(***************************************************************************)
(* The class table of UCM PR #989 as merged (ucm-deferred-dump.md, sec. 8):*)
(* KVConnectorBase_V1 <- UCMDirectConnector <- UCMLayerWiseConnector       *)
(* <- UCMCPConnector, and the outer UCMConnector wrapper that forwards.    *)
(* MCReal uses it as is; each mutant module changes one entry.             *)
(***************************************************************************)
EXTENDS TLC

Base == "KVConnectorBase_V1"
Direct == "UCMDirectConnector"
LayerWise == "UCMLayerWiseConnector"
CP == "UCMCPConnector"
Outer == "UCMConnector"

RealClasses == {Base, Direct, LayerWise, CP, Outer}

RealBases ==
    Base :> <<>> @@ Direct :> <<Base>> @@ LayerWise :> <<Direct>>
    @@ CP :> <<LayerWise>> @@ Outer :> <<Base>>

(* The behaviour label of each (class, method) definition (README).       *)
RealBehaviour ==
       <<Base, "build_connector_meta">>        :> "base"
    @@ <<Base, "request_finished">>            :> "base"
    @@ <<Base, "handle_preemptions">>          :> "base"
    @@ <<Base, "save_kv_layer">>               :> "base"
    @@ <<Base, "wait_for_save">>               :> "base"
    @@ <<Base, "get_finished">>                :> "base"
    @@ <<Direct, "build_connector_meta">>      :> "track"
    @@ <<Direct, "request_finished">>          :> "delay_if_tracked"
    @@ <<Direct, "request_finished_all_groups">> :> "call_request_finished"
    @@ <<Direct, "handle_preemptions">>        :> "wait_preempted"
    @@ <<Direct, "save_kv_layer">>             :> "pass"
    @@ <<Direct, "wait_for_save">>             :> "poll_track_submit"
    @@ <<Direct, "get_finished">>              :> "wait_finished"
    @@ <<Direct, "_wait_pending_dump_task">>   :> "release_finally"
    \* the one entry beyond the merge: a rank submits no dump slice of a request whose load
    \* failed in the step (the merged PR dumps every slice: MCDumpsFailedLoads)
    @@ <<Direct, "_dumping_requests">>         :> "skip_failed_loads"
    @@ <<LayerWise, "save_kv_layer">>          :> "submit_layer"
    @@ <<LayerWise, "wait_for_save">>          :> "poll_track"
    @@ <<CP, "save_kv_layer">>                 :> "super"
    @@ <<CP, "wait_for_save">>                 :> "super"
    @@ <<Outer, "build_connector_meta">>       :> "forward"
    @@ <<Outer, "request_finished">>           :> "forward"
    @@ <<Outer, "request_finished_all_groups">> :> "forward"
    @@ <<Outer, "handle_preemptions">>         :> "forward"
    @@ <<Outer, "save_kv_layer">>              :> "forward"
    @@ <<Outer, "wait_for_save">>              :> "forward"
    @@ <<Outer, "get_finished">>               :> "forward"

(* The methods each class defines, read off a behaviour map.              *)
DefinesFrom(beh) == [c \in RealClasses |-> {p[2] : p \in {q \in DOMAIN beh : q[1] = c}}]

(* A behaviour map without the definition of m in class c.               *)
Without(beh, c, m) == [p \in DOMAIN beh \ {<<c, m>>} |-> beh[p]]
=============================================================================
