----------------------------- MODULE Connectors -----------------------------
(***************************************************************************)
(* The connector class table of UCM PR #989, Python's C3 linearization     *)
(* (the MRO) and method dispatch.                                          *)
(*                                                                         *)
(* The table is supplied through CONSTANTS so that a tool can inject       *)
(* another one (spec/README.md, "Injecting a class table"): an MC module   *)
(* defines MCClasses, MCBases, MCDefines and MCBehaviour and the cfg       *)
(* assigns them with `Classes <- MCClasses` etc.  Each definition of a     *)
(* method by a class carries a behaviour label; the protocol module        *)
(* (DeferDump) never asks "which class am I?", it asks Resolve/Label for   *)
(* the definition Python would run and behaves as that label says.         *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

CONSTANTS
    Classes,    \* set of class names (strings), e.g. "UCMDirectConnector"
    Bases,      \* [Classes -> Seq(Classes)]: direct bases, in declaration order
    Defines,    \* [Classes -> SUBSET Methods]: the methods a class body defines
    Behaviour   \* [{<<c, m>> : c \in Classes, m \in Defines[c]} -> label]

(* The connector methods the protocol dispatches.                          *)
Methods == {"build_connector_meta", "request_finished",
            "request_finished_all_groups", "handle_preemptions",
            "save_kv_layer", "wait_for_save", "get_finished",
            "_wait_pending_dump_task", "_dumping_requests"}

(* The behaviour labels each method's definitions may carry (README).      *)
(* Every method also accepts "super" (call the next definition along the   *)
(* MRO of the object's class), "forward" (a wrapper calling the same       *)
(* method of its inner connector), "base" (the KVConnectorBase_V1 default) *)
(* and "unknown" (an unrecognised body, judged conservatively: as "base",  *)
(* i.e. it does none of the PR's work).                                    *)
CommonLabels == {"super", "forward", "base", "unknown"}

(* A wrapper's method that calls a *different* method of its inner        *)
(* connector (the HMA entry point falling back to the inner                *)
(* request_finished, or the reverse): the label names the inner method.    *)
CrossForward == [request_finished_all_groups |-> "forward_request_finished",
                 request_finished            |-> "forward_request_finished_all_groups"]
ForwardLabels == {"forward"} \cup {CrossForward[k] : k \in DOMAIN CrossForward}

(* The inner method a forwarding label of m calls ("" if not a forward).   *)
ForwardTarget(m, l) ==
    CASE l = "forward"                              -> m
      [] l = "forward_request_finished"             -> "request_finished"
      [] l = "forward_request_finished_all_groups"  -> "request_finished_all_groups"
      [] OTHER                                      -> ""
LabelsOf(m) ==
    CommonLabels \cup
    CASE m = "build_connector_meta"        -> {"track", "notrack"}
      [] m = "request_finished"            -> {"delay_if_tracked", "delay_all",
                                               "forward_request_finished_all_groups"}
      [] m = "request_finished_all_groups" -> {"call_request_finished", "delay_all",
                                               "delay_if_tracked", "forward_request_finished"}
      [] m = "handle_preemptions"          -> {"wait_preempted", "wait_all", "wait_one_preempted",
                                               "wait_freed", "wait_all_on_free", "wait_all_always"}
      [] m = "save_kv_layer"               -> {"submit_layer", "pass", "sync_save"}
      [] m = "wait_for_save"               -> {"poll_track_submit", "poll_track",
                                               "blocking", "track_after_mla_return",
                                               "sync_save", "wait_all"}
      [] m = "get_finished"                -> {"wait_finished", "report_before_wait"}
      [] m = "_wait_pending_dump_task"     -> {"release_finally", "release_on_success"}
      [] m = "_dumping_requests"           -> {"all_slices", "skip_failed_loads"}
      [] OTHER                             -> {}

-----------------------------------------------------------------------------
(* C3 linearization.                                                       *)

MinOf(S) == CHOOSE i \in S : \A j \in S : i <= j

(* Is class c in the tail (any position but the first) of some sequence?   *)
InSomeTail(c, seqs) ==
    \E i \in 1..Len(seqs) : \E j \in 2..Len(seqs[i]) : seqs[i][j] = c

C3Failure == "C3_INCONSISTENT_HIERARCHY"

(* C3 merge: repeatedly take the first head that is in no tail.            *)
RECURSIVE Merge(_)
Merge(seqs) ==
    LET nonEmpty == SelectSeq(seqs, LAMBDA s : s # <<>>)
    IN  IF nonEmpty = <<>> THEN <<>>
        ELSE LET good == {i \in 1..Len(nonEmpty) : ~InSomeTail(Head(nonEmpty[i]), nonEmpty)}
             IN  IF good = {} THEN <<C3Failure>>
                 ELSE LET c == Head(nonEmpty[MinOf(good)])
                      IN  <<c>> \o Merge([k \in 1..Len(nonEmpty) |->
                                            IF Head(nonEmpty[k]) = c THEN Tail(nonEmpty[k])
                                                                     ELSE nonEmpty[k]])

(* MRO(c) = c + merge(MRO(b1), ..., MRO(bn), [b1, ..., bn]).               *)
RECURSIVE MRO(_)
MRO(c) == <<c>> \o Merge([i \in 1..Len(Bases[c]) |-> MRO(Bases[c][i])] \o <<Bases[c]>>)

Range(s) == {s[i] : i \in DOMAIN s}

-----------------------------------------------------------------------------
(* Dispatch.                                                               *)

(* The first class along `seq` whose body defines m ("" if none).          *)
RECURSIVE FirstDefiner(_, _)
FirstDefiner(seq, m) ==
    IF seq = <<>> THEN ""
    ELSE IF m \in Defines[Head(seq)] THEN Head(seq) ELSE FirstDefiner(Tail(seq), m)

(* Python's attribute lookup: the class whose definition of m runs for an  *)
(* instance of class c.                                                    *)
Resolve(c, m) == FirstDefiner(MRO(c), m)

(* The MRO of c after class d (where `super()` inside d's body looks).     *)
AfterIn(seq, d) == LET idx == CHOOSE i \in 1..Len(seq) : seq[i] = d
                   IN  SubSeq(seq, idx + 1, Len(seq))

(* The label of the definition that runs for an instance of c, following   *)
(* "super" along c's MRO; "base" when nothing defines m.                   *)
RECURSIVE LabelAlong(_, _)
LabelAlong(seq, m) ==
    LET d == FirstDefiner(seq, m)
    IN  IF d = "" THEN "base"
        ELSE IF Behaviour[<<d, m>>] = "super" THEN LabelAlong(AfterIn(seq, d), m)
        ELSE Behaviour[<<d, m>>]

Label(c, m) == LabelAlong(MRO(c), m)

(* The effective behaviour of calling m on an object of class `outer`      *)
(* wrapping an object of class `inner`: a forwarding label runs the inner  *)
(* method it names (the call the code makes, resolved along the inner's    *)
(* MRO); "unknown" is judged as "base".  A forward on the inner object     *)
(* itself has nothing to forward to and is judged "base" as well.  An      *)
(* inner request_finished_all_groups that calls request_finished, reached  *)
(* from the wrapper's request_finished, runs the inner's request_finished. *)
Effective(outer, inner, m) ==
    LET l1 == Label(outer, m)
        t  == ForwardTarget(m, l1)
        l2 == IF t # "" THEN Label(inner, t) ELSE l1
        l3 == IF t = "request_finished_all_groups" /\ l2 = "call_request_finished"
              THEN Label(inner, "request_finished") ELSE l2
    IN  IF l3 \in {"unknown"} \cup ForwardLabels THEN "base" ELSE l3

(* Well-formedness of an (injected) table.                                 *)
TableOK ==
    /\ \A c \in Classes : Range(Bases[c]) \subseteq Classes
    /\ \A c \in Classes : Defines[c] \subseteq Methods
    /\ \A c \in Classes : \A m \in Defines[c] : Behaviour[<<c, m>>] \in LabelsOf(m)
    /\ \A c \in Classes : C3Failure \notin Range(MRO(c))
=============================================================================
