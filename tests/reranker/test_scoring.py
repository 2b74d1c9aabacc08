"""Evidence spans from per-token scores (:func:`heedrank.reranker.scoring.top_spans`): tiny
inline documents, no model."""

from __future__ import annotations

from heedrank.reranker.scoring import is_filler, top_spans
from heedrank.types import Document


def _words(text: str) -> list[tuple[str, int, int]]:
    """One offset per word of ``text`` (field "text"), as a tokenizer's would be."""
    out, at = [], 0
    for word in text.split(" "):
        out.append(("text", at, at + len(word)))
        at += len(word) + 1
    return out


def test_filler_is_stopwords_and_punctuation_alone() -> None:
    assert is_filler("the") and is_filler("The") and is_filler("on the") and is_filler(",") and is_filler("D,")
    assert not is_filler("vitamin D,") and not is_filler("hip") and not is_filler("of statins")


def test_top_spans_skip_filler_and_keep_the_best_others() -> None:
    doc = Document("d", "the trial of statins in the elderly and the risk", title="")
    scores = [5.0, 0.0, 0.1, 3.0, 0.0, 4.0, 2.0, 0.0, 0.0, 0.5]  # one per word
    spans = top_spans(doc, _words(doc.text), scores, 2)
    assert [s.text for s in spans] == ["the elderly", "of statins"]  # "the" alone (5.0) is left out
    assert [s.score for s in spans] == [6.0, 3.1]
    assert all(doc.text[s.start:s.end] == s.text for s in spans)
    assert top_spans(doc, _words(doc.text), [1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 3) == []  # only filler scored
