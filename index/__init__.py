"""Index directories: SQLite document store, BM25 (bm25s), faiss vectors, encoder.

Modules import their heavy libraries (bm25s, faiss, sentence-transformers) lazily.
"""
