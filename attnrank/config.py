"""Frozen configurations from which every stage can be built (e.g. by a Ray worker)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from attnrank.errors import ValidationError

DEFAULT_MAX_DOC_TOKENS = 160
"""Per-document budget in LM tokens, shared by every reranking method."""

DEFAULT_LM = "smollm2-135m-instruct"
"""Name of the packaged default reranker LM (SmolLM2-135M-Instruct, see shared/design/MODELS.md)."""


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
        options: Method-specific options, ``{name: JSON value}``. Each method parses them
            into its typed options class when the reranker is built
            (:mod:`attnrank.reranker.options`: ``ICROptions``, ``BlockRankOptions``);
            unknown names and bad values are a ValidationError. Check them without
            building (or loading) anything with
            ``attnrank.reranker.options.parse_options(method, options)``.
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


def _bounded(name: str, value: Any, high: int) -> int:
    """``value`` as an int in ``1..high``; else ValidationError ``"<name> must be between 1 and <high>, got <value>"``."""
    try:
        n = operator.index(value)
    except TypeError:
        n = None
    if n is None or isinstance(value, bool) or not 1 <= n <= high:
        raise ValidationError(f"{name} must be between 1 and {high}, got {value!r}")
    return n


@dataclass(frozen=True)
class SearchLimits:
    """The bounds of the searches a :class:`attnrank.pipeline.Pipeline` accepts; every pipeline
    is constructed with one, and its :meth:`~attnrank.pipeline.Pipeline.validate` is the one
    place they are checked (the API fills them from its settings, ``ATTNRANK_MAX_TOP_K`` and
    ``ATTNRANK_MAX_CANDIDATES``; see :meth:`attnrank.settings.Settings.search_limits`).

    Attributes:
        max_top_k: Largest ``top_k`` a search may ask for.
        max_candidates: Largest number of candidates a search may send to the reranker.

    Raises:
        ValidationError: a bound below 1.
    """

    max_top_k: int = 100
    max_candidates: int = 100

    def __post_init__(self) -> None:
        for name in ("max_top_k", "max_candidates"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError(f"{name} must be an integer >= 1, got {value!r}")

    def check_top_k(self, top_k: Any) -> int:
        """``top_k`` if it is an integer in ``1..max_top_k``. Raises ValidationError."""
        return _bounded("top_k", top_k, self.max_top_k)

    def check_candidates(self, candidates: Any) -> int:
        """``candidates`` if it is an integer in ``1..max_candidates``. Raises ValidationError."""
        return _bounded("candidates", candidates, self.max_candidates)


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

    @property
    def limits(self) -> SearchLimits:
        """The :class:`SearchLimits` of the pipeline built from this configuration."""
        return SearchLimits(max_top_k=self.max_top_k, max_candidates=self.max_candidates)
