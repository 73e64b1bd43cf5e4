"""Reading TLC 2.15's ``-tool`` output: the message stream, and what a finished run means.

TLC frames each message as ``@!@!@STARTMSG code:severity @!@!@`` … ``@!@!@ENDMSG code @!@!@``. Messages
nest (an Assert failure, 2132, arrives inside a general error, 1000, and the start marker may sit in
the middle of a line), and SANY's parse errors are plain text between messages 2220 and 2219. The exit
code is the primary verdict; the messages supply the details, and the two are cross-checked.
"""
from __future__ import annotations

import enum
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from deferdump.reference.errors import UserError
from deferdump.tools.tlc.cfg import SECTION_KEYWORDS, strip_comments
from deferdump.tools.tlc.values import Record, TlaParseError, Value, parse_value, value_key

log = logging.getLogger(__name__)


class Code:
    """TLC 2.15 message codes (``tlc2.output.EC``) the bridge acts on."""

    GENERAL = 1000
    NESTED_EXPRESSION = 2103
    ASSUMPTION_FALSE = 2104
    INVARIANT_VIOLATED_INITIAL = 2107
    INVARIANT_VIOLATED_BEHAVIOR = 2110
    ACTION_PROPERTY_VIOLATED = 2112
    DEADLOCK_REACHED = 2114
    TEMPORAL_PROPERTY_VIOLATED = 2116
    BEHAVIOR_UP_TO_THIS_POINT = 2121
    BACK_TO_STATE = 2122
    ASSERT_FAILED = 2132
    INIT_GENERATED = 2190
    SUCCESS = 2193
    SEARCH_DEPTH = 2194
    STARTING = 2185
    FINISHED = 2186
    STATS = 2199
    PROGRESS = 2200
    SIMULATION_PROGRESS = 2209
    SIMULATION_STATS = 2210
    STATE = 2217
    STUTTERING = 2218
    SANY_END = 2219
    SANY_START = 2220
    VERSION = 2262
    COUNTER_EXAMPLE = 2264
    PARSING_FAILED = 3002


class Status(str, enum.Enum):
    """The verdict of one TLC run."""

    PASS = "pass"
    VIOLATION = "violation"
    ERROR = "error"


class Kind(str, enum.Enum):
    """What was violated, or what went wrong (``None`` on a pass)."""

    INVARIANT = "invariant"
    DEADLOCK = "deadlock"
    LIVENESS = "liveness"
    ACTION = "action"
    ASSERT = "assert"
    ASSUMPTION = "assumption"
    PARSE = "parse"
    CONFIG = "config"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    RUNTIME = "runtime"


class TlcOutputError(UserError):
    """TLC printed something the bridge cannot read (e.g. a value outside the value parser's syntax)."""


@dataclass
class TlcMessage:
    """One ``-tool`` message; ``text`` excludes nested messages, which are in ``children``."""

    code: int
    severity: int
    text: str = ""
    children: list["TlcMessage"] = field(default_factory=list)
    received: float | None = None  # time.monotonic() when the message was complete (search timing)

    def full_text(self) -> str:
        """The message's own text followed by its nested messages' text."""
        parts = [self.text] + [child.full_text() for child in self.children]
        return "\n".join(part for part in parts if part)


@dataclass(frozen=True)
class Progress:
    """A progress report (message 2200) handed to ``run_tlc``'s callback."""

    distinct_states: int | None
    generated_states: int | None
    queue: int | None
    depth: int | None
    seconds: float


@dataclass(frozen=True)
class TraceState:
    """One state of a counterexample: the action that produced it and the variable values."""

    index: int  # 0-based position in the trace
    action: str | None  # operator name from TLC's ``<Name line … of module M>`` header; None: initial state
    location: str | None  # "line 7, col 9 to line 7, col 39 of module Lasso", None for initial states
    values: Mapping[str, Value]


