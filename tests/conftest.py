"""Shared fixtures: paths of the real evaluation data and the packaged LM, loaded once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(os.environ.get("HEEDRANK_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
NFCORPUS = SHARED_DATA / "beir-nfcorpus"
DL19 = SHARED_DATA / "msmarco-trec-dl-2019-passage"


@pytest.fixture(scope="session")
def nfcorpus_dir() -> Path:
    if not (NFCORPUS / "corpus.jsonl.gz").exists():
        pytest.skip(f"real data not found at {NFCORPUS} (set HEEDRANK_SHARED_DATA)")
    return NFCORPUS


@pytest.fixture(scope="session")
def nfcorpus_head(nfcorpus_dir):
    """The first 40 NFCorpus documents (corpus file order), as :class:`heedrank.types.Document`."""
    import gzip
    import json

    from heedrank.types import Document

    docs = []
    with gzip.open(nfcorpus_dir / "corpus.jsonl.gz", "rt") as f:
        for line in f:
            d = json.loads(line)
            docs.append(Document(d["_id"], d["text"], d.get("title", "")))
            if len(docs) == 40:
                break
    return docs


@pytest.fixture(scope="session")
def dl19_dir() -> Path:
    if not (DL19 / "qrels.dl19-passage.txt").exists():
        pytest.skip(f"real data not found at {DL19} (set HEEDRANK_SHARED_DATA)")
    return DL19


@pytest.fixture(scope="session")
def default_lm():
    """The packaged SmolLM2-135M-Instruct, loaded once per test session."""
    from heedrank.reranker.lm import load_lm

    return load_lm()
