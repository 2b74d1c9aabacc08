"""End to end: random JSON filters over an index with random metadata. Every hit satisfies
the filter (checked with the pure-Python oracle), dense answers have exactly
min(k, matching) hits, BM25/hybrid never return a non-matching document, and the result
equals exact filtered search whenever the planner chose exact search."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heedrank.types import Document, Query
from heedrank.index.dense import DenseParams
from heedrank.index.filters import matches, parse_filter
from heedrank.index.hashing import HashingEncoder
from heedrank.index.planner import PlannerParams
from heedrank.index.store import Index
from heedrank.retriever.bm25 import BM25Retriever
from heedrank.retriever.dense import DenseRetriever
from heedrank.retriever.hybrid import HybridRetriever
from test_filters import filters  # random JSON filters over keys a, b, c.d

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")  # the recursive filter strategy


WORDS = [f"w{i}" for i in range(60)]
N = 1500


def _doc(i: int, rng: np.random.Generator) -> Document:
    meta: dict = {}
    for key in ("a", "b"):
        r = rng.random()
        if r < 0.3:
            meta[key] = ["x", "y", ""][int(rng.integers(3))]
        elif r < 0.6:
            meta[key] = int(rng.integers(-2, 3))
        elif r < 0.7:
            meta[key] = bool(rng.integers(2))
        elif r < 0.85:
            meta[key] = [int(v) for v in rng.integers(-2, 3, int(rng.integers(0, 3)))]
    if rng.random() < 0.5:
        meta["c"] = {"d": ["x", "y"][int(rng.integers(2))]}
    text = " ".join(rng.choice(WORDS, 12))
    return Document(f"d{i}", text, "", meta)


@pytest.fixture(scope="module")
def corpus() -> list[Document]:
    rng = np.random.default_rng(7)
    return [_doc(i, rng) for i in range(N)]


@pytest.fixture(scope="module", params=["flat", "hnsw", "ivf"])
def index(request, corpus) -> Index:
    return Index.from_documents(
        corpus, encoder=HashingEncoder(48),
        dense_params=DenseParams(request.param, hnsw_m=16, ef_construction=80, ef_search=64, nlist=16, nprobe=4),
        planner=PlannerParams(exact_max=50),  # so that the ANN path runs for most filters
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flt=st.deferred(lambda: filters), k=st.integers(1, 30), words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=5))
def test_random_filters(index, flt, k, words) -> None:
    f = parse_filter(flt)
    allowed = {d.doc_id for d in index.docstore.iter_documents() if matches(f, d.doc_id, d.metadata)}
    q = [Query("q", " ".join(words))]
    retriever = DenseRetriever.from_index(index)
    (dense,) = retriever.retrieve(q, k, filter=flt)
    assert len(dense) == min(k, len(allowed))  # never short, never padded
    assert set(dense.doc_ids) <= allowed and len(set(dense.doc_ids)) == len(dense)
    report = retriever.last_report
    if report.plan.strategy == "exact":
        (exact,) = DenseRetriever.from_index(index, strategy="exact").retrieve(q, k, filter=flt)
        assert dense == exact
    else:
        assert report.plan.strategy == "ann" and len(allowed) > 50 and index.dense.kind != "flat"
    for r in (BM25Retriever.from_index(index), HybridRetriever.from_index(index, depth=40)):
        (out,) = r.retrieve(q, k, filter=flt)
        assert set(out.doc_ids) <= allowed and len(out) <= min(k, len(allowed))
