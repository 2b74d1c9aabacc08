"""The ``dense`` signal (:class:`heedrank.index.cosines.DenseSignal`): stored vectors equal the
texts encoded (oracle), chunked documents score their best passage, and a text is encoded once."""

from __future__ import annotations

import numpy as np
import pytest

from heedrank.index.cosines import DenseSignal
from heedrank.index.hashing import HashingEncoder
from heedrank.index.passages import PassageParams
from heedrank.index.store import Index
from heedrank.types import Document

DOCS = [Document("a", "statins lower cholesterol in adults"), Document("b", "vitamin d and bone fractures"),
        Document("c", "breast milk and infant health outcomes"), Document("d", "fish oil and the heart")]


class CountingEncoder(HashingEncoder):
    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.documents_encoded = 0

    def encode_documents(self, texts, *, show_progress=False):  # type: ignore[no-untyped-def]
        texts = list(texts)
        self.documents_encoded += len(texts)
        return super().encode_documents(texts, show_progress=show_progress)


def test_stored_vectors_equal_the_texts_encoded() -> None:
    enc = HashingEncoder(64)
    index = Index.from_documents(DOCS, encoder=enc)
    signal = DenseSignal.of_index(index)
    assert signal is not None
    stored = signal.cosines("statins and cholesterol", DOCS)
    encoded = DenseSignal(enc).cosines("statins and cholesterol", DOCS)
    assert stored.keys() == {"a", "b", "c", "d"}
    assert stored == pytest.approx(encoded, abs=1e-6)
    assert stored["a"] > 0.3 and stored["a"] == max(stored.values())
    # a document the index does not hold is encoded (the caller's text, not the index's)
    other = Document("a", "fish oil heart")
    assert signal.cosines("fish oil", [other], stored=False)["a"] == pytest.approx(
        DenseSignal(enc).cosines("fish oil", [other])["a"], abs=1e-6)
    assert signal.cosines("fish oil", [Document("zz", "fish oil")])["zz"] == pytest.approx(1.0, abs=1e-6)


def test_a_chunked_document_scores_its_best_passage() -> None:
    enc = HashingEncoder(64)
    long = Document("L", " ".join(["filler words about nothing"] * 10) + " statins cholesterol")
    index = Index.from_documents([long, DOCS[1]], encoder=enc, passages=PassageParams(max_words=8, stride=8))
    cos = DenseSignal.of_index(index).cosines("statins cholesterol", [long, DOCS[1]])  # type: ignore[union-attr]
    q = enc.encode_queries(["statins cholesterol"])[0]
    passages = PassageParams(max_words=8, stride=8).split(long)
    best = max(float(v @ q) for v in enc.encode_documents(passages))
    assert cos["L"] == pytest.approx(best, abs=1e-6) and best > 0.5


def test_an_index_without_vectors_has_no_signal_and_texts_are_encoded_once() -> None:
    assert DenseSignal.of_index(Index.from_documents(DOCS)) is None  # BM25 only
    enc = CountingEncoder(32)
    signal = DenseSignal(enc, cache_vectors=3)
    signal.cosines("q", DOCS[:2])
    signal.cosines("another query", DOCS[:2])
    assert enc.documents_encoded == 2  # the second query reads the cached vectors
    signal.cosines("q", DOCS)  # 4 texts, 3 kept: the oldest is evicted
    assert enc.documents_encoded == 4 and len(signal._cache) == 3
    assert signal.cosines("q", []) == {}
    assert np.isfinite(list(signal.cosines("q", [Document("e", "")]).values())).all()
