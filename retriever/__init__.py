"""First-stage retrievers (BM25, dense, hybrid RRF, fixed run), built with ``from_index``."""