@dataclass
class TlcResult:
    """Everything a TLC run established, typed."""

    status: Status
    kind: Kind | None
    property: str | None  # violated invariant/property; temporal: the cfg's single PROPERTY, if exactly one
    distinct_states: int | None
    generated_states: int | None
    depth: int | None
    seconds: float  # wall time of the whole run, JVM start included
    trace: list[TraceState]
    loop_index: int | None  # lasso: index into ``trace`` where the loop re-enters (stuttering: last state)
    message: str | None  # one line; file:line:col for parse errors
    exit_code: int | None  # None when the JVM was killed (timeout, cancellation)
    spec: Path
    config: Path | None
    tlc_version: str | None = None
    stuttering: bool = False
    search_seconds: float | None = None  # TLC's own search: initial states computed to the final statistics
    output: str = ""  # TLC's combined stdout/stderr, for debugging
    messages: list[TlcMessage] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    run_dir: Path | None = None  # the kept run directory (``keep_dir``), else None
    ended_after_report: bool = False  # the bridge ended the JVM once its report was complete (``run_tlc``)

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS


# --------------------------------------------------------------------------------------------
# The message stream
# --------------------------------------------------------------------------------------------

_MARKER = re.compile(r"@!@!@(?:STARTMSG (-?\d+):(\d+)|ENDMSG (-?\d+)) @!@!@")


class MessageStream:
    """Incremental parser: feed lines as TLC prints them; completed messages go to ``on_message``."""

    def __init__(self, on_message: Callable[[TlcMessage], None] | None = None) -> None:
        self.on_message = on_message
        self.messages: list[TlcMessage] = []  # every completed message, nested ones included, in order
        self.top_level: list[TlcMessage] = []
        self.plain: list[str] = []  # text outside any message (Java exceptions, SANY output)
        self.sany: list[str] = []  # plain text between 2220 and 2219
        self._stack: list[tuple[TlcMessage, list[str]]] = []
        self._in_sany = False

    def feed(self, line: str) -> None:
        pos = 0
        for match in _MARKER.finditer(line):
            self._text(line[pos:match.start()])
            pos = match.end()
            if match.group(1) is not None:
                code = int(match.group(1))
                if code == Code.SANY_END:
                    self._in_sany = False
                self._stack.append((TlcMessage(code, int(match.group(2))), []))
            else:
                self._end(int(match.group(3)))
        rest = line[pos:]
        if pos and not rest.strip():
            return
        self._text(rest)

    def _text(self, text: str) -> None:
        if not text:
            return
        if self._stack:
            self._stack[-1][1].append(text)
        else:
            self.plain.append(text)
            if self._in_sany:
                self.sany.append(text)

    def _end(self, code: int) -> None:
        if not any(open_msg.code == code for open_msg, _ in self._stack):
            log.warning("TLC closed message %d that was never opened", code)
            return
        while self._stack:
            message, parts = self._stack.pop()
            message.text = "".join(parts).strip("\n").rstrip()
            self._complete(message)
            if message.code == code:
                return

    def _complete(self, message: TlcMessage) -> None:
        message.received = time.monotonic()
        if self._stack:
            self._stack[-1][0].children.append(message)
        else:
            self.top_level.append(message)
        self.messages.append(message)
        if message.code == Code.SANY_START:
            self._in_sany = True
        if self.on_message is not None:
            self.on_message(message)

    def close(self) -> None:
        """Complete messages left open by a killed JVM."""
        while self._stack:
            message, parts = self._stack.pop()
            message.text = "".join(parts).strip("\n").rstrip()
            self._complete(message)


# --------------------------------------------------------------------------------------------
# Pieces of message text
# --------------------------------------------------------------------------------------------

