"""Weak labels for reranker training: pseudo-queries written for corpus documents, each
judged relevant (grade 1) to the document it was written for (issue #24, lever 2).

Two sources:

- ``title``: a document's title is the query for its own text (the weak supervision of
  title-body pairs, e.g. Contriever's and HLP's pre-training pairs);
- ``generated``: an instruct LM reads the document's body (no title, so it cannot copy it)
  and writes one question that the text answers, greedy (InPars, Bonifacio et al. 2022,
  arXiv 2202.05144, Section 3, zero-shot prompt instead of few-shot).

The first stage's hard negatives come later, from ``heedrank eval study-dump`` on the folder
written here (candidates = the first stage's top k for the pseudo-query); InPars's filter
(keep the pairs whose document the first stage ranks high) is applied at fit time on that
dump (:func:`first_stage_filter`).

**Leak guard.** Nothing here reads the qrels of the protected splits (dev, test): a weak
label comes from a document's own text. What could still leak a protected label is a
pseudo-query that *is* a protected query (the model would learn that query's relevant
document); :func:`guard` drops every pseudo-query whose word set overlaps a protected
query's by Jaccard >= ``max_jaccard``, and the folder's ``README`` records how many it
dropped. ``exclude_docs`` additionally keeps documents out (e.g. every document a protected
split judges, for the strict variant).
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heedrank.errors import ValidationError
from heedrank.types import Document

logger = logging.getLogger(__name__)

SOURCES = ("title", "generated")
GENERATION_PROMPT = ("Article:\n{text}\n\nWhat question does this article answer? Reply with one short question only.")
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class PseudoQuery:
    """One weak label: ``query`` is relevant (grade 1) to ``doc_id``."""

    query_id: str
    query: str
    doc_id: str


def words(text: str) -> frozenset[str]:
    """Lower-cased alphanumeric word set (the leak guard's unit)."""
    return frozenset(_WORD.findall(text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a & b| / |a | b| (0 for two empty sets)."""
    return len(a & b) / len(a | b) if a or b else 0.0


def guard(pseudo: Sequence[PseudoQuery], protected: Iterable[str], max_jaccard: float = 0.6
          ) -> tuple[list[PseudoQuery], list[PseudoQuery]]:
    """Split ``pseudo`` into (kept, dropped): dropped are those whose word set reaches Jaccard
    ``max_jaccard`` with some protected query text, or is empty.

    Raises:
        ValidationError: ``max_jaccard`` outside (0, 1].
    """
    if not 0.0 < max_jaccard <= 1.0:
        raise ValidationError(f"max_jaccard must be in (0, 1], got {max_jaccard}")
    sets = [words(t) for t in protected]
    index: dict[str, list[int]] = {}
    for i, s in enumerate(sets):
        for w in s:
            index.setdefault(w, []).append(i)
    kept, dropped = [], []
    for p in pseudo:
        mine = words(p.query)
        near = {i for w in mine for i in index.get(w, ())}
        if not mine or any(jaccard(mine, sets[i]) >= max_jaccard for i in near):
            dropped.append(p)
        else:
            kept.append(p)
    return kept, dropped


def title_queries(documents: Iterable[Document], prefix: str = "TITLE-") -> list[PseudoQuery]:
    """A document's title as the query for its own text (documents without a title skipped)."""
    return [PseudoQuery(prefix + d.doc_id, " ".join(d.title.split()), d.doc_id) for d in documents if d.title.strip()]


def clean_generation(text: str, max_words: int = 24) -> str:
    """The first line of a generation without quotes, cut to ``max_words`` words."""
    line = text.strip().split("\n")[0].strip().strip('"').strip()
    return " ".join(line.split()[:max_words])


def generated_queries(lm: Any, documents: Sequence[Document], *, prefix: str = "GEN-", body_words: int = 100,
                      max_new_tokens: int = 24, batch_size: int = 8, show_progress: bool = True) -> list[PseudoQuery]:
    """One question per document, written greedily by the instruct LM ``lm``
    (:class:`heedrank.reranker.lm.LoadedLM` with a chat template) from the first
    ``body_words`` words of the body. Empty generations are skipped.

    Cost (2 CPU cores, Qwen2.5-Coder-0.5B-Instruct, batches of 8): about 2.5 s per document.
    """
    import torch

    tok = lm.tokenizer
    if getattr(tok, "chat_template", None) is None:
        raise ValidationError(f"LM {lm.identity.get('name')} has no chat template: pass an instruct model")
    side = tok.padding_side
    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out: list[PseudoQuery] = []
    bar: Any = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(documents), desc="generate pseudo-queries", unit="doc")
    try:
        for b in range(0, len(documents), batch_size):
            chunk = documents[b : b + batch_size]
            prompts = [tok.apply_chat_template(
                [{"role": "user", "content": GENERATION_PROMPT.format(text=" ".join(d.text.split()[:body_words]))}],
                tokenize=False, add_generation_prompt=True) for d in chunk]
            enc = tok(prompts, return_tensors="pt", padding=True).to(lm.device)
            with torch.inference_mode():
                gen = lm.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
            for d, g in zip(chunk, gen):
                q = clean_generation(tok.decode(g[enc["input_ids"].shape[1]:], skip_special_tokens=True))
                if q:
                    out.append(PseudoQuery(prefix + d.doc_id, q, d.doc_id))
            if bar is not None:
                bar.update(len(chunk))
    finally:
        tok.padding_side = side
        if bar is not None:
            bar.close()
    return out


def sample_documents(documents: Sequence[Document], n: int | None, seed: int = 0,
                     exclude_docs: Iterable[str] = ()) -> list[Document]:
    """A seeded sample of ``n`` documents (all when ``None``) outside ``exclude_docs``, in
    corpus order."""
    skip = set(exclude_docs)
    pool = [d for d in documents if d.doc_id not in skip]
    if n is None or n >= len(pool):
        return pool
    keep = set(random.Random(seed).sample(range(len(pool)), n))
    return [d for i, d in enumerate(pool) if i in keep]


def write_folder(out: str | Path, pseudo: Sequence[PseudoQuery], corpus: str | Path, readme: str,
                 split: str = "train") -> Path:
    """A BEIR folder of the weak labels: ``queries.jsonl``, ``qrels/<split>.tsv`` (grade 1)
    and ``corpus.jsonl.gz`` as a link to the source corpus (never a copy)."""
    out = Path(out)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with (out / "queries.jsonl").open("w") as f:
        for p in pseudo:
            f.write(json.dumps({"_id": p.query_id, "text": p.query}) + "\n")
    with (out / "qrels" / f"{split}.tsv").open("w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for p in pseudo:
            f.write(f"{p.query_id}\t{p.doc_id}\t1\n")
    link = out / "corpus.jsonl.gz"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(Path(corpus).resolve())
    (out / "README").write_text(readme.rstrip() + "\n")
    return out


def first_stage_filter(items: Sequence[Any], top: int) -> list[Any]:
    """InPars's filter on a study dump: keep the examples whose positive the first stage
    ranks in its top ``top`` (items of :func:`heedrank.eval.study.load_items`, candidates in
    first-stage order, ``labels`` the qrels grade of each)."""
    import numpy as np

    return [it for it in items if np.any(np.asarray(it.labels[:top]) > 0)]


def protected_texts(queries: Mapping[str, Any], qrels_by_split: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The texts of the queries judged in the protected splits."""
    ids = {q for qrels in qrels_by_split.values() for q in qrels}
    return [queries[q].text for q in sorted(ids) if q in queries]


def judged_documents(qrels_by_split: Mapping[str, Mapping[str, Mapping[str, int]]]) -> set[str]:
    """Every document a protected split judges (the strict variant's exclusion)."""
    return {d for qrels in qrels_by_split.values() for judged in qrels.values() for d in judged}


def build(data: str | Path, out: str | Path, *, source: str, docs: int | None, seed: int = 0,
          protect: Sequence[str] = ("dev", "test"), strict: bool = False, max_jaccard: float = 0.6,
          model: str | None = None, device: str = "cpu", show_progress: bool = True) -> dict[str, Any]:
    """Write a weak-label folder for the BEIR set ``data`` (``heedrank eval weak-labels``).

    Returns:
        Counts: documents sampled, pseudo-queries written, dropped by the guard.

    Raises:
        ValidationError: an unknown source.
    """
    from heedrank.data import find_beir_corpus, iter_beir_documents, load_beir_qrels, load_beir_queries

    if source not in SOURCES:
        raise ValidationError(f"source must be one of {SOURCES}, got {source!r}")
    data = Path(data)
    qrels = {s: load_beir_qrels(data, s) for s in protect}
    exclude = judged_documents(qrels) if strict else set()
    corpus = list(iter_beir_documents(data))
    chosen = sample_documents(corpus, docs, seed, exclude)
    if source == "title":
        pseudo = title_queries(chosen)
    else:
        from heedrank.reranker.lm import load_lm

        pseudo = generated_queries(load_lm(model, device=device), chosen, show_progress=show_progress)
    kept, dropped = guard(pseudo, protected_texts(load_beir_queries(data), qrels), max_jaccard)
    counts = {"source": source, "documents": len(chosen), "written": len(kept), "dropped_by_guard": len(dropped),
              "strict": strict, "protected_splits": list(protect), "seed": seed, "model": model}
    write_folder(out, kept, find_beir_corpus(data), (
        f"Weak labels (issue #24 lever 2), `heedrank eval weak-labels`: source {source}, {len(chosen)} documents of "
        f"{data.name} (seed {seed}{', none judged by ' + '/'.join(protect) if strict else ''}); {len(kept)} "
        f"pseudo-queries, each grade 1 for its own document; {len(dropped)} dropped by the leak guard (Jaccard >= "
        f"{max_jaccard} with a {'/'.join(protect)} query).\n" + json.dumps(counts)))
    logger.info("weak labels: %s", counts)
    return counts
