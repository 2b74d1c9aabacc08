"""One owner for whether a search is valid: the API route only maps the request onto
``Pipeline.validate``, so the API and the library give the same message for the same bad
value, and a filtered search parses its JSON filter exactly once."""

from __future__ import annotations

import pytest

from api_fakes import DOCS
from heedrank import registry
from heedrank.config import PipelineConfig, RerankerConfig, SearchLimits
from heedrank.errors import ValidationError
from heedrank.pipeline import Pipeline, SearchOptions
from heedrank.settings import Settings
from heedrank.types import Document, Query

BAD_FILTER = {"must": [{"key": "n", "range": {"between": [1, 3]}}]}

# (request body without the query, the same search as library options, a piece of the message)
CASES = [
    ({"top_k": 0}, SearchOptions(top_k=0), "top_k must be between 1 and 20, got 0"),
    ({"top_k": -3}, SearchOptions(top_k=-3), "top_k must be between 1 and 20"),
    ({"top_k": 21}, SearchOptions(top_k=21), "top_k must be between 1 and 20, got 21"),
    ({"rerank": {"method": "fake", "candidates": 9}}, SearchOptions(rerank="fake", candidates=9),
     "candidates must be between 1 and 8, got 9"),
    ({"retriever": "nope"}, SearchOptions(retriever="nope"), "unknown retriever 'nope'"),
    ({"rerank": {"method": "nope"}}, SearchOptions(rerank="nope", candidates=4), "unknown rerank method 'nope'"),
    ({"filter": BAD_FILTER}, SearchOptions(filter=BAD_FILTER), "filter.must[0].range: unknown operator 'between'"),
    ({"filter": {"must": "x"}}, SearchOptions(filter={"must": "x"}), "filter.must: expected a list of conditions"),
    ({"explain": True, "rerank": False}, SearchOptions(explain=True), "explain needs reranking"),
    # omitted "rerank": the service's method (the fake) with its default candidates
    ({"explain": True}, SearchOptions(rerank="fake", candidates=4, explain=True),
     "explain is not supported by the 'fake'"),
    ({"rerank": {"method": "fake", "heads": "qr"}},
     SearchOptions(rerank="fake", candidates=4, rerank_options={"heads": "qr"}),
     "options of the icr and blockrank rerankers"),
    ({"explain": True, "rerank": {"method": "fake"}}, SearchOptions(rerank="fake", candidates=4, explain=True),
     "explain is not supported by the 'fake' reranker"),
    ({"rerank": {"method": "fake", "fusion": 1.5}}, SearchOptions(rerank="fake", candidates=4, fusion=1.5),
     "fusion (rerank.fusion, --fusion) must be a number between 0 and 1, got 1.5"),
]


@pytest.mark.parametrize(("body", "options", "needle"), CASES, ids=[c[2][:40] for c in CASES])
def test_api_and_library_give_the_same_message(client, pipeline, body, options, needle):
    with pytest.raises(ValidationError) as err:
        pipeline.search(Query("q", "apples"), options)
    library = str(err.value)
    r = client.post("/search", json={"query": "apples", **body})
    assert r.status_code == 422, r.text
    assert r.json() == {"error": library, "error_type": "validation"}
    assert needle in library


def test_validate_returns_the_options_with_the_filter_parsed(pipeline):
    from heedrank.index.filters import BoolFilter

    flt = {"must": [{"key": "year", "range": {"gte": 2015}}]}
    checked = pipeline.validate(SearchOptions(filter=flt))
    assert isinstance(checked.filter, BoolFilter)
    assert pipeline.validate(checked) is checked  # already valid and parsed: nothing to do
    assert pipeline.validate(SearchOptions(filter={})).filter is None


def test_limits_come_from_the_settings():
    settings = Settings(index="unused", max_top_k=7, max_candidates=3)
    assert settings.search_limits() == SearchLimits(max_top_k=7, max_candidates=3)
    assert settings.pipeline_config().limits == settings.search_limits()
    assert PipelineConfig(index_dir="x", max_top_k=5).limits == SearchLimits(max_top_k=5)
    pipe = Pipeline(retrievers={}, docstore=None, limits=SearchLimits(max_top_k=7, max_candidates=3))  # type: ignore[arg-type]
    assert (pipe.max_top_k, pipe.max_candidates) == (7, 3)
    assert Pipeline(retrievers={}, docstore=None, max_candidates=5).limits == SearchLimits(max_candidates=5)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="max_top_k must be an integer >= 1"):
        SearchLimits(max_top_k=0)


# --------------------------------------------------------------------------- filter parses
FILTER_DOCS = [Document(d.doc_id, d.text, d.title, {"n": int(d.doc_id[1:]), "colour": "red" if i % 2 else "green"})
               for i, d in enumerate(DOCS)]
FILTER = {"must": [{"key": "colour", "match": {"value": "red"}}], "must_not": [{"key": "n", "range": {"gte": 9}}]}
RED_BELOW_9 = {d.doc_id for d in FILTER_DOCS if d.metadata["colour"] == "red" and d.metadata["n"] < 9}


@pytest.fixture
def parses(monkeypatch):
    """Counts the calls of the filter parser (``heedrank.index.filters.parse_filter``)."""
    import heedrank.index.filters as filters

    calls: list[object] = []
    real = filters.parse_filter

    def counting(obj, **kwargs):
        calls.append(obj)
        return real(obj, **kwargs)

    monkeypatch.setattr(filters, "parse_filter", counting)
    return calls


@pytest.fixture
def hybrid_pipeline(fake_reranker):
    from heedrank.index.hashing import HashingEncoder
    from heedrank.index.store import Index

    index = Index.from_documents(FILTER_DOCS, encoder=HashingEncoder(64))
    return Pipeline(
        retrievers={name: registry.build_retriever(name, index) for name in index.available_retrievers()},
        docstore=index.docstore,
        reranker_factory=lambda m: registry.build_reranker(RerankerConfig(method=m)),
        limits=SearchLimits(max_top_k=20, max_candidates=8),
    )


@pytest.mark.parametrize("rerank", ["none", "fake"])
def test_a_filtered_hybrid_search_parses_its_filter_once(hybrid_pipeline, parses, rerank):
    result = hybrid_pipeline.search(Query("q", "apples fruit"),
                                    SearchOptions(top_k=10, retriever="hybrid", rerank=rerank, candidates=4, filter=FILTER))
    assert parses == [FILTER]
    assert result.ranking.doc_ids and set(result.ranking.doc_ids) <= RED_BELOW_9
    assert set(result.first_stage.doc_ids) <= RED_BELOW_9


def test_a_filtered_hybrid_search_through_the_api_parses_its_filter_once(settings, hybrid_pipeline, parses):
    from fastapi.testclient import TestClient

    from heedrank.api.app import create_app

    with TestClient(create_app(settings, pipeline=hybrid_pipeline)) as client:
        assert client.app.state.runtime.wait_ready(10)
        r = client.post("/search", json={"query": "apples fruit", "top_k": 10, "retriever": "hybrid", "filter": FILTER,
                                         "rerank": {"method": "fake", "candidates": 4}})
        assert r.status_code == 200, r.text
        assert parses == [FILTER]
        ids = {h["doc_id"] for h in r.json()["results"]}
        assert ids and ids <= RED_BELOW_9


def test_retrievers_called_directly_parse_a_json_filter_once(hybrid_pipeline, parses):
    (ranking,) = hybrid_pipeline.retrievers["hybrid"].retrieve([Query("q", "apples")], 5, filter=FILTER)
    assert parses == [FILTER] and set(ranking.doc_ids) <= RED_BELOW_9