_NUM = r"(-?[\d,]+)"
_GENERATED = re.compile(_NUM + r" states? generated")
_DISTINCT = re.compile(_NUM + r" distinct states? (?:found|generated)")
_QUEUE = re.compile(_NUM + r" states? left on queue")
_PROGRESS_DEPTH = re.compile(r"Progress\((\d+)\)")
_DEPTH = re.compile(r"search is (\d+)")
_STATE_HEADER = re.compile(r"(\d+): <(.*)>\s*$")
_ACTION_HEADER = re.compile(r"(\S+) (line \d+, col \d+ to line \d+, col \d+ of module \S+)$")
_VARIABLE = re.compile(r"^(?:/\\ )?([A-Za-z_][A-Za-z0-9_]*) = ", re.MULTILINE)


def _count(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    if match is None:
        return None
    number = int(match.group(1).replace(",", ""))
    return None if number < 0 else number


def parse_progress(text: str, seconds: float) -> Progress:
    """Counts from a progress or statistics message."""
    depth = _PROGRESS_DEPTH.search(text)
    return Progress(
        distinct_states=_count(_DISTINCT, text),
        generated_states=_count(_GENERATED, text),
        queue=_count(_QUEUE, text),
        depth=int(depth.group(1)) if depth else None,
        seconds=seconds,
    )


def parse_state_body(body: str) -> dict[str, Value]:
    """Variables of a printed state: ``/\\ x = 1`` lines (one-variable specs print ``x = 1``)."""
    matches = list(_VARIABLE.finditer(body))
    values: dict[str, Value] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(body)
        name = match.group(1)
        try:
            values[name] = parse_value(body[match.end():end])
        except TlaParseError as error:
            raise TlcOutputError(f"cannot decode variable {name} of a trace state: {error}") from None
    return values


_SIMULATION_STATE = re.compile(r"^STATE_\d+ ==[ \t]*$", re.MULTILINE)


def parse_simulation_trace(text: str) -> list[dict[str, Value]]:
    """The states of a ``-simulate file=…`` trace module (``STATE_1 == /\\ x = 0 …``), in order."""
    parts = _SIMULATION_STATE.split(text)[1:]
    if parts:
        parts[-1] = re.split(r"^====", parts[-1], flags=re.MULTILINE)[0]
    return [parse_state_body(part) for part in parts]


def without_stuttering(states: list[dict[str, Value]]) -> list[dict[str, Value]]:
    """``states`` without stuttering steps. A behaviour that reaches the spec's ``Idle`` (nothing left to do)
    stutters up to the simulation depth, and TLC writes each stutter as a copy of the state before it."""
    kept: list[dict[str, Value]] = []
    for state in states:
        if not kept or value_key(Record(state)) != value_key(Record(kept[-1])):
            kept.append(state)
    return kept


def parse_trace_state(message: TlcMessage, index: int) -> TraceState:
    """A 2217 message: ``N: <Action line … of module M>`` then the variable lines."""
    header, _, body = message.text.partition("\n")
    match = _STATE_HEADER.match(header.strip())
    if match is None:
        raise TlcOutputError(f"unexpected trace state header {header!r}")
    label = match.group(2)
    action: str | None
    location: str | None
    if label == "Initial predicate":
        action, location = None, None
    else:
        named = _ACTION_HEADER.match(label)
        action, location = (named.group(1), named.group(2)) if named else (label, None)
    return TraceState(index=index, action=action, location=location, values=parse_state_body(body))


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------
# SANY errors
# --------------------------------------------------------------------------------------------

_PARSING_FILE = re.compile(r"^Parsing file (.+)$", re.MULTILINE)
_AT_LINE = re.compile(r"at line (\d+), column (\d+)")
_SEMANTIC_LOCATION = re.compile(r"^line (\d+), col (\d+) to line \d+, col \d+ of module (\S+)\s*$", re.MULTILINE)
_ERROR_COUNT = re.compile(r"\*\*\* Errors: (\d+)")


def sany_message(sany_text: str, module_path: Callable[[str], str]) -> str | None:
    """One line for SANY's plain-text error report, with ``file:line:col`` first."""
    text = sany_text.replace("\r", "")
    if "***Parse Error***" in text or "Lexical error" in text:
        files = _PARSING_FILE.findall(text.split("***Parse Error***")[0].split("Lexical error")[0])
        module = Path(files[-1].strip()).stem if files else "?"
        start = text.find("***Parse Error***")
        start = text.find("Lexical error") if start < 0 else start
        detail = text[start:].split("Residual stack trace")[0].split("Fatal errors")[0]
        detail = _one_line(detail.replace("***Parse Error***", ""))
        where = _AT_LINE.search(text[start:])
        position = f":{where.group(1)}:{where.group(2)}" if where else ""
        return f"{module_path(module)}{position}: parse error: {detail}"
    location = _SEMANTIC_LOCATION.search(text)
    if location is not None:
        after = text[location.end():].strip().split("\n\n")[0]
        count = _ERROR_COUNT.search(text)
        more = ""
        if count and int(count.group(1)) > 1:
            more = f" (and {int(count.group(1)) - 1} more errors)"
        return (f"{module_path(location.group(3))}:{location.group(1)}:{location.group(2)}: "
                f"{_one_line(after)}{more}")
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("Cannot find source file", "Could not parse", "Unknown operator")):
            return line
    return None


