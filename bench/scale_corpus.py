"""A scale corpus any clone can make: N documents, deterministic for a seed, with NFCorpus's
queries and qrels unchanged, so NFCorpus test stays the quality probe at every N.

Written in BEIR layout under ``--out`` (``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv``,
``qrels/dev.tsv``, and ``manifest.json`` with the counts, the seed and the corpus's sha256), in
this order:

1. **NFCorpus** (3,633 documents): ids, titles and texts as shipped.
2. **The other real documents** in ``--data`` (read ``SOURCES.md`` there): SciFact's corpus and
   the passages of the TREC DL 2019 / 2021 / 2022 first-stage runs (about 43k; ids prefixed
   ``scifact-`` / ``msmarco-`` so none can collide with NFCorpus's), in a seeded order, as many
   as fit below N.
3. **Distractors** up to N (ids ``x0000000``, ...): each a seeded draw of whole sentences from
   the other real documents (SciFact's, biomedical like NFCorpus, and the MS MARCO passages; not
   NFCorpus's own: with them in the pool every NFCorpus sentence recurred in about 18 of 1M
   distractors, near-copies of the judged documents that no real corpus holds, and BM25's NFCorpus
   test nDCG@10 fell from 32.0 to 13.3) until it reaches a length drawn from the real length distribution:
   the TREC DL passages' word counts (``--lengths passage``, the default: most large corpora are
   passages) or every real document's (``--lengths document``). No distractor shares a sentence
   order with a real document except by chance, and NFCorpus's qrels do not name them, so they
   can only cost nDCG@10 (BEIR scores an unjudged document as non-relevant).

Beside it, ``metadata.jsonl`` (for ``heedrank index build --metadata``): each document's
``shard`` (its row number mod 100: a filter on one shard keeps 1% of the corpus) and ``bucket``
(mod 10,000: 0.01%), for filtered search at N. It does not enter ``corpus.jsonl``, whose bytes
(and sha256) stay what they were.

Streams: the sentence pool (about 0.5M sentences, under 100 MB) is the only thing held; the
corpus is written line by line to a temporary file, renamed when complete (a killed run leaves
nothing half-written to read; run it again).

    python bench/scale_corpus.py --n 100000 --out runs/scale/100k

Prints one table: documents per source, mean words, seconds, bytes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.data import iter_beir_documents, load_run_json

SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
"""Where a text splits into sentences: after ``.``, ``!`` or ``?`` and before a capital, digit or quote."""

DL_YEARS = ("msmarco-trec-dl-2019-passage", "msmarco-trec-dl-2021-passage", "msmarco-trec-dl-2022-passage")


def sentences(text: str) -> list[str]:
    """The sentences of ``text`` (:data:`SENTENCE`), stripped, empty ones dropped."""
    return [s.strip() for s in SENTENCE.split(text) if s.strip()]


def dl_passages(data: Path) -> dict[str, str]:
    """``{msmarco-<docid>: text}`` of every passage in the TREC DL first-stage runs with text
    (``retrieve_results_*.json.gz``), first text seen per id, files in sorted order."""
    out: dict[str, str] = {}
    for year in DL_YEARS:
        for path in sorted((data / year).glob("retrieve_results_*.json*")):
            _, docs, _ = load_run_json(path)
            for did, doc in docs.items():
                out.setdefault(f"msmarco-{did}", doc.text)
    return out


def real_others(data: Path) -> tuple[list[tuple[str, str, str]], list[int]]:
    """The real documents besides NFCorpus as ``(id, title, text)`` sorted by id, and the TREC
    DL passages' word counts (the ``passage`` length distribution)."""
    rows = [(f"scifact-{d.doc_id}", d.title, d.text) for d in iter_beir_documents(data / "beir-scifact")]
    passages = dl_passages(data)
    rows += [(did, "", text) for did, text in passages.items()]
    return sorted(rows), [len(t.split()) for t in passages.values()]


def distractors(rng: np.random.Generator, pool: list[str], pool_words: np.ndarray, lengths: np.ndarray,
                n: int) -> Iterator[str]:
    """``n`` texts, each whole sentences drawn (with replacement) from ``pool`` until its word
    count reaches a length drawn from ``lengths``."""
    for _ in range(n):
        target = int(lengths[rng.integers(len(lengths))])
        parts: list[str] = []
        words = 0
        while words < target:
            i = int(rng.integers(len(pool)))
            parts.append(pool[i])
            words += int(pool_words[i])
        yield " ".join(parts)


