"""A source of long queries built from NFCorpus train: documents used as queries.

None of the scorer's training sources has a long query (NFCorpus train at most 18 words, SciFact
claims 39, TREC DL and MS MARCO dev 22), while users send whole arguments or passages (the issue's
argument set: median 174 words). This source stands in for them, as ArguAna does in BEIR (Wachsmuth
et al. 2018; Thakur et al. 2021, BEIR section 3): the query is a whole text and the relevant
documents are those on the same narrow topic.

How it is built (:func:`document_queries`, seeded): the NFCorpus train queries with between
``min_relevant`` and ``max_relevant`` relevant documents (a narrow topic: one NutritionFacts page
cites them) are shuffled; from each, one relevant document not drawn before becomes a query (its
title and text, as the corpus holds them; query id = its document id); the page's other relevant
documents are its relevant ones (grade 1, as NFCorpus's train qrels). The query's own document is
not a candidate: :func:`heedrank.lab.candidates.beir_candidates` drops a hit whose id is the
query's (BEIR's ``ignore_identical_ids``). Its query lengths: median about 230 words.

The folder is BEIR's layout (``queries.jsonl``, ``qrels/train.tsv``, and a link to NFCorpus's
corpus file): its candidates come from the NFCorpus index (``heedrank lab dump --data OUT --split train --index
indexes/nfcorpus``).
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SPLIT = "train"
"""The split the folder's qrels are written as (NFCorpus's train qrels are its source)."""


def document_queries(data: Path, out: Path, *, queries: int = 200, seed: int = 0, min_relevant: int = 4,
                     max_relevant: int = 12) -> dict[str, Any]:
    """Write the long-query source (module docstring) as a BEIR folder ``out``.

    Args:
        data: The NFCorpus BEIR folder (``../shared/data/beir-nfcorpus``: corpus, queries, train qrels).
        out: The folder to write (``queries.jsonl``, ``qrels/train.tsv``, ``source.json``).
        queries: How many queries to draw (fewer when the train split holds fewer narrow topics).
        seed: Seed of the draw.
        min_relevant, max_relevant: Bounds on a train query's relevant documents (a narrow topic).

    Returns:
        ``source.json``'s record: ``{"queries", "words": {"median", "p10", "p90"}, ...}``.

    Raises:
        NotFoundError: a missing corpus or train qrels file (:mod:`heedrank.data`).
    """
    from heedrank.data import find_beir_corpus, load_beir_qrels

    qrels = load_beir_qrels(data, "train")
    narrow = sorted(q for q, judged in qrels.items()
                    if min_relevant <= sum(1 for g in judged.values() if g > 0) <= max_relevant)
    random.Random(seed).shuffle(narrow)
    docs = _corpus(find_beir_corpus(data))
    used: set[str] = set()
    rows: list[tuple[str, str, dict[str, int]]] = []
    for topic in narrow:
        relevant = sorted(d for d, g in qrels[topic].items() if g > 0 and d in docs)
        fresh = [d for d in relevant if d not in used]
        if not fresh:
            continue
        pick = random.Random(f"{seed}:{topic}").choice(fresh)
        used.add(pick)
        text = docs[pick]
        rows.append((pick, text, {d: 1 for d in relevant if d != pick}))
        if len(rows) == queries:
            break
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    corpus = find_beir_corpus(data).resolve()
    link = out / corpus.name  # the candidates' texts: NFCorpus's corpus (its index's cosines are read for it)
    if not link.exists():
        link.symlink_to(corpus)
    return _write_source(out, rows, {"data": str(data), "seed": seed, "min_relevant": min_relevant,
                                     "max_relevant": max_relevant})


def _corpus(path: Path) -> dict[str, str]:
    """``{doc_id: "title text"}`` of a BEIR ``corpus.jsonl[.gz]`` (the text a query of this source holds)."""
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    out = {}
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                out[str(row["_id"])] = " ".join(x for x in (row.get("title", ""), row.get("text", "")) if x).strip()
    return out


PASSAGE_RUNS = ("BM25", "BM25_RM3", "SPLADE_P_P_ENSEMBLE_DISTIL")
"""The TREC DL 2021 runs whose passages make the pool of :func:`passage_queries`."""


def passage_queries(data: Path, out: Path, *, per_topic: int = 2, seed: int = 0,
                    runs: tuple[str, ...] = PASSAGE_RUNS) -> dict[str, Any]:
    """Write a second long-query source, of web passages, as a BEIR folder ``out``: a check of the
    gate on a source it was not chosen on.

    From each judged TREC DL topic of ``data`` (``../shared/data/msmarco-trec-dl-2021-passage``),
    up to ``per_topic`` passages judged 3 (perfectly relevant) are drawn (seeded) and become
    queries (query id = the passage id); the topic's other passages judged 2 or 3 are their
    relevant ones (their grades kept). The corpus is the pool of every passage of ``runs``
    (``corpus.jsonl``), so a first stage searches it (``heedrank lab dump --data OUT --split train
    --retriever bm25`` builds its index); the query's own passage is never a candidate.

    Returns:
        ``source.json``'s record.
    """
    from heedrank.eval.sets import load_candidate_set

    pool: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for run in runs:
        cs = load_candidate_set(data, run)
        qrels = {q: dict(j) for q, j in cs.qrels.items()}
        pool.update({d: doc.text for d, doc in cs.docs.items()})
    rng = random.Random(seed)
    rows: list[tuple[str, str, dict[str, int]]] = []
    for topic in sorted(qrels):
        best = sorted(d for d, g in qrels[topic].items() if g >= 3 and d in pool)
        for pick in rng.sample(best, min(per_topic, len(best))):
            rel = {d: g for d, g in qrels[topic].items() if g >= 2 and d != pick}
            if rel:
                rows.append((pick, pool[pick], rel))
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for d in sorted(pool):
            f.write(json.dumps({"_id": d, "title": "", "text": pool[d]}) + "\n")
    return _write_source(out, rows, {"data": str(data), "seed": seed, "per_topic": per_topic, "runs": list(runs),
                                     "pool": len(pool)})


def _write_source(out: Path, rows: list[tuple[str, str, dict[str, int]]], record: dict[str, Any]) -> dict[str, Any]:
    """Write ``rows`` (``(query_id, text, {doc_id: grade})``) as ``out``'s ``queries.jsonl`` and
    ``qrels/train.tsv``, and ``source.json``: ``record`` with the queries' count and lengths in words."""
    with (out / "queries.jsonl").open("w", encoding="utf-8") as f:
        for qid, text, _ in rows:
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    with (out / "qrels" / f"{SPLIT}.tsv").open("w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for qid, _, rel in rows:
            f.writelines(f"{qid}\t{d}\t{g}\n" for d, g in sorted(rel.items()))
    words = sorted(len(text.split()) for _, text, _ in rows)
    lengths = ({"median": words[len(words) // 2], "p10": words[len(words) // 10], "p90": words[len(words) * 9 // 10]}
               if words else {})
    record = {**record, "queries": len(rows), "split": SPLIT, "words": lengths}
    (out / "source.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    logger.info("long-query source: %d queries, median %s words -> %s", len(rows), lengths.get("median"), out)
    return record
