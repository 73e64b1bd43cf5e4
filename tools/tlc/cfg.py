"""TLC config (.cfg) text: comments, section keywords, and copies with sections left out.

Several tools run TLC on a variant of a model's cfg (trace generation drops SYMMETRY/VIEW/PROPERTY,
explain's simulation drops PROPERTY/SYMMETRY, the bridge names the PROPERTY of a temporal violation);
they share this one reading of the format so a new keyword is a one-place change.
"""
from __future__ import annotations

import re
from collections.abc import Collection

SECTION_KEYWORDS = frozenset({
    "CONSTANT", "CONSTANTS", "INIT", "NEXT", "SPECIFICATION", "INVARIANT", "INVARIANTS", "PROPERTY",
    "PROPERTIES", "SYMMETRY", "CONSTRAINT", "CONSTRAINTS", "ACTION_CONSTRAINT", "ACTION_CONSTRAINTS", "VIEW",
    "CHECK_DEADLOCK", "POSTCONDITION", "ALIAS", "TYPE", "TYPE_CONSTRAINT",
})

# A line that opens a section: the keyword, then whatever follows it on the same line.
SECTION_LINE = re.compile(
    r"^\s*(" + "|".join(sorted(SECTION_KEYWORDS, key=len, reverse=True)) + r")\b(.*)$"
)


def strip_comments(cfg_text: str) -> str:
    """The cfg with ``(* … *)`` block comments and ``\\*`` line comments removed (lines kept)."""
    text = re.sub(r"\(\*.*?\*\)", " ", cfg_text, flags=re.DOTALL)
    return re.sub(r"\\\*.*$", "", text, flags=re.MULTILINE)


def without_sections(cfg_text: str, dropped: Collection[str]) -> str:
    """A copy of the cfg (comments removed) without the sections whose keyword is in ``dropped``."""
    kept: list[str] = []
    dropping = False
    for line in strip_comments(cfg_text).splitlines():
        section = SECTION_LINE.match(line)
        if section:
            dropping = section.group(1) in dropped
        if not dropping:
            kept.append(line)
    return "\n".join(kept) + "\n"
