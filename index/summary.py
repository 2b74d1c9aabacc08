"""What an :class:`heedrank.index.store.Index` reports about itself
(:meth:`heedrank.index.store.Index.describe`, for ``/info`` and reports): read from its
``params.json``, its document store and its BM25, without loading a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heedrank.index.store import Index


def describe(index: Index) -> dict[str, Any]:
    """The summary of ``index``.

    Returns:
        ``{"path": str or None (in memory), "num_docs": live documents, "retrievers":
        :meth:`~heedrank.index.store.Index.available_retrievers`, "created", "format_version",
        "corpus": as recorded at build time, "bm25": its build parameters and
        ``analyzer_version``, "dense": None without vectors, else ``{"index_type", "params",
        "passages", "dim", "embedder": name, "embedder_sha256"}``}``.
    """
    params = index.params
    dense = params.get("dense") or None
    emb = (dense or {}).get("embedder") or {}
    return {
        "path": str(index.path) if index.path is not None else None,
        "num_docs": len(index.docstore),
        "retrievers": index.available_retrievers(),
        "created": params.get("created"),
        "format_version": params.get("format_version"),
        "corpus": params.get("corpus"),
        "bm25": {**(params.get("bm25") or {}), "analyzer_version": index.bm25.params.analyzer_version},
        "dense": (
            {
                "index_type": dense.get("index_type"),
                "params": dense.get("params"),
                "passages": dense.get("passages"),
                "dim": dense.get("dim"),
                "embedder": emb.get("name"),
                "embedder_sha256": emb.get("sha256"),
            }
            if dense else None
        ),
    }
