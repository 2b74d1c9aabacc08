"""Whole documents as passage blocks: a document longer than one block becomes several blocks
of at most ``max_doc_tokens`` LM tokens each, scored like candidates, and the document takes
the best of its passages' scores.

This is MaxP (Dai and Callan, "Deeper Text Understanding for IR with Contextual Neural Language
Modeling", SIGIR 2019, section 3: a document scored by its best passage, the title repeated in
each) on block-sparse attention: each passage block sees only the instruction and itself, so it
is stored and read like a document's block, and the weights fitted on 128-token blocks apply
unchanged. Passage 0 is exactly the document's usual block (its first ``max_doc_tokens``
tokens of ``title + " " + text``), so a store filled for one block per document serves it;
passage ``i >= 1`` is the title, a space and the next stretch of the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heedrank.types import Document

SEP = "\x1fp"
"""Between a document id and its passage number in a passage's id (``"d7\\x1fp2"``)."""


def passage_texts(tokenizer: Any, doc: Document, max_tokens: int, limit: int) -> list[str]:
    """The contents of a document's passages, first passage first.

    Args:
        tokenizer: The LM's fast tokenizer (offsets needed; a byte-level BPE, whose token count
            of words joined by spaces is the sum of each ``" " + word``'s).
        doc: The document.
        max_tokens: LM tokens per block (the reranker's ``max_doc_tokens``).
        limit: At most this many passages (>= 1).

    Returns:
        1 to ``limit`` strings: ``doc.content`` (its block cuts it to ``max_tokens``), then
        ``title + " " + words`` for each further run of whole words of ``doc.text``, packed so
        that the passage's tokens fit ``max_tokens`` (a word longer than that is cut by its
        block). The word the first block cut in two starts the second passage.
    """
    content = doc.content
    if limit <= 1:
        return [content]
    body = " " + content.strip()
    enc = tokenizer(body, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    if len(offsets) <= max_tokens:
        return [content]
    read = offsets[max_tokens - 1][1] - 1 + (len(content) - len(content.lstrip()))  # chars of content read
    if 0 < read < len(content) and not content[read].isspace() and not content[read - 1].isspace():
        read = max(content.rfind(" ", 0, read), 0)  # back to the start of the word cut in two
    words = content[max(read, len(content) - len(doc.text)):].split()
    if not words:
        return [content]
    title = doc.title.strip()
    budget = max_tokens - (len(tokenizer(" " + title, add_special_tokens=False).input_ids) if title else 0)
    sizes = [len(ids) for ids in tokenizer([" " + w for w in words], add_special_tokens=False,
                                           split_special_tokens=True).input_ids]
    out = [content]
    run: list[str] = []
    used = 0
    for word, size in zip(words, sizes):
        if run and used + size > budget:
            out.append(" ".join([title, *run]) if title else " ".join(run))
            if len(out) >= limit:
                return out
            run, used = [], 0
        run.append(word)
        used += size
    if run:
        out.append(" ".join([title, *run]) if title else " ".join(run))
    return out[:limit]


def expand(tokenizer: Any, docs: Sequence[Document], max_tokens: int, limit: int) -> tuple[list[Document], list[int]]:
    """Every document's passages as documents of their own, and the owner of each.

    Returns:
        ``(passages, owner)``: passage ``j`` belongs to ``docs[owner[j]]``; its id is the
        document's id, :data:`SEP` and its number; its title is empty (the title is in its text).
    """
    passages: list[Document] = []
    owner: list[int] = []
    for i, doc in enumerate(docs):
        for j, text in enumerate(passage_texts(tokenizer, doc, max_tokens, limit)):
            if j == 0:
                passages.append(doc)
            else:
                passages.append(Document(f"{doc.doc_id}{SEP}{j}", text))
            owner.append(i)
    return passages, owner


def pool_max(scores: Sequence[float], owner: Sequence[int], n: int) -> list[float]:
    """Each document's best passage score (``n`` documents; every one owns a passage)."""
    best = [float("-inf")] * n
    for s, o in zip(scores, owner):
        best[o] = max(best[o], float(s))
    return best