def write_corpus(out: Path, n: int, data: Path, seed: int, lengths_of: str) -> dict[str, Any]:
    """Write the corpus of ``n`` documents to ``out/corpus.jsonl`` (module docstring); returns the
    manifest (counts per source, mean words, seconds)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    nf = [(d.doc_id, d.title, d.text) for d in iter_beir_documents(data / "beir-nfcorpus")]
    others, passage_lengths = real_others(data)
    order = rng.permutation(len(others))
    take = max(0, min(len(others), n - len(nf)))
    chosen = [others[i] for i in order[:take]]
    n_distract = max(0, n - len(nf) - take)
    pool = [s for _, title, text in others for s in sentences(text)]  # not NFCorpus's: see the docstring
    pool_words = np.asarray([len(s.split()) for s in pool], dtype=np.int32)
    lengths = (np.asarray(passage_lengths) if lengths_of == "passage"
               else np.asarray([len(t.split()) for _, _, t in nf + others]))
    lengths = lengths[lengths > 0]
    tmp = out / "corpus.jsonl.partial"
    digest = hashlib.sha256()
    words = {"nfcorpus": 0, "real": 0, "distractor": 0}

    rows = 0

    def line(did: str, title: str, text: str) -> None:
        nonlocal rows
        row = (json.dumps({"_id": did, "title": title, "text": text}, ensure_ascii=False) + "\n").encode("utf-8")
        digest.update(row)
        f.write(row)
        meta.write(json.dumps({"doc_id": did, "shard": rows % 100, "bucket": rows % 10_000}) + "\n")
        rows += 1

    meta_tmp = out / "metadata.jsonl.partial"
    with open(tmp, "wb") as f, open(meta_tmp, "w", encoding="utf-8") as meta:
        for did, title, text in nf[:n]:
            line(did, title, text)
            words["nfcorpus"] += len(text.split())
        for did, title, text in chosen:
            line(did, title, text)
            words["real"] += len(text.split())
        for i, text in enumerate(distractors(rng, pool, pool_words, lengths, n_distract)):
            line(f"x{i:07d}", "", text)
            words["distractor"] += len(text.split())
        f.flush()
        os.fsync(f.fileno())
    os.replace(meta_tmp, out / "metadata.jsonl")
    os.replace(tmp, out / "corpus.jsonl")
    counts = {"nfcorpus": min(n, len(nf)), "real": take, "distractor": n_distract}
    return {"n": n, "seed": seed, "lengths": lengths_of, "counts": counts,
            "mean_words": {k: round(words[k] / counts[k], 1) if counts[k] else None for k in counts},
            "sentence_pool": len(pool), "corpus_sha256": digest.hexdigest(),
            "corpus_bytes": (out / "corpus.jsonl").stat().st_size, "seconds": round(time.perf_counter() - t0, 1)}


def copy_probe(data: Path, out: Path) -> None:
    """NFCorpus's queries and dev / test qrels, unchanged (gunzipped)."""
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with gzip.open(data / "beir-nfcorpus" / "queries.jsonl.gz", "rb") as src, open(out / "queries.jsonl", "wb") as dst:
        shutil.copyfileobj(src, dst)
    for split in ("test", "dev"):
        shutil.copyfile(data / "beir-nfcorpus" / "qrels" / f"{split}.tsv", out / "qrels" / f"{split}.tsv")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, required=True, help="Documents in the corpus (>= 1).")
    ap.add_argument("--out", type=Path, required=True, help="Output folder (BEIR layout; created).")
    ap.add_argument("--data", type=Path, default=Path(os.environ.get(
        "HEEDRANK_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")),
                    help="The shared data folder (default $HEEDRANK_SHARED_DATA, else ../shared/data beside the "
                         "repository).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lengths", choices=("passage", "document"), default="passage",
                    help="Length distribution of the distractors (default: the TREC DL passages').")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("--n must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    copy_probe(args.data, args.out)
    manifest = write_corpus(args.out, args.n, args.data, args.seed, args.lengths)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print("| N | NFCorpus | other real | distractors | mean words (distractor) | sentence pool | MB | s |")
    print("|---|---|---|---|---|---|---|---|")
    c, words = manifest["counts"], manifest["mean_words"]
    print(f"| {args.n:,} | {c['nfcorpus']:,} | {c['real']:,} | {c['distractor']:,} | {words['distractor']} | "
          f"{manifest['sentence_pool']:,} | {manifest['corpus_bytes'] / 1e6:.1f} | {manifest['seconds']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
