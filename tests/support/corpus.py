"""The `deferdump mro` corpus (tests/fixtures/mro/corpus/, index.json) and the share of it `make test` judges.

Judging the whole corpus takes about 4,000 TLC runs (each class in every case, each benign reading of what it
cannot read: about a second each on a quiet core), more than an hour of `make test` on 2 cores, so the corpus
tests are split: `make test` judges the sample below, `make test-corpus` (the `corpus` marker) judges every
other file, with the same checks. The sample is a fixed rule, not a choice of files that pass: every
hand-written file (one per style #32 names) and each blind file whose name's SHA-256 is a multiple of 12 (about
one in twelve; a file added later never moves another between the sample and the rest)."""
from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from support import FIXTURES

__all__ = ["CORPUS", "INDEX", "SAMPLE", "corpus_params"]

CORPUS = FIXTURES / "mro" / "corpus"
INDEX: dict[str, dict[str, dict[str, Any]]] = json.loads((CORPUS / "index.json").read_text(encoding="utf-8"))


def _sampled(name: str) -> bool:
    return not name.startswith("blind_") or int(hashlib.sha256(name.encode()).hexdigest(), 16) % 12 == 0


SAMPLE: frozenset[str] = frozenset(name for name in INDEX if _sampled(name))
"""The corpus files `make test` judges; the others carry the `corpus` marker."""


def corpus_params(names: list[str]) -> list[Any]:
    """``names`` as pytest parameters, the ones outside :data:`SAMPLE` marked ``corpus``."""
    return [pytest.param(name, id=name, marks=() if name in SAMPLE else pytest.mark.corpus) for name in names]