# --------------------------------------------------------------------------------------------
# Config files
# --------------------------------------------------------------------------------------------

def cfg_properties(cfg_text: str) -> list[str]:
    """Names listed under PROPERTY/PROPERTIES in a TLC config file (comments removed)."""
    text = strip_comments(cfg_text)
    names: list[str] = []
    collecting = False
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_!]*|\S", text):
        if word in SECTION_KEYWORDS:
            collecting = word in ("PROPERTY", "PROPERTIES")
        elif collecting and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", word):
            names.append(word)
    return names


# --------------------------------------------------------------------------------------------
# Verdict
# --------------------------------------------------------------------------------------------

EXIT_NAMES = {
    0: "SUCCESS", 10: "VIOLATION_ASSUMPTION", 11: "VIOLATION_DEADLOCK", 12: "VIOLATION_SAFETY",
    13: "VIOLATION_LIVENESS", 14: "VIOLATION_ASSERT", 75: "FAILURE_SPEC_EVAL", 76: "FAILURE_SAFETY_EVAL",
    77: "FAILURE_LIVENESS_EVAL", 150: "ERROR_SPEC_PARSE", 151: "ERROR_CONFIG_PARSE",
    152: "ERROR_STATESPACE_TOO_LARGE", 153: "ERROR_SYSTEM", 255: "ERROR",
}
"""``tlc2.output.EC$ExitStatus`` of TLC 2.15."""

# Exit code -> (status, kinds the messages may name). The first kind is used when the messages name none.
_EXIT_VERDICTS: dict[int, tuple[Status, tuple[Kind | None, ...]]] = {
    0: (Status.PASS, (None,)),
    10: (Status.VIOLATION, (Kind.ASSUMPTION,)),
    11: (Status.VIOLATION, (Kind.DEADLOCK,)),
    12: (Status.VIOLATION, (Kind.INVARIANT, Kind.ACTION)),
    13: (Status.VIOLATION, (Kind.LIVENESS, Kind.ACTION)),
    14: (Status.VIOLATION, (Kind.ASSERT,)),
    75: (Status.ERROR, (Kind.RUNTIME, Kind.ASSERT)),
    76: (Status.ERROR, (Kind.RUNTIME,)),
    77: (Status.ERROR, (Kind.RUNTIME,)),
    150: (Status.ERROR, (Kind.PARSE,)),
    151: (Status.ERROR, (Kind.CONFIG,)),
    152: (Status.ERROR, (Kind.RUNTIME,)),
    153: (Status.ERROR, (Kind.RUNTIME,)),
}

