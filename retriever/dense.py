"""Dense first stage: bi-encoder query embedding + exact inner-product search (faiss)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from attnrank.errors import IndexMismatchError, ValidationError
from attnrank.protocols import Encoder, Filter
from attnrank.types import Query, Ranking, ScoredDoc
from retriever.base import check_request

TIE_MARGIN = 8
"""Extra neighbours fetched so that ties at the ``k``-th score are broken by doc id."""


class DenseRetriever:
    """Cosine similarity between the query embedding and every document vector.

    Scores are cosine similarities in ``[-1, 1]`` (inner products of L2-normalised
    vectors). Every document gets a score, so a query gets ``min(k, corpus size)`` hits.

    Args:
        dense: :class:`index.dense.DenseIndex` with labels = row ``vid``.
        encoder: Query encoder (the model the documents were encoded with), or a
            zero-argument callable returning it, called on the first ``retrieve`` (so
            the model loads lazily).
        doc_ids: Doc id of every row (``doc_ids[vid]``).
        show_progress: tqdm bar while encoding query batches.
    """

    name = "dense"

    def __init__(
        self,
        dense: Any,
        encoder: Encoder | Callable[[], Encoder],
        doc_ids: Sequence[str],
        *,
        show_progress: bool = False,
    ) -> None:
        if len(dense) != len(doc_ids):
            raise IndexMismatchError(f"vector index has {len(dense)} vectors but {len(doc_ids)} doc ids were given")
        self.dense = dense
        self.doc_ids = doc_ids
        self.show_progress = show_progress
        if hasattr(encoder, "encode_queries"):
            self._encoder: Encoder | None = encoder  # type: ignore[assignment]
            self._factory = None
        else:
            self._encoder, self._factory = None, encoder  # type: ignore[assignment]
        self._lock = threading.Lock()

    @classmethod
    def from_index(cls, index: Any, **options: Any) -> DenseRetriever:
        """Build over an :class:`index.store.Index`; the encoder loads on first retrieve.

        Options: ``show_progress`` (bool; default: the index's).

        Raises:
            ValidationError: the index has no vectors (built with ``--no-dense``), or an
                unknown option.
        """
        show = options.pop("show_progress", getattr(index, "show_progress", False))
        if options:
            raise ValidationError(f"unknown dense retriever options: {sorted(options)}")
        if index.dense is None:
            raise ValidationError("this index has no dense vectors (built with --no-dense); use the bm25 retriever")
        return cls(index.dense, lambda: index.encoder, index.doc_ids, show_progress=show)

    @property
    def encoder(self) -> Encoder:
        """The query encoder (built by the factory on first access)."""
        if self._encoder is None:
            with self._lock:
                if self._encoder is None:
                    self._encoder = self._factory()  # type: ignore[misc]
        return self._encoder

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: Filter | None = None) -> list[Ranking]:
        """Top-``k`` of each query by cosine similarity, sorted by ``(-score, doc_id)``.

        Raises:
            ValidationError: ``k < 1`` or a metadata filter (not supported yet).
        """
        k = check_request(k, filter)
        if not queries:
            return []
        texts = [q.text for q in queries]
        vectors = np.asarray(self.encoder.encode_queries(texts, show_progress=self.show_progress), dtype=np.float32)
        scores, vids = self.dense.search(vectors, k + TIE_MARGIN)
        ids = self.doc_ids
        return [
            Ranking.from_hits(
                q.query_id, (ScoredDoc(ids[v], float(s)) for v, s in zip(row_ids.tolist(), row_scores.tolist())), k
            )
            for q, row_scores, row_ids in zip(queries, scores, vids)
        ]

    def __repr__(self) -> str:
        return f"DenseRetriever({len(self.dense)} vectors)"
