"""heedrank.lab.long_queries: NFCorpus-style documents used as queries (tiny inline BEIR folder),
and heedrank.lab.candidates.beir_candidates never giving a query its own document."""

from __future__ import annotations

import json

from heedrank.data import load_beir_qrels, load_beir_queries
from heedrank.lab.candidates import beir_candidates
from heedrank.lab.long_queries import document_queries

DOCS = {
    "d1": ("Vitamin C", "scurvy vitamin c deficiency gums bleeding"),
    "d2": ("", "vitamin c citrus fruit scurvy sailors"),
    "d3": ("Citrus", "lemons limes vitamin c scurvy prevention"),
    "d4": ("Iron", "iron deficiency anemia spinach lentils"),
    "d5": ("", "anemia iron absorption vitamin c lentils"),
    "d6": ("Heme", "heme iron meat anemia absorption"),
    "d7": ("Broad", "diet health nutrition"),
}
QRELS = {"t-scurvy": ["d1", "d2", "d3"], "t-iron": ["d4", "d5", "d6"], "t-broad": list(DOCS)}


def _folder(tmp_path):  # type: ignore[no-untyped-def]
    d = tmp_path / "nf"
    (d / "qrels").mkdir(parents=True, exist_ok=True)
    (d / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": t, "text": x}) + "\n"
                                            for k, (t, x) in DOCS.items()))
    (d / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": q}) + "\n" for q in QRELS))
    (d / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{doc}\t1\n" for q, docs in QRELS.items() for doc in docs))
    return d


def test_a_document_of_a_narrow_topic_is_the_query_and_the_topic_its_relevant_documents(tmp_path) -> None:
    out = tmp_path / "long"
    record = document_queries(_folder(tmp_path), out, queries=10, min_relevant=2, max_relevant=4)
    queries, qrels = load_beir_queries(out), load_beir_qrels(out, "train")
    assert record["queries"] == len(queries) == 2  # the broad topic (7 documents) is no narrow one
    for qid, q in queries.items():
        topic = next(t for t, docs in QRELS.items() if qid in docs and t != "t-broad")
        title, text = DOCS[qid]
        assert q.text == " ".join(x for x in (title, text) if x)
        assert qrels[qid] == {d: 1 for d in QRELS[topic] if d != qid}
    assert (out / "corpus.jsonl").resolve() == (tmp_path / "nf" / "corpus.jsonl").resolve()
    assert json.loads((out / "source.json").read_text())["words"]["median"] >= 5
    # the same seed draws the same queries
    again = document_queries(_folder(tmp_path), tmp_path / "again", queries=10, min_relevant=2, max_relevant=4)
    assert load_beir_queries(tmp_path / "again").keys() == queries.keys() and again["queries"] == 2


def test_a_query_that_is_a_corpus_document_never_gets_itself_as_a_candidate(tmp_path) -> None:
    out = tmp_path / "long"
    document_queries(_folder(tmp_path), out, queries=10, min_relevant=2, max_relevant=4)
    queries, cands, scores, _ = beir_candidates(out, "train", queries=None, candidates=3, seed=0, index_dir=None,
                                                retriever="bm25")
    assert len(queries) == 2
    for q in queries:
        ids = [d.doc_id for d in cands[q.query_id]]
        assert q.query_id not in ids and len(ids) == 3 == len(scores[q.query_id])