_VIOLATION_CODES = {
    Code.INVARIANT_VIOLATED_INITIAL: Kind.INVARIANT,
    Code.INVARIANT_VIOLATED_BEHAVIOR: Kind.INVARIANT,
    Code.ACTION_PROPERTY_VIOLATED: Kind.ACTION,
    Code.DEADLOCK_REACHED: Kind.DEADLOCK,
    Code.TEMPORAL_PROPERTY_VIOLATED: Kind.LIVENESS,
    Code.ASSUMPTION_FALSE: Kind.ASSUMPTION,
    Code.ASSERT_FAILED: Kind.ASSERT,
}
_NAMED_PROPERTY = re.compile(r"^(?:Invariant|Action property) (\S+) is violated")
_EVAL_POSITION = re.compile(r"^0\. (Line \d+, column \d+ to line \d+, column \d+ in \S+)", re.MULTILINE)


@dataclass
class Interpretation:
    """The parts of a :class:`TlcResult` derived from TLC's output and exit code."""

    status: Status
    kind: Kind | None
    property: str | None = None
    message: str | None = None
    trace: list[TraceState] = field(default_factory=list)
    loop_index: int | None = None
    stuttering: bool = False
    distinct_states: int | None = None
    generated_states: int | None = None
    depth: int | None = None
    tlc_version: str | None = None
    search_seconds: float | None = None


_SEARCH_END = (Code.STATS, Code.SUCCESS, Code.SEARCH_DEPTH, Code.FINISHED)


_REPORTED_EXIT = {
    Code.INVARIANT_VIOLATED_INITIAL: 12, Code.INVARIANT_VIOLATED_BEHAVIOR: 12,
    Code.DEADLOCK_REACHED: 11, Code.TEMPORAL_PROPERTY_VIOLATED: 13,
}
"""Violation message -> the exit status TLC 2.15 gives once it has printed that violation's whole report
(``EC.ExitStatus``: VIOLATION_SAFETY, VIOLATION_DEADLOCK, VIOLATION_LIVENESS). Action properties, assumptions
and failed ``Assert``s are left out: their status is not one value (``_EXIT_VERDICTS``)."""


_TRACE_HEADERS = (Code.BEHAVIOR_UP_TO_THIS_POINT, Code.COUNTER_EXAMPLE, Code.BACK_TO_STATE)
"""Headers of a counterexample's trace, some printed as errors (severity 1): part of the violation's report."""


def reported_exit_status(stream: MessageStream) -> int | None:
    """The exit status of a run that has printed everything it will print, else None.

    0 after a clean finish (:func:`finished_cleanly`); after "Finished in" that follows exactly one invariant,
    deadlock or temporal-property violation, its trace, and no other error or TLC bug message, its status
    (``_REPORTED_EXIT``). What is left of such a JVM is its shutdown (see ``run_tlc``'s ``end_after_report``).
    """
    if finished_cleanly(stream):
        return 0
    messages = stream.messages
    if not messages or messages[-1].code != Code.FINISHED:
        return None
    violations = [m for m in messages if m.code in _VIOLATION_CODES]
    if len(violations) != 1 or violations[0].code not in _REPORTED_EXIT:
        return None
    if any(m.severity in (1, 2) and m is not violations[0] and m.code not in _TRACE_HEADERS
           for m in messages):  # 1 error, 2 TLC bug
        return None
    return _REPORTED_EXIT[violations[0].code]


def finished_cleanly(stream: MessageStream) -> bool:
    """Has TLC printed "Finished in" (2186) after "No error has been found" (2193), with no error and no
    violation message? Then every result is printed and the run can only exit with status 0: what is
    left of the JVM is its shutdown (see ``run_tlc``'s ``end_after_report``)."""
    messages = stream.messages
    if not messages or messages[-1].code != Code.FINISHED:
        return False
    return any(m.code == Code.SUCCESS for m in messages) and not any(
        m.severity in (1, 2) or m.code in _VIOLATION_CODES for m in messages)  # 1 error, 2 TLC bug


