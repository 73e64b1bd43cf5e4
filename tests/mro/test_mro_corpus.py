"""`deferdump mro` on a corpus of realistic connectors (tests/fixtures/mro/corpus/, index.json): each class
gets the verdict recorded for it, which is never the opposite of what a careful reader concludes (`truth`);
`unknown` is allowed only where the index says why reading cannot decide. Where the index records the truth of
single cases (`"cases"`: one KV-cache group, hybrid, MLA, two layers), no case is judged the opposite either.
The `blind_*` files were written against vLLM's connector API, not against the judge's rules. `make test` judges
the sample of tests/support/corpus.py; `make test-corpus` judges the rest (marker `corpus`)."""
from __future__ import annotations

import pytest

from deferdump.tools.mro.judge import ModelRunner, judge_files
from deferdump.tools.mro.tla import ModelBounds
from support.corpus import CORPUS, INDEX, SAMPLE, corpus_params

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(ModelBounds(), timeout=300)


def test_the_index_covers_every_corpus_file_and_no_verdict_contradicts_the_truth() -> None:
    assert sorted(INDEX) == sorted(p.name for p in CORPUS.glob("*.py"))
    for entries in INDEX.values():
        for entry in entries.values():
            assert entry["verdict"] in ("safe", "unsafe", "unknown") and entry["truth"] in ("safe", "unsafe")
            assert entry["verdict"] in (entry["truth"], "unknown") and entry["why"]
            cases = entry.get("cases", {})
            assert set(cases) <= {"single", "multi", "hybrid", "mla", "layerwise"}
            assert set(cases.values()) <= {"safe", "unsafe"}
            assert ("unsafe" in cases.values()) <= (entry["truth"] == "unsafe"), entry
            # a case judged against its key, recorded open (docs/mro.md, "Open cases") rather than left out
            for case, record in entry.get("open", {}).items():
                assert case not in cases and case in {"single", "multi", "hybrid", "mla", "layerwise"}, entry
                assert record["truth"] != record["judged"] and record["truth"] == entry["truth"] == "unsafe", entry
                assert entry["open_why"].startswith("open ("), entry


#: Every other file of the sample and of the rest; test_mro_corpus_second_half.py judges the others, so that two
#: workers share the corpus (pytest-xdist's --dist loadfile keeps a file's tests on one worker).
FIRST_HALF = sorted(SAMPLE)[::2] + sorted(set(INDEX) - SAMPLE)[::2]


def test_the_sample_make_test_judges_is_a_share_of_each_kind_of_file() -> None:
    """`make test` judges the sample (tests/support/corpus.py), `make test-corpus` the rest: every hand-written
    file and blind files from across the corpus are in it, and most of the corpus is not."""
    assert SAMPLE <= set(INDEX)
    assert {name for name in INDEX if not name.startswith("blind_")} <= SAMPLE
    blind = [name for name in SAMPLE if name.startswith("blind_")]
    assert len(blind) >= 10 and len(SAMPLE) < len(INDEX) / 4


@pytest.mark.parametrize("name", corpus_params(FIRST_HALF))
def test_corpus_connector_gets_its_recorded_verdict(runner: ModelRunner, name: str) -> None:
    check_recorded_verdict(runner, name)


def check_recorded_verdict(runner: ModelRunner, name: str) -> None:
    """Judge the corpus file ``name`` and compare with its index entry (class verdicts, cases' truths)."""
    report = judge_files([CORPUS / name], runner=runner)
    expected = INDEX[name]
    assert set(report.connectors) == set(expected)
    for cls, judgement in report.connectors.items():
        entry = expected[cls]
        got = (judgement.verdict, judgement.violated, judgement.context and judgement.context.key)
        assert judgement.verdict == entry["verdict"], (cls, got, judgement.reasons)
        if "case" in entry:  # the case the verdict comes from
            assert judgement.context is not None and judgement.context.key == entry["case"], (cls, got)
        if "violated" in entry:
            assert judgement.violated == entry["violated"], (cls, got)
        if judgement.verdict == "unknown":
            assert judgement.reasons, cls
            assert "reason" not in entry or any(entry["reason"] in r for r in judgement.reasons), judgement.reasons
        if judgement.verdict != "safe":  # a violated property comes with its counterexample
            assert judgement.deciding is not None
            assert (judgement.deciding.counterexample is not None) == (judgement.violated is not None), cls
        if judgement.verdict == "unsafe":
            assert judgement.violated is not None, cls
        for case in judgement.judgements:  # a case's own truth, where the index records it
            truth = entry.get("cases", {}).get(case.context.key.split("[")[0])
            assert truth is None or case.verdict in (truth, "unknown"), (cls, case.context.key, case.verdict)
            opened = entry.get("open", {}).get(case.context.key.split("[")[0])
            # an open case still judged as recorded: a change that decides it must also update the index
            assert opened is None or case.verdict == opened["judged"], (cls, case.context.key, case.verdict, opened)
