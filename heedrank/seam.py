"""The reranker -> server seam: what the server reads from a reranker, in one typed record.

A reranker declares it by a ``serving()`` method returning :class:`RerankerServing`; the server
(:mod:`heedrank.serving`, :mod:`heedrank.pipeline`, the API's ``/info``) reads it through
:func:`serving_of` and nothing else, so a plug-in without the method is served with the record's
defaults (its own scores, no calibration, one call at a time).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from heedrank.calibration import Calibration
from heedrank.scorer import Scorer
from heedrank.signals import attention
from heedrank.types import Document

ColdCandidates = Callable[[Sequence[Document], Any], list[bool]]
"""``(candidates, block_store) -> [bool]``: which candidates' blocks would be computed, not read."""


@dataclass(frozen=True)
class IndependentServing:
    """How scores that are each (query, document) pair's own log-odds are served (cached BlockRank's
    ``scoring='independent'`` without the default's scorer): ``sigmoid(score)``.

    Attributes:
        threshold: The ``"auto"`` cut-off's probability (chosen on dev).
        fused_map: ``(a, b)``: the probability of a score ``f`` fused with the first stage at the
            reranker's ``default_fusion`` is ``sigmoid(a f + b)`` (fitted on dev), or ``None``.
        fused_threshold: The ``"auto"`` cut-off of that fused probability, or ``None``.
    """

    threshold: float = 0.5
    fused_map: tuple[float, float] | None = None
    fused_threshold: float | None = None


@dataclass(frozen=True)
class RerankerServing:
    """What the server reads from a reranker, in one record: a reranker's ``serving()``
    (:func:`serving_of`; a plug-in without one gets these defaults: none of them).

    Attributes:
        scorer: The default's scorer (:class:`heedrank.scorer.Scorer`, the weights card's
            ``scorer`` entry), else ``None``.
        scorer_threshold: The ``"auto"`` cut-off's probability of :attr:`scorer` (chosen on dev).
        signal: Which signal (:mod:`heedrank.signals`) the reranker's own scores are: ``attention``
            (its pass); the embedder alone, method ``dense``: ``dense``, so no pass runs.
        independent: How each pair's own log-odds are served (:class:`IndependentServing`), for
            a reranker whose scores are that without a scorer; else ``None``.
        default_fusion: The fusion weight with the first stage its card records
            (``fusion="default"``), or ``None``.
        calibration: Its Platt maps (:class:`heedrank.calibration.Calibration`), or ``None``.
        score_scale: Spread of its scores for a relevance in [0, 1] (``sigmoid(score / scale)``),
            or ``None``: its scores are served as they are.
        concurrent_calls: Query passes it runs at once (:func:`heedrank.pipeline.call_gate`).
        cold_candidates: ``(candidates, block_store) -> [bool]``: which candidates' blocks would be
            computed, not read (the cold budget), or ``None`` for a method that stores none.
        max_doc_tokens: Its per-document budget in LM tokens, or ``None``.
        scoring: The scorer in use (``/info``), or ``None`` for a method without scorers.
        card: Its weights card as ``/info`` shows it (``heedrank.reranker.cards.describe_card``),
            or ``None``.
    """

    scorer: Scorer | None = None
    scorer_threshold: float = 0.5
    signal: str = attention.NAME
    independent: IndependentServing | None = None
    default_fusion: float | None = None
    calibration: Calibration | None = None
    score_scale: float | None = None
    concurrent_calls: int = 1
    cold_candidates: ColdCandidates | None = None
    max_doc_tokens: int | None = None
    scoring: str | None = None
    card: Mapping[str, Any] | None = None


def serving_of(reranker: object) -> RerankerServing:
    """The reranker's :class:`RerankerServing`: its ``serving()`` (:meth:`heedrank.protocols.Reranker.serving`),
    else the defaults (a plug-in that implements the protocol without subclassing it). The one
    place the server asks what a reranker has."""
    serving = getattr(reranker, "serving", None)
    return serving() if callable(serving) else RerankerServing()