def search_seconds(stream: MessageStream) -> float | None:
    """Seconds of TLC's state-space search, JVM start and parsing excluded.

    Measured from the arrival of "Finished computing initial states" (2190) to the end of the search:
    the first violation message, where the search stops (what follows is TLC re-deriving and printing
    the counterexample, whose cost grows with the trace, not with the states searched); else the last
    of the end-of-search messages (statistics, success, depth, "Finished in"), which for a liveness
    model includes its liveness check; else the last message of a killed run. TLC prints its own
    timestamps at one-second resolution only, too coarse for small models.
    """
    start = next((m.received for m in stream.messages if m.code == Code.INIT_GENERATED), None)
    if start is None:
        return None
    found = [m.received for m in stream.messages if m.code in _VIOLATION_CODES and m.received is not None]
    ends = [m.received for m in stream.messages if m.code in _SEARCH_END and m.received is not None]
    if found:
        end = min(found)
    else:
        end = max(ends) if ends else max(m.received or start for m in stream.messages)
    return max(0.0, end - start)


def _message_kind(stream: MessageStream) -> tuple[Kind | None, TlcMessage | None]:
    """The first violation/error the messages report."""
    for message in stream.messages:
        if message.code in _VIOLATION_CODES:
            return _VIOLATION_CODES[message.code], message
    for message in stream.messages:
        if message.code == Code.PARSING_FAILED:
            return Kind.PARSE, message
    for message in stream.messages:
        if message.severity == 1 and message.code not in (Code.BEHAVIOR_UP_TO_THIS_POINT, Code.COUNTER_EXAMPLE,
                                                           Code.NESTED_EXPRESSION):
            return Kind.RUNTIME, message
    return None, None


def _trace(stream: MessageStream) -> tuple[list[TraceState], int | None, bool]:
    """The first counterexample: its states, the lasso loop index and whether it ends stuttering."""
    states: list[TraceState] = []
    loop_index: int | None = None
    stuttering = False
    started = False
    for message in stream.messages:
        if message.code in (Code.BEHAVIOR_UP_TO_THIS_POINT, Code.COUNTER_EXAMPLE):
            if started and states:
                break
            started = True
        elif message.code == Code.STATE:
            states.append(parse_trace_state(message, len(states)))
        elif message.code == Code.BACK_TO_STATE and states:
            header = _STATE_HEADER.match(message.text.strip().replace("Back to state: ", "", 1))
            if header is not None:
                loop_index = int(header.group(1)) - 1
            break
        elif message.code == Code.STUTTERING and states:
            loop_index, stuttering = len(states) - 1, True
            break
        elif message.code == Code.INVARIANT_VIOLATED_INITIAL and not states:
            _, _, body = message.text.partition("\n")
            if body.strip():
                states.append(TraceState(index=0, action=None, location=None, values=parse_state_body(body)))
    return states, loop_index, stuttering


def _runtime_message(message: TlcMessage) -> str:
    lines = [line for line in message.full_text().splitlines()
             if not line.startswith(("TLC threw an unexpected exception", "This was probably caused",
                                     "See the User Output", "The exception was a"))]
    return _one_line(" ".join(lines)).lstrip(": ")


