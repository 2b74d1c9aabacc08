"""What is served after reranking, in one place: one query's signals become its served order,
its probability of relevance (``relevance``), and its cut-off.

One record, :class:`ServePolicy`, is resolved once per request (or batch) from the built
reranker and the request (:meth:`ServePolicy.of`): it picks one **strategy** and serves each
query with it (:meth:`ServePolicy.serve`). Every strategy takes the query's candidates and their
``(N, F)`` signal matrix (:func:`heedrank.signals.gather` of the strategy's ``features``, NaN
where a candidate has no value) and returns a :class:`Served`:

- :class:`ScorerServing`, the default: the weights card's learned scorer (:mod:`heedrank.scorer`)
  gives every candidate one logit from the signals it has; the order, ``relevance``
  (``sigmoid`` of the logit) and the cut-off all read it, the same number for a document
  whatever else the list holds (docs/design/algorithms.md, "The learned scorer").
- :class:`SigmoidServing`: a reranker whose scores are each pair's own log-odds (cached
  BlockRank's ``scoring='independent'`` without a scorer, or with an explicit fusion weight):
  ``sigmoid(score)``, or with fusion the fused score's own Platt map (``fused_map``).
- :class:`ZFusion`: list-relative scores (ICR, BlockRank, ``scoring='learned'``): fused with the
  first stage as ``alpha z(first stage) + (1 - alpha) z(reranker)`` (:func:`heedrank.fusion.combine`;
  the first-stage value is its score, ``by="score"``, or the reciprocal rank of the given
  order, ``by="rank"``), or the reranker's own scores, or ``/rerank``'s given order as a
  :class:`PositionPrior`; the probability is the reranker's Platt map for that way of serving
  (:meth:`heedrank.calibration.Calibration.map_for`), non-increasing down the served order.

The two last strategies read the reranker's own score only; a candidate it did not read (NaN:
over the cold budget) keeps its first-stage position (:func:`place_skipped`). ``/search`` and
every caller of :meth:`heedrank.pipeline.Pipeline.search_batch` (``rerank-batch``, ``eval``, the
Ray engine's actors), ``/rerank`` and the calibration fit (:meth:`ZFusion.served_scores`) all go
through here, so a probability, a threshold or a served score means the same number everywhere.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from heedrank.calibration import PlattMap, apply_cutoff, resolve_cutoff
from heedrank.errors import ValidationError
from heedrank.fusion import EPS, combine, reciprocal_ranks, resolve_weight, sigmoid, standardize_list
from heedrank.scorer import Scorer
from heedrank.seam import RerankerServing, serving_of
from heedrank.signals import attention, signal
from heedrank.types import Ranking

FLAT_LIST = ("the reranked documents' scores are all equal (one document, or identical ones): a score "
             "relative to the list, as the default's is, then says nothing of a document (every such list gets "
             "the same number); send it with other candidates to compare them, or serve the reranker with "
             "--opt scoring=independent (HEEDRANK_RERANK_OPTIONS) for each document's own probability of relevance")
"""Served warning for a list-relative scorer over a list whose scores do not differ."""

BY = ("score", "rank", "prior")
"""What stands for the first stage: its scores, fused (``/search``); the reciprocal rank of the
given order, fused (``/rerank`` with a fusion weight); or the given order as a
:class:`PositionPrior` (``/rerank``'s default: documents come without scores)."""

Cutoff = float | str | None
"""``None`` (no cut-off), ``"auto"`` (the strategy's dev-chosen threshold) or a probability."""


@dataclass(frozen=True)
class PositionPrior:
    """The order a list of documents comes in, as a prior the reranker updates, and only when
    the order looks like a first stage's: ``/rerank``'s default.

    For documents at given positions ``i = 0..N-1`` with reranker scores ``r``::

        s_i = z(r)_i - g(T) * weight * log(1 + i)
        T   = sqrt(N - 1) * mean_i(z(r)_i * z(-log(1 + i)))    (agreement, ~N(0, 1) for a random order)
        g   = clip((T - onset) / width, 0, 1)

    so a list whose order agrees with the reranker (a first stage's) keeps a log-rank prior worth
    ``weight`` z-units per unit of ``log(1 + i)``, and a list in an order that carries nothing
    (``T`` near 0: shuffled, alphabetical, a client's own) is ranked by the reranker alone; a
    document the reranker is confident about moves past the prior (a clear outlier has a z-score
    near ``sqrt(N - 1)``). The values are chosen on NFCorpus dev (BM25 top 20, given and shuffled
    orders); docs/results/default.md, "/rerank's default: a position prior", has the table of forms.
    """

    weight: float = 1.0
    onset: float = 0.5
    width: float = 1.0

    def agreement(self, z_reranker: Sequence[float]) -> float:
        """``T``: how much the given order agrees with the reranker (unitless, ~N(0, 1) when it does not)."""
        n = len(z_reranker)
        if n < 2:
            return 0.0
        w = standardize_list([-math.log1p(i) for i in range(n)])
        return math.sqrt(n - 1) * sum(a * b for a, b in zip(z_reranker, w)) / n

    def strength(self, reranker: Sequence[float]) -> float:
        """``g(T) * weight``: z-units per unit of ``log(1 + i)`` the given order is worth for
        these reranker scores (given order), 0 when it agrees with them no more than chance."""
        return self.served(reranker)[1]

    def scores(self, reranker: Sequence[float]) -> list[float]:
        """Served scores ``s`` of documents in their given order (same order out; unitless)."""
        return self.served(reranker)[0]

    def served(self, reranker: Sequence[float]) -> tuple[list[float], float]:
        """:meth:`scores` and :meth:`strength` from one standardisation of the scores."""
        z_reranker = standardize_list([float(s) for s in reranker])
        strength = self.weight * min(1.0, max(0.0, (self.agreement(z_reranker) - self.onset) / self.width))
        return [z - strength * math.log1p(i) for i, z in enumerate(z_reranker)], strength


@dataclass(frozen=True)
class Served:
    """One query as served.

    Attributes:
        ranking: The reranked candidates in served order with their served scores (fused, or
            the reranker's own), cut at the cut-off when one was asked for.
        probabilities: ``{doc_id: P(relevant)}`` of every reranked candidate (before the cut),
            or ``None`` when the reranker has no calibration for this way of serving.
        threshold: The probability the cut-off used, or ``None`` without a cut-off.
        warnings: What the caller should pass on (a calibration that extrapolates; scores that do
            not differ, :data:`FLAT_LIST`).
        order_prior: With ``by="prior"``: the strength the given order got
            (:meth:`PositionPrior.strength`, 0 = none); else ``None``.
        relevance: ``{doc_id: score in [0, 1]}`` of every reranked candidate, the one score a
            user reads: the probability when there is a calibration, else :meth:`ZFusion.relevance`
            of the served scores (with the prior: the reranker's own scores less the prior, in
            their units). Non-increasing down :attr:`ranking`: the order and the score agree.
        without_lm: Candidates the default's scorer scored without the reranker's attention
            (:class:`ScorerServing`); 0 otherwise.
    """

    ranking: Ranking
    probabilities: dict[str, float] | None = None
    threshold: float | None = None
    warnings: tuple[str, ...] = ()
    order_prior: float | None = None
    relevance: dict[str, float] | None = None
    without_lm: int = 0


class ServingStrategy(Protocol):
    """One way of serving a query's candidates from their signals (module docstring).

    Attributes:
        features: The signals it reads, the columns of ``X`` (:func:`heedrank.signals.gather`).
        alpha: Its fusion weight with the first stage, or ``None`` (reported as ``fusion``).
        scale: Spread of its served scores behind ``relevance`` when it has no probability
            (reported as ``score_scale``), or ``None``.
        without_reranker: It scores candidates the reranker did not read from their other
            signals (:meth:`heedrank.stage.RerankStage.serve_without_lm`).
    """

    @property
    def features(self) -> tuple[str, ...]: ...

    @property
    def alpha(self) -> float | None: ...

    @property
    def scale(self) -> float | None: ...

    @property
    def without_reranker(self) -> bool: ...

    def serve(self, candidates: Ranking, X: np.ndarray, cutoff: Cutoff) -> Served:
        """Serve one query: ``candidates`` (``N``, first-stage or given order), ``X`` ``(N, F)``
        float64 signal values (NaN: none), ``cutoff`` resolved (:data:`Cutoff`)."""
        ...

    def priority(self, candidates: Ranking, X: np.ndarray) -> list[str] | None:
        """Doc ids best first by what the strategy knows before the reranker's pass (``X`` with
        the reranker's columns NaN): which cold blocks to encode first when not all fit; ``None``:
        the given order."""
        ...


def _present(candidates: Ranking, column: np.ndarray) -> tuple[Ranking, Ranking, set[str]]:
    """``(read, scores, skipped)`` of one signal column: the candidates with a value in their
    order, those values as a ranking (best first), and the ids without one."""
    finite = np.isfinite(column)
    read = Ranking(candidates.query_id, tuple(h for h, ok in zip(candidates.hits, finite) if ok))
    scores = Ranking.from_hits(candidates.query_id,
                               (replace(h, score=float(v)) for h, v, ok in zip(candidates.hits, column, finite) if ok))
    return read, scores, {h.doc_id for h, ok in zip(candidates.hits, finite) if not ok}


def _fused(first_stage: Ranking, reranked: Ranking, alpha: float, by: str) -> Ranking:
    """The reranked candidates with fused scores, ``alpha z(first) + (1 - alpha) z(reranker)``
    (``by="rank"``: the first stage's reciprocal ranks; a candidate missing from ``first_stage``
    gets its lowest z-score)."""
    ids = {h.doc_id for h in reranked.hits}
    present = [h for h in first_stage.hits if h.doc_id in ids]
    values = reciprocal_ranks(len(present)) if by == "rank" else [float(h.score) for h in present]
    z_first = dict(zip((h.doc_id for h in present), standardize_list(values)))
    low = min(z_first.values(), default=0.0)
    z_reranker = standardize_list([float(h.score) for h in reranked.hits])
    return Ranking.from_hits(reranked.query_id, (
        replace(h, score=float(combine(z_first.get(h.doc_id, low), z, alpha)))
        for h, z in zip(reranked.hits, z_reranker)))


def _cut(ranking: Ranking, probabilities: Mapping[str, float], threshold: float) -> Ranking:
    """The hits at or above ``threshold``, in served order (a prefix when the probability
    does not rise down it); a hit without a probability is dropped."""
    return Ranking(ranking.query_id, tuple(h for h in ranking.hits if probabilities.get(h.doc_id, 0.0) >= threshold))


@dataclass(frozen=True)
class ScorerServing:
    """The default's learned scorer (:class:`heedrank.scorer.Scorer`): every candidate gets the
    logit of the signals it has; the served order, the probability and the cut-off all read it.

    A candidate with no signal a model reads keeps its place below the scored ones, with no
    probability. In a list the reranker read only in part, the attention enters as a step
    (:meth:`heedrank.scorer.Scorer.logits`); ``without_lm`` counts the candidates scored
    without it.
    """

    scorer: Scorer
    features: tuple[str, ...]
    threshold: float = 0.5
    alpha: float | None = None
    scale: float | None = None
    without_reranker: bool = True

    def priority(self, candidates: Ranking, X: np.ndarray) -> list[str] | None:
        """The candidates by the model of the signals at hand (the prior the attention updates),
        best first; those it cannot score after, in the given order."""
        logits = self.scorer.logits(X, self.features)
        key = np.where(np.isfinite(logits), -logits, np.inf)
        return [candidates.hits[i].doc_id for i in np.argsort(key, kind="stable")]

    def serve(self, candidates: Ranking, X: np.ndarray, cutoff: Cutoff) -> Served:
        stepped = self.features.index(self.scorer.stepped) if self.scorer.stepped in self.features else None
        read = np.isfinite(X[:, stepped]) if stepped is not None else np.zeros(len(candidates), dtype=bool)
        step = stepped is not None and 0 < int(read.sum()) < len(candidates)
        logits = self.scorer.logits(X, self.features, step=step)
        scored = np.isfinite(logits)
        without = int((scored & ~read).sum()) if stepped is not None else 0
        low = float(logits[scored].min()) if scored.any() else 0.0
        hits = [replace(h, score=float(s)) for h, s, ok in zip(candidates.hits, logits, scored) if ok]
        hits += [replace(h, score=low - 1.0 - i) for i, h in enumerate(h for h, ok in zip(candidates.hits, scored)
                                                                         if not ok)]
        ranking = Ranking.from_hits(candidates.query_id, hits)
        probabilities = {h.doc_id: sigmoid(float(s)) for h, s, ok in zip(candidates.hits, logits, scored) if ok}
        warnings = ((f"{without} of {len(candidates)} candidates were scored without the reranker's attention "
                     "(cold past the budget or over the request budget): from the scorer's other signals",)
                    if without else ())
        if cutoff is None:
            return Served(ranking, probabilities, warnings=warnings, relevance=probabilities, without_lm=without)
        threshold = float(self.threshold if cutoff == "auto" else cutoff)
        return Served(_cut(ranking, probabilities, threshold), probabilities, threshold, warnings,
                      relevance=probabilities, without_lm=without)


@dataclass(frozen=True)
class SigmoidServing:
    """Scores that are each (query, document) pair's own log-odds, served as ``sigmoid(score)``
    (the same for a document in any list); fused with the first stage (``alpha``), in the fused
    order, with the fused score's own map ``sigmoid(a f + b)`` when there is one (``fused_map``,
    fitted on dev at the reranker's fusion weight). A candidate without a score keeps its
    first-stage position (:func:`place_skipped`).

    Attributes:
        features: One signal: the reranker's own.
        alpha: Fusion weight, or ``None``.
        by: ``"score"`` or ``"rank"`` (:data:`BY`).
        threshold: The ``"auto"`` cut-off's probability.
        fused_map: ``(a, b)`` with fusion, or ``None``: each pair's own probability.
        fused_threshold: The ``"auto"`` cut-off of the fused map, or ``None``.
    """

    features: tuple[str, ...] = (attention.NAME,)
    alpha: float | None = None
    by: str = "score"
    threshold: float = 0.5
    fused_map: tuple[float, float] | None = None
    fused_threshold: float | None = None
    scale: float | None = None
    without_reranker: bool = False

    def priority(self, candidates: Ranking, X: np.ndarray) -> list[str] | None:
        """``None``: the given order (the reranker's own score is all it reads)."""
        return None

    def serve(self, candidates: Ranking, X: np.ndarray, cutoff: Cutoff) -> Served:
        kept, reranked, skipped = _present(candidates, X[:, 0])
        ranking = reranked if self.alpha is None else _fused(kept, reranked, self.alpha, self.by)
        auto = self.threshold
        if self.fused_map is not None and self.alpha is not None:  # /search: the fused score's own map
            a, b = self.fused_map
            probabilities = {h.doc_id: sigmoid(a * float(h.score) + b) for h in ranking.hits}
            auto = self.fused_threshold if self.fused_threshold is not None else auto
        else:
            probabilities = {h.doc_id: sigmoid(float(h.score)) for h in reranked.hits}
        if cutoff is None:
            return place_skipped(Served(ranking, probabilities, relevance=probabilities), candidates, skipped)
        threshold = float(auto if cutoff == "auto" else cutoff)
        return place_skipped(Served(_cut(ranking, probabilities, threshold), probabilities, threshold,
                                    relevance=probabilities), candidates, skipped)


@dataclass(frozen=True)
class ZFusion:
    """List-relative scores served z-scored over the list (module docstring).

    Attributes:
        features: One signal: the reranker's own.
        alpha: Fusion weight of the first stage in [0, 1], or ``None``: the reranker alone.
        by: :data:`BY`.
        plat: The reranker's calibration map for ``(alpha, by)``, or ``None`` when it has none.
        scale: Spread of the served scores for :meth:`relevance` (``sigmoid(score / scale)``),
            or ``None`` when they are probabilities already. With ``by="prior"``: the reranker's
            own ``score_scale``, for its own scores less the prior in their units
            (``sd(r) * strength * log(1 + i)``), so that relevance follows the served order.
        prior: The position prior of ``by="prior"`` (``alpha`` is then ``None``).
    """

    features: tuple[str, ...] = (attention.NAME,)
    alpha: float | None = None
    by: str = "score"
    plat: PlattMap | None = None
    scale: float | None = None
    prior: PositionPrior = PositionPrior()
    without_reranker: bool = False

    def __post_init__(self) -> None:
        if self.by not in BY:
            raise ValidationError(f"by must be one of {BY}, got {self.by!r}")

    def served_scores(self, first_stage: Sequence[float], reranker: Sequence[float]) -> list[float]:
        """Served scores of one query's candidates (same order in, same order out).

        Args:
            first_stage: ``(N,)`` first-stage scores (ignored with ``by="rank"``: the candidates
                are then taken to be in the given order, and their reciprocal ranks stand in).
            reranker: ``(N,)`` reranker scores.
        """
        if self.by == "prior":
            return self.prior.scores(reranker)
        if self.alpha is None:
            return [float(s) for s in reranker]
        first = reciprocal_ranks(len(reranker)) if self.by == "rank" else [float(s) for s in first_stage]
        z_first, z_reranker = standardize_list(first), standardize_list([float(s) for s in reranker])
        return [float(combine(f, r, self.alpha)) for f, r in zip(z_first, z_reranker)]

    def priority(self, candidates: Ranking, X: np.ndarray) -> list[str] | None:
        """``None``: the given order (the reranker's own score is all it reads)."""
        return None

    def serve(self, candidates: Ranking, X: np.ndarray, cutoff: Cutoff) -> Served:
        kept, reranked, skipped = _present(candidates, X[:, 0])
        return place_skipped(self.apply(kept, reranked, cutoff), candidates, skipped)

    def apply(self, first_stage: Ranking, reranked: Ranking, cutoff: Cutoff = None) -> Served:
        """Serve one query's reranked candidates (all of them read).

        Args:
            first_stage: The candidates in first-stage (or given) order, with their scores;
                a reranked candidate missing from it gets its lowest z-score.
            reranked: The reranker's result over those candidates.
            cutoff: :data:`Cutoff`.

        Raises:
            ValidationError: a cut-off without a calibration map.
        """
        if cutoff is not None and self.plat is None:
            raise ValidationError("a cutoff needs a calibration map (ServePolicy.of refuses it with a message)")
        strength = None
        if self.by == "prior":
            own = {h.doc_id: h for h in reranked.hits}
            given = [own[h.doc_id] for h in first_stage.hits if h.doc_id in own]
            placed = {g.doc_id for g in given}
            given += [h for h in reranked.hits if h.doc_id not in placed]  # not in the given list: last
            raw = [float(h.score) for h in given]
            prior_scores, strength = self.prior.served(raw)
            ranking = Ranking.from_hits(reranked.query_id, (replace(h, score=s) for h, s in zip(given, prior_scores)))
            # probability and relevance read the served score (the prior inside it), so that they
            # agree with the served order: the map reads the served z-scores, the scale the served
            # scores back in the reranker's units, mean + sd * s (= r - sd * strength * log(1 + i))
            mu, sd = statistics.fmean(raw), statistics.pstdev(raw) if len(raw) > 1 else 0.0
            sd = sd if sd > EPS else 1.0  # as :func:`heedrank.fusion.standardize`
            scored = Ranking.from_hits(reranked.query_id, (replace(h, score=mu + sd * s)
                                                           for h, s in zip(given, prior_scores)))
            z_served = dict(zip((h.doc_id for h in given), prior_scores))
        elif self.alpha is None:
            ranking = scored = reranked
        else:
            ranking = scored = _fused(first_stage, reranked, self.alpha, self.by)
        scores = [float(h.score) for h in scored.hits]
        flat = (FLAT_LIST,) if scores and max(scores) - min(scores) <= EPS else ()
        if self.plat is None:
            relevance = dict(zip(scored.doc_ids, self.relevance(scores)))
            return Served(ranking, warnings=flat, order_prior=strength, relevance=relevance)
        if self.by == "prior":  # the served z-scores (a fixed map of ``scores``, order-preserving)
            mapped = [z_served[d] for d in scored.doc_ids]
        else:
            mapped = standardize_list(scores) if self.alpha is None else scores
        probs, threshold, _ = apply_cutoff(mapped, 1.0 if cutoff is None else cutoff, self.plat)
        probabilities = dict(zip(scored.doc_ids, probs))
        if cutoff is None:
            return Served(ranking, probabilities, warnings=flat, order_prior=strength, relevance=probabilities)
        far = self.plat.extrapolation(len(scores))
        return Served(_cut(ranking, probabilities, threshold), probabilities, threshold,
                      ((far,) if far is not None else ()) + flat, strength, probabilities)

    def relevance(self, scores: Sequence[float]) -> list[float]:
        """Scores in [0, 1], each from its own served score: ``sigmoid(score / scale)``
        (0.5 at a served score of 0: the candidates' mean when fused, as much attention as the
        content-free query for calibrated attention), or the scores as they are when
        :attr:`scale` is ``None`` (probabilities, or a plugin's own scores)."""
        if self.scale is None:
            return [float(s) for s in scores]
        return [sigmoid(float(s) / self.scale) for s in scores]


@dataclass(frozen=True)
class ServePolicy:
    """How one request's reranked candidates are served: the strategy picked once
    (:meth:`of`), the request's cut-off, and what the signals read of the candidates.

    Attributes:
        strategy: :class:`ScorerServing`, :class:`SigmoidServing` or :class:`ZFusion`.
        cutoff: :data:`Cutoff`, resolved.
        own: The signal the reranker's own scores are (:attr:`heedrank.seam.RerankerServing.signal`):
            its result when no reranker pass ran.
        ranked: The candidates' order is a first stage's (the ``rank`` signal reads it);
            ``False`` for ``/rerank``'s given order.
    """

    strategy: ServingStrategy
    cutoff: Cutoff = None
    own: str = ""
    ranked: bool = True

    @classmethod
    def of(cls, reranker: object, *, fusion: float | str | None, cutoff: float | str | None = None,
           by: str = "score", method: str = "", scale: float | None = None) -> ServePolicy:
        """The policy of one request, resolved once.

        The strategy: the reranker's scorer (:attr:`heedrank.seam.RerankerServing.scorer`) for
        ``fusion="default"`` or none, and for ``/rerank`` (``by="prior"``); else
        :class:`SigmoidServing` for a reranker whose scores are each pair's log-odds (its
        record's ``independent``); else :class:`ZFusion` with the reranker's Platt map.

        Args:
            reranker: The built reranker, read through its :class:`heedrank.seam.RerankerServing`
                (:func:`heedrank.seam.serving_of`).
            fusion: ``"default"`` (the reranker's recorded weight; none when it records none),
                ``None``/``"none"`` (no fusion) or a number in [0, 1].
            cutoff: ``None``/``"none"``, ``"auto"`` or a probability.
            by: :data:`BY`.
            method: The method's name, for messages.
            scale: Override of the reranker's ``score_scale`` (``HEEDRANK_RERANK_SCORE_SCALE``).

        Raises:
            ValidationError: a bad fusion, cutoff or ``by`` value; a cutoff the reranker has no
                map for (the message says what to do).
        """
        if by not in BY:
            raise ValidationError(f"by must be one of {BY}, got {by!r}")
        cut, traits = resolve_cutoff(cutoff), serving_of(reranker)
        own = (traits.signal,)
        strategy: ServingStrategy
        if traits.scorer is not None and (fusion in (None, "default") or by == "prior"):
            # the signals the reranker's pass would give, only when its own scores are one of them
            features = tuple(f for f in traits.scorer.features if f == traits.signal or not signal(f).reads_reranker)
            strategy = ScorerServing(traits.scorer, features, traits.scorer_threshold)
            # only a first stage's order is a signal: /rerank's given order (by "prior" or "rank") is a client's
            return cls(strategy, cut, traits.signal, ranked=by == "score")
        alpha = None if by == "prior" else resolve_weight(fusion, traits.default_fusion)
        if traits.independent is not None:  # log-odds of each pair: sigmoid, no prior
            ind = traits.independent
            fused_map = ind.fused_map if alpha is not None else None
            strategy = SigmoidServing(own, alpha, "score" if by == "prior" else by, ind.threshold, fused_map,
                                      ind.fused_threshold if fused_map else None)
        else:
            spread: float | None = 1.0  # fused: z-scores
            if alpha is None:
                spread = None if traits.score_scale is None else (scale if scale is not None else traits.score_scale)
            strategy = ZFusion(own, alpha, by, _map(traits, method, alpha, by=by, required=cut is not None), spread)
        return cls(strategy, cut, traits.signal, ranked=by == "score")

    @property
    def features(self) -> tuple[str, ...]:
        """The signals the strategy reads (:func:`heedrank.signals.gather`'s columns)."""
        return self.strategy.features

    @property
    def reads_reranker(self) -> bool:
        """A reranker pass must run: one of :attr:`features` is the reranker's output."""
        return any(signal(f).reads_reranker for f in self.features)

    @property
    def alpha(self) -> float | None:
        """The fusion weight with the first stage the strategy uses, or ``None``."""
        return self.strategy.alpha

    @property
    def scale(self) -> float | None:
        """The spread behind ``relevance`` when it is no probability, or ``None``."""
        return self.strategy.scale

    @property
    def serves_partly(self) -> bool:
        """A list the reranker read only in part can be served: the strategy scores the rest from
        their other signals, or, in a first stage's order without a cut-off, they keep their
        first-stage places (:func:`place_skipped`; not in ``/rerank``'s given order, a client's)."""
        return self.strategy.without_reranker or (self.cutoff is None and self.ranked)

    def priority(self, candidates: Ranking, X: np.ndarray) -> list[str] | None:
        """Which candidates the reranker should read first when not all fit (:meth:`ServingStrategy.priority`)."""
        return self.strategy.priority(candidates, X)

    def serve(self, candidates: Ranking, X: np.ndarray) -> Served:
        """Serve one query: its candidates (first-stage or given order) and their ``(N, F)``
        signal matrix over :attr:`features` (:func:`heedrank.signals.gather`)."""
        return self.strategy.serve(candidates, X, self.cutoff)


def place_skipped(served: Served, first_stage: Ranking, skipped: Collection[str]) -> Served:
    """``served`` (over the candidates that were reranked) with the candidates that were not
    (``skipped``: blocks over the request's recompute budget, docs/results/store.md "Bounded
    tiers") put back where the first stage had them.

    The rule: a skipped candidate keeps its first-stage position among all candidates; the
    reranked ones fill the other positions in served order. So no reranked score is ever
    compared with a first-stage one: the reranker only permutes the positions it scored. A
    skipped candidate's served score is set between its neighbours' (evenly spaced, or 1 apart
    past the ends) so that the ``(-score, doc_id)`` order is the placed order; it has no
    probability and no relevance. Deterministic for a given first stage and served order.

    Args:
        served: The reranked candidates as served, without a cut-off (a request with a
            cut-off reranks every candidate: :meth:`heedrank.pipeline.RerankerCache.rerank`).
        first_stage: Every candidate in first-stage order.
        skipped: Doc ids of the candidates that were not reranked.

    Raises:
        ValidationError: ``served`` was cut at a cut-off.
    """
    if not skipped:
        return served
    if served.threshold is not None:
        raise ValidationError("internal error: skipped candidates cannot be placed in a list cut at a cut-off")
    order = iter(served.ranking.hits)
    slots: list[tuple[str, float | None]] = []  # (doc_id, served score or None for a skipped one)
    for h in first_stage.hits:
        if h.doc_id in skipped:
            slots.append((h.doc_id, None))
        else:
            nxt = next(order, None)
            if nxt is not None:
                slots.append((nxt.doc_id, float(nxt.score)))
    slots += [(h.doc_id, float(h.score)) for h in order]  # reranked but not in first_stage: last
    if all(score is None for _, score in slots):  # nothing reranked: the first stage as it is
        return replace(served, ranking=first_stage)
    scores: list[float] = []
    i = 0
    while i < len(slots):
        if slots[i][1] is not None:
            scores.append(float(slots[i][1]))  # type: ignore[arg-type]
            i += 1
            continue
        j = i
        while j < len(slots) and slots[j][1] is None:
            j += 1
        above = scores[-1] if scores else None
        below = slots[j][1] if j < len(slots) else None
        m = j - i
        for r in range(1, m + 1):
            if above is not None and below is not None:
                scores.append(above - (above - below) * r / (m + 1))
            elif above is not None:
                scores.append(above - r)
            else:
                scores.append(float(below) + (m + 1 - r))  # type: ignore[arg-type]
        i = j
    hits = {h.doc_id: h for h in first_stage.hits} | {h.doc_id: h for h in served.ranking.hits}
    ranking = Ranking.from_hits(served.ranking.query_id,
                                (replace(hits[d], score=sc) for (d, _), sc in zip(slots, scores)))
    return replace(served, ranking=ranking)


def share_identical(served: Served, key: Mapping[str, str]) -> Served:
    """``served`` with documents of one ``key`` (their text) sharing one score and one
    probability: each group's best, so identical texts sit together, in served order by
    ``(-score, doc_id)``.

    Args:
        served: One query as served.
        key: ``{doc_id: text}`` of the served documents.
    """
    best: dict[str, float] = {}
    for h in served.ranking.hits:
        k = key[h.doc_id]
        best[k] = max(best.get(k, h.score), h.score)
    if len(best) == len(served.ranking):
        return served
    ranking = Ranking.from_hits(served.ranking.query_id,
                                (replace(h, score=best[key[h.doc_id]]) for h in served.ranking.hits))
    return Served(ranking, _group_best(served.probabilities, key), served.threshold, served.warnings,
                  served.order_prior, _group_best(served.relevance, key))


def _group_best(values: dict[str, float] | None, key: Mapping[str, str]) -> dict[str, float] | None:
    """Each document's value replaced by the best of its ``key`` group (``None`` stays ``None``)."""
    if values is None:
        return None
    best: dict[str, float] = {}
    for d, v in values.items():
        best[key.get(d, d)] = max(best.get(key.get(d, d), v), v)
    return {d: best[key.get(d, d)] for d in values}


def _map(traits: RerankerServing, method: str, alpha: float | None, *, by: str, required: bool) -> PlattMap | None:
    """The map of a reranker's calibration for scores served with fusion weight ``alpha`` and
    ``by``, or ``None``.

    Raises:
        ValidationError: ``required`` (a cut-off was asked for) and there is no map.
    """
    if traits.calibration is None:
        if required:
            raise ValidationError(f"rerank method {method!r} has no calibrated scores, so it cannot apply a cutoff; "
                                  "use the default configuration (blockrank-cached with its weights card), or top_k")
        return None
    try:
        return traits.calibration.map_for(alpha, by="score" if by == "prior" else by)
    except ValidationError:
        if required:
            raise
        return None
