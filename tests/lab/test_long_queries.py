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


def test_a_passage_judged_3_is_the_query_and_its_topic_the_relevant_passages(tmp_path) -> None:
    from set_folders import write

    from heedrank.lab.long_queries import passage_queries

    d = tmp_path / "dl"
    write(d / "topics.dl21.txt", "1\tfirst topic\n2\tsecond topic\n")
    write(d / "qrels.dl21-passage.txt", "1 0 p1 3\n1 0 p2 3\n1 0 p3 2\n1 0 p4 0\n2 0 p5 3\n")
    hits = {"1": ["p1", "p2", "p3", "p4"], "2": ["p5", "p6"]}
    runs = [{"query": f"topic {q}", "hits": [{"content": f"passage {p} words", "qid": int(q), "docid": p, "rank": r + 1,
                                              "score": 10.0 - r} for r, p in enumerate(ps)]} for q, ps in hits.items()]
    write(d / "retrieve_results_BM25_dl21_top100.json", json.dumps(runs))
    out = tmp_path / "passages"
    record = passage_queries(d, out, per_topic=2, runs=("BM25",))
    queries, qrels = load_beir_queries(out), load_beir_qrels(out, "train")
    # topic 1: p1 and p2 (judged 3) are queries, each with the topic's other passages judged 2-3;
    # topic 2's only passage judged 3 has no other relevant one: no query
    assert sorted(queries) == ["p1", "p2"] and record["queries"] == 2 and record["pool"] == 6
    assert qrels["p1"] == {"p2": 3, "p3": 2} and qrels["p2"] == {"p1": 3, "p3": 2}
    assert queries["p1"].text == "passage p1 words"
    _, cands, _, _ = beir_candidates(out, "train", queries=None, candidates=3, seed=0, index_dir=None, retriever="bm25")
    assert all(q not in [doc.doc_id for doc in c] for q, c in cands.items())
