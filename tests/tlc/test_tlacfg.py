"""The shared reading of TLC cfg text: comments, section keywords, sections left out."""
from __future__ import annotations

from deferdump.tools.tlc.cfg import strip_comments, without_sections
from deferdump.tools.tlc.output import cfg_properties

CFG = """\\* a model
CONSTANTS
    N = 3   \\* three
    (* a block
       comment *) M = {1, 2}
SYMMETRY Perms
INVARIANT TypeInv
PROPERTIES
    LiveProp
VIEW View
"""


def test_strip_comments_keeps_lines_and_drops_both_comment_forms() -> None:
    text = strip_comments(CFG)
    assert "three" not in text and "a block" not in text and "a model" not in text
    assert "N = 3" in text and "M = {1, 2}" in text


def test_without_sections_drops_whole_sections_only() -> None:
    text = without_sections(CFG, {"SYMMETRY", "PROPERTIES", "VIEW"})
    assert "Perms" not in text and "LiveProp" not in text and "View" not in text
    assert "INVARIANT TypeInv" in text and "N = 3" in text


def test_cfg_properties_reads_a_multiline_section() -> None:
    assert cfg_properties(CFG) == ["LiveProp"]
