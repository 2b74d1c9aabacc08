"""Tiny candidate-list folders of each layout :mod:`heedrank.eval.sets` recognises, written inline
(a dev<N>-tagged MS MARCO sample, NovelEval), for the tests of the sets and their users."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode()) if path.suffix == ".gz" else text.encode())
    return path


def dev_folder(root: Path, n: int = 8, judged: int = 6) -> Path:
    """A dev<N>-tagged folder of ``n`` queries, two passages each; the first ``judged`` have their
    positive (grade 1) second in the run."""
    qids = [f"{100 + i}" for i in range(n)]
    write(root / f"topics.dev{n}.tsv", "".join(f"{q}\tquestion {q}\n" for q in qids))
    write(root / f"qrels.dev{n}.txt", "".join(f"{q} 0 {q}-pos 1\n" for q in qids[:judged]))
    runs = [{"query": f"question {q}", "hits": [
        {"content": f"other {q}", "qid": int(q), "docid": f"{q}-neg", "rank": 1, "score": 20.0},
        {"content": f"answer {q}", "qid": int(q), "docid": f"{q}-pos", "rank": 2, "score": 19.0}]} for q in qids]
    write(root / f"retrieve_results_BM25_dev{n}_top20.json.gz", json.dumps(runs))
    return root


def noveleval_folder(root: Path) -> Path:
    """Two questions with three passages each, written as pandas writes TSV (quoted fields)."""
    write(root / "queries.tsv", "0\twho won the cup\n1\twhere is the summit\n")
    write(root / "corpus.tsv", "0-0\tthe weather was fine\n"
                                 "0-1\t\"the cup was won by \"\"Rovers\"\"\tin extra time\"\n"
                                 "0-2\tthe cup final\n"
                                 "1-0\tthe summit is in Hiroshima\n1-1\tnothing here\n1-2\ta meeting\n")
    write(root / "qrels.txt", "0 Q0 0-0 0\n0 Q0 0-1 2\n0 Q0 0-2 1\n1 Q0 1-0 2\n1 Q0 1-1 0\n1 Q0 1-2 0\n")
    return root
