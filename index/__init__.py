"""Index directories: SQLite document store, BM25 (bm25s), faiss vectors (flat / HNSW /
IVF), encoder, metadata filters and the filtered-search planner.

* :mod:`heedrank.index.store` -- :class:`~index.store.Index`: the opened directory; search,
  filters, durable add / delete / compact; its parts: :mod:`heedrank.index.searching` (the
  first-stage searches), :mod:`heedrank.index.writing` (add / delete), :mod:`heedrank.index.lookups`
  (vector id -> document id, filter cache), :mod:`heedrank.index.lazy_parts` (the encoder and
  the KV stores, opened on first use), :mod:`heedrank.index.summary` (``describe``).
* :mod:`heedrank.index.builder` -- ``heedrank index build``.
* :mod:`heedrank.index.docstore`, :mod:`heedrank.index.memory` -- document stores (the source of truth).
* :mod:`heedrank.index.bm25` -- BM25 with a query-time delta for added documents.
* :mod:`heedrank.index.dense`, :mod:`heedrank.index.dense_search`, :mod:`heedrank.index.planner` --
  vector indexes (their faiss searches) and filtered search.
* :mod:`heedrank.index.filters` -- the JSON filter language, compiled to SQL.
* :mod:`heedrank.index.encoder`, :mod:`heedrank.index.hashing`, :mod:`heedrank.index.passages` -- encoders, chunking.

Modules import their heavy libraries (bm25s, faiss, sentence-transformers) lazily.
"""
