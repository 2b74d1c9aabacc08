"""Index directories: SQLite document store, BM25 (bm25s), faiss vectors (flat / HNSW /
IVF), encoder, metadata filters and the filtered-search planner.

* :mod:`attnrank.index.store` -- :class:`~index.store.Index`: the opened directory; search,
  filters, durable add / delete / compact.
* :mod:`attnrank.index.builder` -- ``attnrank index build``.
* :mod:`attnrank.index.docstore`, :mod:`attnrank.index.memory` -- document stores (the source of truth).
* :mod:`attnrank.index.bm25` -- BM25 with a query-time delta for added documents.
* :mod:`attnrank.index.dense`, :mod:`attnrank.index.planner` -- vector indexes and filtered search.
* :mod:`attnrank.index.filters` -- the JSON filter language, compiled to SQL.
* :mod:`attnrank.index.encoder`, :mod:`attnrank.index.hashing`, :mod:`attnrank.index.passages` -- encoders, chunking.

Modules import their heavy libraries (bm25s, faiss, sentence-transformers) lazily.
"""
