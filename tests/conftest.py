"""Shared fixtures: paths of the real evaluation data and the packaged LM, loaded once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_data import read_nfcorpus

SHARED_DATA = Path(os.environ.get("HEEDRANK_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
NFCORPUS = SHARED_DATA / "beir-nfcorpus"
DL19 = SHARED_DATA / "msmarco-trec-dl-2019-passage"
DEV600 = SHARED_DATA / "msmarco-passage-dev-600"
NOVELEVAL = SHARED_DATA / "noveleval"

KEPT_CACHES = ("models", "indexes")
"""Cache subfolders the tests share with the user's cache (created there when missing): the
converted packaged LMs and the NFCorpus indexes (minutes to build). ``cards`` and ``bench`` are
shared only when the user's cache has them; ``datasets`` never is."""


@pytest.fixture(scope="session", autouse=True)
def heedrank_cache_dir(tmp_path_factory) -> Iterator[Path]:
    """``$HEEDRANK_CACHE_DIR`` for the session: a temporary folder, so the Arrow copies that
    :func:`heedrank.data.load_beir_corpus` makes under ``<cache>/datasets`` (one per corpus
    path and mtime, each with an empty ``*.lock`` beside it; every temporary corpus makes a
    new one) are not left in the user's cache. Its ``models`` and ``indexes`` (and ``cards``
    and ``bench`` where the user has them) are links to the user's cache, so converted models
    and built indexes stay warm; the NFCorpus Arrow copy is rebuilt once per session (about
    1 s). Subprocesses inherit the variable; a test's own ``monkeypatch.setenv`` overrides it."""
    from heedrank.files import cache_dir

    user = cache_dir()
    root = tmp_path_factory.mktemp("heedrank-cache")
    for name in (*KEPT_CACHES, "cards", "bench"):
        if name in KEPT_CACHES:
            (user / name).mkdir(parents=True, exist_ok=True)
        if (user / name).is_dir():
            (root / name).symlink_to(user / name, target_is_directory=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("HEEDRANK_CACHE_DIR", str(root))
    yield root
    mp.undo()


@pytest.fixture(scope="session")
def nfcorpus_dir() -> Path:
    if not (NFCORPUS / "corpus.jsonl.gz").exists():
        pytest.skip(f"real data not found at {NFCORPUS} (set HEEDRANK_SHARED_DATA)")
    return NFCORPUS


@pytest.fixture(scope="session")
def nfcorpus_head(nfcorpus_dir):
    """The first 40 NFCorpus documents (corpus file order), as :class:`heedrank.types.Document`."""
    return read_nfcorpus(nfcorpus_dir, 40)


@pytest.fixture(scope="session")
def dl19_dir() -> Path:
    if not (DL19 / "qrels.dl19-passage.txt").exists():
        pytest.skip(f"real data not found at {DL19} (set HEEDRANK_SHARED_DATA)")
    return DL19


@pytest.fixture(scope="session")
def dev600_dir() -> Path:
    if not (DEV600 / "qrels.dev600.txt").exists():
        pytest.skip(f"real data not found at {DEV600} (set HEEDRANK_SHARED_DATA)")
    return DEV600


@pytest.fixture(scope="session")
def noveleval_dir() -> Path:
    if not (NOVELEVAL / "corpus.tsv").exists():
        pytest.skip(f"real data not found at {NOVELEVAL} (set HEEDRANK_SHARED_DATA)")
    return NOVELEVAL


@pytest.fixture(scope="session")
def default_lm():
    """The packaged SmolLM2-135M-Instruct, loaded once per test session."""
    from heedrank.reranker.lm import load_lm

    return load_lm()


@pytest.fixture(scope="session")
def nfcorpus_train_slice(nfcorpus_dir):
    """``(queries, candidates, first-stage scores, qrels)``: five NFCorpus train queries with
    at least two relevant documents, each with two of them and one shared negative as
    candidates (scores 3, 2, 1)."""
    from heedrank.data import iter_beir_documents, load_beir_qrels, load_beir_queries

    qrels = load_beir_qrels(nfcorpus_dir, "train")
    queries = load_beir_queries(nfcorpus_dir)
    qids = [q for q in sorted(qrels) if q in queries and sum(g > 0 for g in qrels[q].values()) >= 2][:5]
    wanted = {d for q in qids for d in sorted(qrels[q])[:2]}
    docs = {}
    for doc in iter_beir_documents(nfcorpus_dir):
        if doc.doc_id in wanted or len(docs) < 3:
            docs[doc.doc_id] = doc
    cands, scores = {}, {}
    negatives = [d for d in list(docs)[:3] if all(d not in qrels[q] for q in qids)]
    for q in qids:
        pos = [docs[d] for d in sorted(qrels[q])[:2] if d in docs]
        cands[q] = pos + [docs[negatives[0]]]
        scores[q] = [3.0, 2.0, 1.0]
    return [queries[q] for q in qids], cands, scores, qrels


@pytest.fixture(scope="session")
def icr_slice_dump(tmp_path_factory, nfcorpus_train_slice) -> Path:
    """An ICR attention dump (:func:`heedrank.lab.head_study.dump_attention`, candidates shuffled,
    24 tokens per document) of :func:`nfcorpus_train_slice`, written once per session."""
    from heedrank.config import RerankerConfig
    from heedrank.lab.head_study import dump_attention

    qs, cands, scores, qrels = nfcorpus_train_slice
    return dump_attention(tmp_path_factory.mktemp("icr") / "dump", qs, cands, scores, qrels,
                          reranker_config=RerankerConfig(max_doc_tokens=24), shuffle=True, show_progress=False)
