"""Index directories: SQLite document store, BM25 (bm25s), faiss vectors (flat / HNSW /
IVF), encoder, metadata filters and the filtered-search planner.

* :mod:`index.store` -- :class:`~index.store.Index`: the opened directory; search,
  filters, durable add / delete / compact.
* :mod:`index.builder` -- ``attnrank index build``.
* :mod:`index.docstore`, :mod:`index.memory` -- document stores (the source of truth).
* :mod:`index.bm25` -- BM25 with a query-time delta for added documents.
* :mod:`index.dense`, :mod:`index.planner` -- vector indexes and filtered search.
* :mod:`index.filters` -- the JSON filter language, compiled to SQL.
* :mod:`index.encoder`, :mod:`index.hashing`, :mod:`index.passages` -- encoders, chunking.

Modules import their heavy libraries (bm25s, faiss, sentence-transformers) lazily.
"""