def interpret(stream: MessageStream, exit_code: int | None, *, cfg_text: str | None,
              module_path: Callable[[str], str]) -> Interpretation:
    """Combine the exit code (the verdict) with the messages (the details)."""
    result = Interpretation(status=Status.ERROR, kind=None)
    for message in stream.messages:
        if message.code == Code.VERSION:
            result.tlc_version = message.text.strip()
        elif message.code in (Code.STATS, Code.SIMULATION_STATS, Code.PROGRESS, Code.SIMULATION_PROGRESS,
                              Code.INIT_GENERATED):
            counts = parse_progress(message.text, 0.0)
            if counts.distinct_states is not None and (message.code != Code.INIT_GENERATED
                                                       or result.distinct_states is None):
                result.distinct_states = counts.distinct_states
            if counts.generated_states is not None:
                result.generated_states = counts.generated_states
            if counts.depth is not None:
                result.depth = counts.depth  # Progress(N): the diameter so far; 2194 overrides it below
        elif message.code == Code.SEARCH_DEPTH:
            match = _DEPTH.search(message.text)
            if match:
                result.depth = int(match.group(1))
    result.trace, result.loop_index, result.stuttering = _trace(stream)
    result.search_seconds = search_seconds(stream)

    message_kind, culprit = _message_kind(stream)
    if exit_code is not None and exit_code in _EXIT_VERDICTS:
        status, allowed = _EXIT_VERDICTS[exit_code]
        generic = message_kind is None or (message_kind is Kind.RUNTIME and status is Status.ERROR)
        if generic or message_kind in allowed:
            result.status, result.kind = status, allowed[0] if generic else message_kind
        else:
            result.status, result.kind = Status.ERROR, Kind.RUNTIME
            result.message = (f"TLC exit code {exit_code} ({EXIT_NAMES[exit_code]}) disagrees with its messages "
                              f"({message_kind.value})")
            return result
        if result.kind is Kind.ASSERT and exit_code == 75:
            result.status = Status.VIOLATION  # TLC 2.15 exits 75, not 14, on a failed Assert
    else:
        result.status = Status.ERROR
        result.kind = message_kind if message_kind in (Kind.PARSE, Kind.CONFIG) else Kind.RUNTIME

    if result.kind in (Kind.INVARIANT, Kind.ACTION) and culprit is not None:
        named = _NAMED_PROPERTY.match(culprit.text)
        result.property = named.group(1) if named else None
    elif result.kind is Kind.LIVENESS and cfg_text is not None:
        names = cfg_properties(cfg_text)
        result.property = names[0] if len(names) == 1 else None

    result.message = _verdict_message(result, stream, culprit, exit_code, module_path)
    return result


def _verdict_message(result: Interpretation, stream: MessageStream, culprit: TlcMessage | None,
                     exit_code: int | None, module_path: Callable[[str], str]) -> str | None:
    if result.status is Status.PASS:
        return None
    if result.kind is Kind.PARSE:
        return sany_message("".join(stream.sany), module_path) or "parsing or semantic analysis failed"
    if result.kind is Kind.LIVENESS:
        named = f" ({result.property})" if result.property else " (TLC 2.15 does not name the property)"
        return "Temporal properties were violated" + named + "."
    if result.kind is Kind.ASSERT and culprit is not None:
        text = _one_line(culprit.text.replace(
            "The first argument of Assert evaluated to FALSE; the second argument was:", ""))
        where = next((_EVAL_POSITION.search(m.text) for m in stream.messages
                      if m.code == Code.NESTED_EXPRESSION and _EVAL_POSITION.search(m.text)), None)
        return f"Assert failed: {text}" + (f" at {where.group(1)}" if where else "")
    if result.kind is Kind.CONFIG or result.kind is Kind.RUNTIME:
        errors = [m for m in stream.top_level if m.severity == 1 and m.code not in
                  (Code.BEHAVIOR_UP_TO_THIS_POINT, Code.COUNTER_EXAMPLE)]
        if errors:
            return "; ".join(_runtime_message(m) for m in errors[:2])
        tail = [line.strip() for line in "".join(stream.plain).splitlines() if line.strip()]
        suffix = f": {tail[-1]}" if tail else ""
        return f"TLC exited with code {exit_code} ({EXIT_NAMES.get(exit_code or 0, 'unknown')}){suffix}"
    if culprit is not None:
        return _one_line(culprit.text.splitlines()[0]).rstrip(":") if culprit.text else None
    return f"TLC exited with code {exit_code} ({EXIT_NAMES.get(exit_code or 0, 'unknown')})"

