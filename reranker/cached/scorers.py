"""Three of the four scorers of cached BlockRank (option ``scoring``), one strategy object each,
chosen once at load (:func:`heedrank.reranker.cached.state.load_state`). The fourth,
``'independent'`` (each (query, document) pair's own log-odds of relevance, the same in any list),
is :class:`heedrank.reranker.cached.independent.IndependentScorer`. ``'auto'`` (the default) picks
one: ``'independent'`` when the weights card fits and holds the default's scorer (then served by it:
:mod:`heedrank.scorer`), else ``'learned'`` when a card fits, else ``'calibrated'``
(:func:`heedrank.reranker.cached.state.auto_scoring`).

Each reads the query pass's context (:class:`QueryPass`: the prompt, the keys/values of
block 0 and the candidates, the LM the query passes run on) and returns the candidates'
scores with each candidate token's share of them (:class:`Scored`, for evidence):

* :class:`LearnedScorer` (``scoring='learned'``): learned weights over the calibrated
  attention of every (layer, head) of ``0..l*``, each z-scored over the query's candidates
  (:func:`heedrank.reranker.scoring.linear_head_scores`); unitless.
* :class:`CalibratedScorer` (``'calibrated'``): ICR's calibrated query attention summed over
  layers ``0..l*`` and heads, with the per-document ``mean - n std`` token mask; unitless
  differences of attention mass.
* :class:`SignalScorer` (``'signal'``): BlockRank's signal tokens' attention at ``l*``
  (optionally ReAttn re-weighted); probabilities summing to 1 over the candidates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from heedrank.reranker.blockforward import BlockPrompt, calibrated_forward
from heedrank.reranker.scoring import (
    linear_head_scores,
    linear_head_token_scores,
    masked_document_scores,
    per_head_document_mass,
    spans_from_lengths,
)


@dataclass(frozen=True)
class QueryPass:
    """The query pass's context: what a scorer reads.

    Attributes:
        lm: The LM the query passes run on (:class:`heedrank.reranker.lm.LoadedLM`; with the
            query adapter when one is loaded).
        prompt: The cached prompt.
        kv: Per layer ``0..l*``, ``(keys, values)`` of block 0 and the candidates
            (:attr:`heedrank.reranker.cached.Context.kv`).
        layer: ``l*``.
        doc_batch_size: Candidate blocks per batched prefill.
        fast: Take the fast path (:attr:`heedrank.reranker.blockrank.BlockRankReranker.fast_path`).
    """

    lm: Any
    prompt: BlockPrompt
    kv: list[tuple[Any, Any]]
    layer: int
    doc_batch_size: int
    fast: bool


@dataclass(frozen=True)
class Scored:
    """A scorer's output.

    Attributes:
        scores: One score per candidate, in the prompt's (first-stage) order.
        tokens: Each candidate token's share of its document's score, float ``(D,)`` over
            the candidates' tokens: a tensor, a callable computing it (learned: only when
            evidence is asked for), or ``None`` (signal: read again when asked for).
        seconds: Stage timings, seconds.
    """

    scores: list[float]
    tokens: Any
    seconds: dict[str, float]


class Scorer(Protocol):
    """A cached BlockRank scorer."""

    def score(self, qp: QueryPass) -> Scored:
        """Scores of the query pass's candidates (run under the LM's lock)."""
        ...


def _calibrated(qp: QueryPass) -> tuple[dict[int, Any], dict[int, Any], list[int], dict[str, float]]:
    """Mean attention of the query and ``N/A`` blocks at layers ``0..l*`` (one merged pass on
    the fast path), the layers, and timings."""
    layers = list(range(qp.layer + 1))
    qo, co, t = calibrated_forward(qp.lm, qp.prompt, qp.layer, read_layers=layers, doc_batch_size=qp.doc_batch_size,
                                   kv=qp.kv, fast=qp.fast)
    return qo, co, layers, t


@dataclass(frozen=True)
class LearnedScorer:
    """``scoring='learned'`` (module docstring).

    Attributes:
        weights: float64 ``(l* + 1, heads)``: the query adapter's own or the weights card's.
    """

    weights: Any

    def score(self, qp: QueryPass) -> Scored:
        import torch

        prompt = qp.prompt
        L0, D = len(prompt.instruction_ids), sum(prompt.doc_lengths)
        with torch.inference_mode():
            qo, co, layers, t = _calibrated(qp)
            feats = per_head_document_mass(qo, L0, prompt.doc_lengths, layers, minus=co)
            w = torch.as_tensor(self.weights)
            scores = linear_head_scores(feats, w).tolist()
            tokens = partial(linear_head_token_scores, qo, co, L0, D, layers, feats, w)  # explain only
        return Scored(scores, tokens, t)


@dataclass(frozen=True)
class CalibratedScorer:
    """``scoring='calibrated'`` (module docstring).

    Attributes:
        mask_std: Per-document token mask at ``mean - mask_std * std`` (``None``: no mask).
    """

    mask_std: float | None

    def score(self, qp: QueryPass) -> Scored:
        import torch

        prompt = qp.prompt
        L0, D = len(prompt.instruction_ids), sum(prompt.doc_lengths)
        with torch.inference_mode():
            qo, co, layers, t = _calibrated(qp)
            c = sum((qo[l][0, :, L0: L0 + D] - co[l][0, :, L0: L0 + D]).sum(0) for l in layers)
            scores = masked_document_scores(c, spans_from_lengths(prompt.doc_lengths), self.mask_std)
        return Scored(scores, c, t)


@dataclass(frozen=True)
class SignalScorer:
    """``scoring='signal'`` (module docstring).

    Attributes:
        token_mass: The signal tokens' attention mass per candidate token of a prompt, from
            its context's keys/values, with timings
            (:meth:`heedrank.reranker.blockrank.BlockRankReranker.token_mass`).
        reattn: ReAttn re-weighting of that mass into scores
            (:meth:`heedrank.reranker.blockrank.BlockRankReranker.reattn_scores`), or ``None``.
    """

    token_mass: Callable[[BlockPrompt, Any], tuple[Any, dict[str, float]]]
    reattn: Callable[[BlockPrompt, Any, list[tuple[int, int]]], list[float]] | None = None

    def score(self, qp: QueryPass) -> Scored:
        mass, t = self.token_mass(qp.prompt, qp.kv)
        bounds = spans_from_lengths(qp.prompt.doc_lengths)
        if self.reattn is not None:
            return Scored(self.reattn(qp.prompt, mass, bounds), None, t)
        return Scored([float(mass[s:e].sum()) for s, e in bounds], None, t)
