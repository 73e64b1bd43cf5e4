"""The corpus's other half (tests/mro/test_mro_corpus.py judges every other file): a second test file so that
pytest-xdist's --dist loadfile hands the two halves to two workers."""
from __future__ import annotations

import pytest

from deferdump.tools.mro.judge import ModelRunner
from deferdump.tools.mro.tla import ModelBounds
from support.corpus import INDEX, SAMPLE, corpus_params
from test_mro_corpus import FIRST_HALF, check_recorded_verdict

pytestmark = pytest.mark.slow  # long file: tests/conftest.py starts it early

SECOND_HALF = sorted(SAMPLE)[1::2] + sorted(set(INDEX) - SAMPLE)[1::2]


def test_the_halves_cover_the_corpus_once() -> None:
    assert sorted(FIRST_HALF + SECOND_HALF) == sorted(INDEX) and not set(FIRST_HALF) & set(SECOND_HALF)


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(ModelBounds(), timeout=300)


@pytest.mark.parametrize("name", corpus_params(SECOND_HALF))
def test_corpus_connector_gets_its_recorded_verdict(runner: ModelRunner, name: str) -> None:
    check_recorded_verdict(runner, name)
