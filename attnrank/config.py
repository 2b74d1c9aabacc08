"""Frozen configurations from which every stage can be built (e.g. by a Ray worker)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_MAX_DOC_TOKENS = 160
"""Per-document budget in LM tokens, shared by every reranking method."""


@dataclass(frozen=True)
class RerankerConfig:
    """How to build a reranker.

    Attributes:
        method: Registry name (``"icr"``, ...).
        model: LM to read attention from: ``None`` or ``"smollm2-135m-instruct"`` for the
            packaged default, or a local Hugging Face causal-LM directory.
        max_doc_tokens: Per-document budget in LM tokens; longer documents are truncated
            and reported in :attr:`attnrank.protocols.RerankResult.truncated`.
        device: torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        dtype: Compute dtype (``"float32"``; ``"bfloat16"`` only on accelerators).
        cache_dir: Where converted model copies are cached; ``None`` = ``$ATTNRANK_CACHE_DIR``
            or ``~/.cache/attnrank``.
        options: Method-specific options (see each reranker's docstring).
    """

    method: str = "icr"
    model: str | None = None
    max_doc_tokens: int = DEFAULT_MAX_DOC_TOKENS
    device: str = "cpu"
    dtype: str = "float32"
    cache_dir: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def with_options(self, **options: Any) -> RerankerConfig:
        return replace(self, options={**self.options, **options})


@dataclass(frozen=True)
class PipelineConfig:
    """How to build a :class:`attnrank.pipeline.Pipeline`.

    Attributes:
        index_dir: Index directory written by ``attnrank index build``.
        reranker: Base reranker configuration; ``method`` names the default reranker, and
            other methods reuse the same model and ``max_doc_tokens``.
        max_top_k: Largest ``top_k`` a search may ask for.
        max_candidates: Largest number of candidates a search may send to the reranker.
        show_progress: Progress bars on long loops.
    """

    index_dir: str
    reranker: RerankerConfig = field(default_factory=RerankerConfig)
    max_top_k: int = 100
    max_candidates: int = 100
    show_progress: bool = False
