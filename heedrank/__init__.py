"""heedrank: retrieval and attention-based in-context reranking.

The public import surface: the records at the centre, the pipeline and its configs.
Importing this package is light (no torch, faiss or transformers); the layers install
under this namespace (``heedrank.index``, ``heedrank.retriever``, ``heedrank.reranker``,
``heedrank.api``, ``heedrank.eval``) and load their heavy libraries on first use.

Example:
    >>> from heedrank import Document, Query
    >>> Query("q1", "what is bm25").text
    'what is bm25'
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from heedrank.config import DEFAULT_LM, DEFAULT_MAX_DOC_TOKENS, PipelineConfig, RerankerConfig
from heedrank.errors import HeedrankError
from heedrank.pipeline import Pipeline, SearchOptions
from heedrank.types import Document, Qrels, Query, Ranking, Run, ScoredDoc

try:
    __version__ = version("heedrank")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_LM",
    "DEFAULT_MAX_DOC_TOKENS",
    "HeedrankError",
    "Document",
    "Pipeline",
    "PipelineConfig",
    "Qrels",
    "Query",
    "Ranking",
    "RerankerConfig",
    "Run",
    "ScoredDoc",
    "SearchOptions",
    "__version__",
]
