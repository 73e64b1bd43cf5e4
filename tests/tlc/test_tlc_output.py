"""The -tool message parser and the verdict logic on recorded TLC 2.15 output (no JVM needed)."""
from __future__ import annotations

from deferdump.tools.tlc.output import (
    Kind,
    MessageStream,
    Status,
    cfg_properties,
    interpret,
    parse_progress,
    sany_message,
    search_seconds,
)


def _msg(code: int, severity: int, text: str) -> str:
    return f"@!@!@STARTMSG {code}:{severity} @!@!@\n{text}\n@!@!@ENDMSG {code} @!@!@\n"


def _stream(text: str) -> MessageStream:
    stream = MessageStream()
    for line in text.splitlines(keepends=True):
        stream.feed(line)
    stream.close()
    return stream


def _module_path(module: str) -> str:
    return f"spec/{module}.tla"


ASSERT_OUTPUT = (
    "@!@!@STARTMSG 1000:1 @!@!@\nTLC threw an unexpected exception.\nThe exception was a tlc2.tool.EvalException\n"
    ": @!@!@STARTMSG 2132:0 @!@!@\nThe first argument of Assert evaluated to FALSE; the second argument was:\n"
    '"boom"\n@!@!@ENDMSG 2132 @!@!@\n@!@!@ENDMSG 1000 @!@!@\n'
)


def test_nested_message_starting_mid_line() -> None:
    stream = _stream(ASSERT_OUTPUT)
    assert [m.code for m in stream.top_level] == [1000]
    outer = stream.top_level[0]
    assert [c.code for c in outer.children] == [2132]
    assert outer.children[0].text.endswith('"boom"')
    verdict = interpret(stream, 75, cfg_text=None, module_path=_module_path)
    assert (verdict.status, verdict.kind, verdict.message) == (Status.VIOLATION, Kind.ASSERT, 'Assert failed: "boom"')


def test_exit_code_disagreeing_with_messages_is_an_error() -> None:
    stream = _stream(_msg(2114, 1, "Deadlock reached."))
    verdict = interpret(stream, 12, cfg_text=None, module_path=_module_path)
    assert (verdict.status, verdict.kind) == (Status.ERROR, Kind.RUNTIME)
    assert verdict.message == "TLC exit code 12 (VIOLATION_SAFETY) disagrees with its messages (deadlock)"
    verdict = interpret(_stream(_msg(2193, 0, "Model checking completed.")), 0, cfg_text=None,
                        module_path=_module_path)
    assert verdict.status is Status.PASS


def test_unknown_exit_code_with_java_exception_text() -> None:
    stream = _stream("Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space\n")
    verdict = interpret(stream, 1, cfg_text=None, module_path=_module_path)
    assert (verdict.status, verdict.kind) == (Status.ERROR, Kind.RUNTIME)
    assert verdict.message == ("TLC exited with code 1 (unknown): Exception in thread \"main\" "
                               "java.lang.OutOfMemoryError: Java heap space")


def test_temporal_property_is_named_only_when_unique() -> None:
    stream = _stream(_msg(2116, 1, "Temporal properties were violated."))
    one = interpret(stream, 13, cfg_text="SPECIFICATION Spec\nPROPERTY AProp \\* the one\n",
                    module_path=_module_path)
    assert one.property == "AProp"
    two = interpret(stream, 13, cfg_text="PROPERTIES AProp BProp\n", module_path=_module_path)
    assert two.property is None and "does not name the property" in (two.message or "")


def test_cfg_properties_skip_comments_and_other_sections() -> None:
    cfg = "(* PROPERTY Hidden *)\nCONSTANTS N = 3\nPROPERTIES\n  A \\* first\n  B\nINVARIANT TypeInv\n"
    assert cfg_properties(cfg) == ["A", "B"]


def test_progress_counts_with_thousands_separators() -> None:
    text = ("Progress(12) at 2026-11-30 05:49:59: 2,744,706 states generated (1,067 s/min), "
            "296,448 distinct states found (686 ds/min), 1,024 states left on queue.")
    report = parse_progress(text, 3.5)
    assert (report.depth, report.generated_states, report.distinct_states, report.queue, report.seconds) == (
        12, 2744706, 296448, 1024, 3.5)
    simulation = parse_progress("120 states generated, -1 distinct states found, -1 states left on queue.", 0)
    assert (simulation.generated_states, simulation.distinct_states) == (120, None)


SEMANTIC_ERRORS = """Semantic errors:

*** Errors: 2

line 5, col 136 to line 5, col 136 of module V

Could not find declaration or definition of symbol '-.'.


line 5, col 136 to line 5, col 137 of module V

Couldn't resolve prefix operator symbol `-.'.
"""


def test_semantic_error_message() -> None:
    assert sany_message(SEMANTIC_ERRORS, _module_path) == (
        "spec/V.tla:5:136: Could not find declaration or definition of symbol '-.'. (and 1 more errors)")
    missing = "Unknown location\n\nCannot find source file for module Naturalz imported in module V.\n"
    assert sany_message(missing, _module_path) == "Cannot find source file for module Naturalz imported in module V."


def test_search_time_ends_at_the_violation_not_after_the_counterexample() -> None:
    """A violation stops the search: the counterexample TLC prints afterwards is not search time."""
    stream = MessageStream()
    arrivals = iter([10.0, 12.5, 20.0, 21.0])
    for text in (_msg(2190, 0, "Finished computing initial states: 1 distinct state generated."),
                 _msg(2110, 1, "Invariant XInv is violated."),
                 _msg(2217, 4, "1: <Initial predicate>"),
                 _msg(2186, 0, "Finished in 11s")):
        for line in text.splitlines(keepends=True):
            stream.feed(line)
        stream.messages[-1].received = next(arrivals)
    assert search_seconds(stream) == 2.5
    passing = MessageStream()
    for text, at in ((_msg(2190, 0, "Finished computing initial states"), 1.0),
                     (_msg(2199, 0, "7 states generated"), 3.0), (_msg(2186, 0, "Finished in 3s"), 4.0)):
        for line in text.splitlines(keepends=True):
            passing.feed(line)
        passing.messages[-1].received = at
    assert search_seconds(passing) == 3.0
