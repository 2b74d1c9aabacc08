"""build_index + Index.open on a real 200-document slice of NFCorpus (real MiniLM embedder)."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from heedrank import registry
from heedrank.config import PipelineConfig
from heedrank.errors import IndexMismatchError, NotFoundError, ValidationError
from heedrank.pipeline import Pipeline, SearchOptions
from heedrank.types import Query
from heedrank.index.builder import build_index
from heedrank.index.encoder import model_sha256
from heedrank.index.store import Index

NFCORPUS = Path("/work/shared/data/beir-nfcorpus")
pytestmark = pytest.mark.skipif(not NFCORPUS.is_dir(), reason="NFCorpus not available")
N_DOCS = 200


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEEDRANK_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, cache_env) -> Path:
    """The first 200 NFCorpus documents as a BEIR folder."""
    d = tmp_path_factory.mktemp("nf200")
    with gzip.open(NFCORPUS / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(N_DOCS)]
    (d / "corpus.jsonl").write_text("".join(lines), encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def built(tmp_path_factory, corpus) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("indexes") / "nf200"
    params = build_index(corpus, out, show_progress=False)
    return out, params


def test_params_record_the_build(built, corpus) -> None:
    out, params = built
    assert sorted(p.name for p in out.iterdir()) == ["bm25", "docs.sqlite", "params.json", "vectors.faiss"]
    assert json.loads((out / "params.json").read_text()) == params
    assert params["format_version"] == 2 and params["num_docs"] == N_DOCS
    digest = hashlib.sha256((corpus / "corpus.jsonl").read_bytes()).hexdigest()
    assert params["corpus"]["sha256"] == digest
    assert params["bm25"]["k1"] == 0.9 and params["bm25"]["b"] == 0.4 and params["bm25"]["method"] == "lucene"
    assert params["bm25"]["tokenization"]["stemmer"] == "PyStemmer:english"
    emb = params["dense"]["embedder"]
    assert emb["name"] == "all-MiniLM-L6-v2" and emb["dim"] == 384 and emb["max_seq_length"] == 256
    assert emb["sha256"] == model_sha256(None)
    assert params["dense"]["index_type"] == "IndexIDMap2(IndexFlatIP)"
    assert params["dense"]["params"]["index_type"] == "flat" and params["dense"]["passages"] is None
    assert params["dense"]["planner"]["exact_max"] > 0 and params["bm25"]["avgdl"] > 0
    assert {"analyzer.json", "stats.json", "vids.npy"} <= {p.name for p in (out / "bm25").iterdir()}
    assert {"bm25s", "faiss-cpu", "sentence-transformers", "torch"} <= set(params["versions"])
    assert params["build_seconds"] > 0
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_open_and_retrieve_real(built) -> None:
    out, _ = built
    ix = registry.open_index(str(out))
    assert isinstance(ix, Index)
    assert ix.available_retrievers() == ["bm25", "dense", "hybrid"]
    assert len(ix.docstore) == N_DOCS and ix.doc_ids[0] == "MED-10"
    doc = ix.docstore.get_many(["MED-10"])["MED-10"]
    assert doc.title.startswith("Statin Use and Breast Cancer Survival")
    assert doc.metadata["url"] == "http://www.ncbi.nlm.nih.gov/pubmed/25329299"
    assert ix.describe()["dense"]["embedder"] == "all-MiniLM-L6-v2"

    # stored vectors are the encoder's embeddings of title + " " + text
    vec = ix.encoder.encode_documents([doc.content])
    np.testing.assert_allclose(vec[0], ix.dense.reconstruct(0), atol=1e-5)

    q = Query("q", "Statin use and breast cancer survival in Finland")
    for name in ix.available_retrievers():
        (ranking,) = registry.build_retriever(name, ix).retrieve([q], 10)
        assert ranking.doc_ids[0] == "MED-10", name
        assert len(ranking) == 10
    (dense,) = registry.build_retriever("dense", ix).retrieve([q], 1)
    assert 0.6 < dense.hits[0].score <= 1.0
    (bm25,) = registry.build_retriever("bm25", ix).retrieve([q], 500)
    assert 10 < len(bm25) < N_DOCS  # only documents sharing a token; k clamped, no padding
    ix.close()


def test_pipeline_over_built_index(built) -> None:
    out, _ = built
    pipe = Pipeline.from_config(PipelineConfig(index_dir=str(out)))
    res = pipe.search("statins and breast cancer survival", SearchOptions(top_k=3, retriever="bm25"))
    assert res.ranking.doc_ids[0] == "MED-10"
    assert all(h.document is not None for h in res.ranking.hits)


def test_embedder_mismatch(built, tmp_path: Path) -> None:
    out, _ = built
    fake = tmp_path / "other-model"
    fake.mkdir()
    (fake / "config.json").write_text("{}")
    (fake / "model.safetensors").write_bytes(b"not the same weights")
    with pytest.raises(IndexMismatchError, match="built with embedder 'all-MiniLM-L6-v2'"):
        Index.open(out, embedder=str(fake))
    Index.open(out, embedder="all-MiniLM-L6-v2").close()  # the same model by name is fine

    # the recorded model is unavailable and the packaged one differs: refuse too
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    params = json.loads((copy / "params.json").read_text())
    params["dense"]["embedder"].update(sha256="0" * 64, path=str(tmp_path / "gone"))
    (copy / "params.json").write_text(json.dumps(params))
    with pytest.raises(IndexMismatchError, match="not available here"):
        Index.open(copy)


def test_hnsw_passages_and_prefixes(tmp_path: Path, corpus) -> None:
    """HNSW + passage chunking + instruction prefixes are built, saved and reopened (real MiniLM)."""
    from heedrank.index.dense import DenseParams
    from heedrank.index.passages import PassageParams

    small = tmp_path / "nf40"
    small.mkdir()
    lines = (corpus / "corpus.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:40]
    (small / "corpus.jsonl").write_text("".join(lines), encoding="utf-8")
    out = tmp_path / "hnsw"
    params = build_index(
        small, out, show_progress=False, dense_params=DenseParams("hnsw", hnsw_m=8, ef_construction=40),
        passages=PassageParams(max_words=100, stride=80, max_passages=16), query_prefix="query: ",
        document_prefix="passage: ",
    )
    dense = params["dense"]
    assert dense["params"]["index_type"] == "hnsw" and dense["passages"]["bits"] == 4
    assert dense["num_vectors"] > 40 and dense["embedder"]["query_prefix"] == "query: "
    ix = Index.open(out)
    assert ix.dense.kind == "hnsw" and ix.group_bits == 4 and ix.encoder.query_prefix == "query: "
    q = Query("q", "Statin use and breast cancer survival in Finland")
    (ranking,) = registry.build_retriever("dense", ix).retrieve([q], 5, filter={"must_not": [{"has_id": ["MED-14"]}]})
    assert ranking.doc_ids[0] == "MED-10" and len(ranking) == 5 and "MED-14" not in ranking.doc_ids
    ix.close()


def test_refuses_to_overwrite(built, corpus) -> None:
    out, params = built
    before = (out / "params.json").read_text()
    with pytest.raises(ValidationError, match="not empty"):
        build_index(corpus, out, dense=False, show_progress=False)
    assert (out / "params.json").read_text() == before


def test_bm25_only_build_with_metadata_and_overwrite(tmp_path: Path, corpus) -> None:
    meta = tmp_path / "meta.jsonl"
    meta.write_text(
        json.dumps({"doc_id": "MED-10", "year": 2014, "url": "override"}) + "\n"
        + json.dumps({"doc_id": "NOT-IN-CORPUS", "year": 1}) + "\n"
    )
    out = tmp_path / "bm25only"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    params = build_index(corpus, out, dense=False, metadata=meta, overwrite=True, show_progress=False)
    assert not (out / "stale.txt").exists() and not (out / "vectors.faiss").exists()
    assert params["dense"] is None and params["metadata_file"]["matched_docs"] == 1
    ix = Index.open(out, embedder="ignored-without-dense")
    assert ix.available_retrievers() == ["bm25"]
    assert dict(ix.docstore.get_many(["MED-10"])["MED-10"].metadata) == {"url": "override", "year": 2014}
    assert dict(ix.docstore.get_many(["MED-1000"])["MED-1000"].metadata) == {
        "url": "http://www.ncbi.nlm.nih.gov/pubmed/23151181"
    }
    with pytest.raises(NotFoundError, match="without dense vectors"):
        ix.encoder
    with pytest.raises(ValidationError, match="no dense vectors"):
        registry.build_retriever("dense", ix)
    ix.close()


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "dup"
    src.mkdir()
    row = json.dumps({"_id": "a", "title": "", "text": "same id twice"})
    (src / "corpus.jsonl").write_text(row + "\n" + row + "\n")
    out = tmp_path / "out" / "idx"
    with pytest.raises(ValidationError, match="duplicate"):
        build_index(src, out, dense=False, show_progress=False)
    assert not out.exists() and list((tmp_path / "out").iterdir()) == []


def test_missing_and_corrupt_index(tmp_path: Path, built) -> None:
    with pytest.raises(NotFoundError, match="heedrank index build"):
        Index.open(tmp_path / "nowhere")
    out, _ = built
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    shutil.rmtree(broken / "bm25")
    with pytest.raises(NotFoundError, match="incomplete or corrupt"):
        Index.open(broken)
    shutil.rmtree(broken)
    shutil.copytree(out, broken)
    (broken / "params.json").write_text("{not json")
    with pytest.raises(NotFoundError, match="corrupt"):
        Index.open(broken)
    params = json.loads((out / "params.json").read_text())
    params["num_docs"] = 999
    params["format_version"] = 1  # format 1 is checked strictly; format 2 catches up from SQLite
    (broken / "params.json").write_text(json.dumps(params))
    with pytest.raises(NotFoundError, match="counts disagree"):
        Index.open(broken)
    params["format_version"] = 99
    (broken / "params.json").write_text(json.dumps(params))
    with pytest.raises(IndexMismatchError, match="format version 99"):
        Index.open(broken)
