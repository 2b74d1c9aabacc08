"""/rerank's results come sorted by ``relevance_score``, best first, whatever the list, the
fusion (the default position prior, none, a weight), the reranker's calibration or scale; and
identical texts share one score. Property tests over random lists with the fake reranker
(``1 / len(text)``, tests/api/api_fakes.py)."""

from __future__ import annotations

from contextlib import contextmanager

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api_fakes import FakeReranker

TEXTS = st.lists(st.text(alphabet="abc de", min_size=1, max_size=40).filter(str.strip), min_size=1, max_size=14)
FUSION = st.sampled_from(["default", "none", 0.3])
KIND = st.sampled_from(["plain", "scaled", "calibrated"])


@contextmanager
def _as(kind: str):
    """The fake with its own scores as they are, a ``score_scale``, or a calibration."""
    from heedrank.calibration import Calibration, PlattMap

    if kind == "scaled":
        FakeReranker.score_scale = 0.05
    elif kind == "calibrated":
        plat = PlattMap((2.0, -0.5, 0.0, 0.0), 0.0, 0.5)
        FakeReranker.calibration = Calibration(0.3, {"none": plat, "rank": plat})
    try:
        yield
    finally:
        for name in ("score_scale", "calibration"):
            if name in vars(FakeReranker):
                delattr(FakeReranker, name)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=TEXTS, fusion=FUSION, kind=KIND, top_n=st.none() | st.integers(1, 5))
def test_rerank_results_are_sorted_by_relevance_score(client, texts, fusion, kind, top_n):
    body = {"query": "apples", "documents": texts, "fusion": fusion}
    if top_n is not None:
        body["top_n"] = top_n
    with _as(kind):
        r = client.post("/rerank", json=body)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    assert len(results) == min(len(texts), top_n or len(texts))
    assert sorted(x["index"] for x in results) == sorted(set(x["index"] for x in results))
    by_text: dict[str, float] = {}
    for x in results:  # identical texts share one score
        assert by_text.setdefault(texts[x["index"]], x["relevance_score"]) == x["relevance_score"]
