"""What is served after reranking, in one place: fusion with the first stage, the calibrated
probability of relevance, the cut-off, and the [0, 1] relevance score of ``/rerank``.

One record, :class:`ServePolicy`, is resolved once per request (or batch) from the built
reranker and the request (:meth:`ServePolicy.of`), and one method applies it to one query
(:meth:`ServePolicy.apply`). ``/search`` and every caller of
:meth:`heedrank.pipeline.Pipeline.search_batch` (``rerank-batch``, ``eval beir``/``trec-dl``,
the Ray engine's actors), ``/rerank``, and the calibration fit
(:func:`heedrank.lab.cutoff_eval.served`, through :meth:`ServePolicy.served_scores`) all go
through it, so a probability, a threshold or a fused score means the same number everywhere.

Served scores (unitless), for one query's ``N`` reranked candidates:

- with a fusion weight ``alpha``: ``alpha z(first stage) + (1 - alpha) z(reranker)``
  (:func:`heedrank.fusion.fuse`; the first-stage value is its score, ``by="score"``, or the
  reciprocal rank of the order the documents came in, ``by="rank"``, for ``/rerank``);
- without (``alpha = None``): the reranker's own scores, ranked as they are; the calibration
  map then reads them z-scored over the candidates.

The probability is the reranker's Platt map for that way of serving
(:class:`heedrank.calibration.Calibration`, :meth:`~heedrank.calibration.Calibration.map_for`),
non-increasing down the served order, so a cut-off keeps a prefix.

The default (cached BlockRank with ``scoring='independent'`` and a card holding the default's
scorer) is served by that scorer (:meth:`ServePolicy.apply_scorer`, :mod:`heedrank.scorer`): every
candidate gets one logit from the signals it has (the reranker's list-independent log-odds, the
embedder's cosine, its first-stage place; ``/rerank``'s given order is a client's and is not read),
and the order, ``relevance`` (``sigmoid`` of the logit) and the cut-off all read that number, the
same for a document whatever else the list holds.

Without that scorer, a reranker whose scores are log-odds of P(relevant) of each (query, document) pair on their own
(its record's ``independent``: cached BlockRank's ``scoring='independent'``,
:mod:`heedrank.reranker.cached.independent`) is served differently: the probability is
``sigmoid(score)`` of the reranker's own score, the same whatever else the list holds; without
fusion (and for ``/rerank``, whose given order is then not used: a position prior would make the
probability depend on the list) the results are in that order, so ``relevance`` is non-increasing
down them. With fusion (``/search``) the order is the fused one and the probability is the
reranker's Platt map of the fused score (``independent.fused_map``, fitted on dev), so it too is
non-increasing down the order; it weighs the first stage's evidence over the query's candidates.
A cut-off keeps, in served order, the hits at or above the threshold (a prefix).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from heedrank.calibration import PlattMap, apply_cutoff, resolve_cutoff
from heedrank.errors import ValidationError
from heedrank.fusion import EPS, combine, reciprocal_ranks, resolve_weight, sigmoid, standardize_list
from heedrank.scorer import Scorer, rank_feature
from heedrank.seam import serving_of

FLAT_LIST = ("the reranked documents' scores are all equal (one document, or identical ones): a score "
             "relative to the list, as the default's is, then says nothing of a document (every such list gets "
             "the same number); send it with other candidates to compare them, or serve the reranker with "
             "--opt scoring=independent (HEEDRANK_RERANK_OPTIONS) for each document's own probability of relevance")
"""Served warning for a list-relative scorer over a list whose scores do not differ."""
from heedrank.types import Ranking

BY = ("score", "rank", "prior")
"""What stands for the first stage: its scores, fused (``/search``); the reciprocal rank of the
given order, fused (``/rerank`` with a fusion weight); or the given order as a
:class:`PositionPrior` (``/rerank``'s default: documents come without scores)."""


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
            user reads: the probability when there is a calibration, else :meth:`ServePolicy.relevance`
            of the served scores (with the prior: the reranker's own scores less the prior, in
            their units). Non-increasing down :attr:`ranking`: the order and the score agree.
        without_lm: Candidates the default's scorer scored without the reranker's attention
            (:meth:`ServePolicy.apply_scorer`); 0 otherwise.
    """

    ranking: Ranking
    probabilities: dict[str, float] | None = None
    threshold: float | None = None
    warnings: tuple[str, ...] = ()
    order_prior: float | None = None
    relevance: dict[str, float] | None = None
    without_lm: int = 0


@dataclass(frozen=True)
class ServePolicy:
    """How one request's reranked candidates are served (see the module docstring).

    Attributes:
        alpha: Fusion weight of the first stage in [0, 1], or ``None``: the reranker alone.
        by: ``"score"`` or ``"rank"`` (:data:`BY`).
        plat: The reranker's calibration map for ``(alpha, by)``, or ``None`` when it has none.
        cutoff: ``None`` (no cut-off), ``"auto"`` (the map's dev-chosen threshold) or a
            probability.
        scale: Spread of the served scores for :meth:`relevance` (``sigmoid(score / scale)``),
            or ``None`` when they are probabilities already. With ``by="prior"``: the reranker's
            own ``score_scale``, for its own scores less the prior in their units
            (``sd(r) * strength * log(1 + i)``), so that relevance follows the served order.
        prior: The position prior of ``by="prior"`` (``alpha`` is then ``None``).
        absolute: For a reranker serving each pair's own log-odds (its record's ``independent``,
            module docstring), the ``"auto"`` cut-off's probability; ``None`` for any other.
        fused_map: With ``absolute`` and fusion: ``(a, b)``, the probability of a fused score
            ``f`` is ``sigmoid(a f + b)`` (the record's ``independent.fused_map``, fitted on dev at
            its fusion weight), and ``fused_threshold`` its ``"auto"`` cut-off; ``None``: each
            pair's own probability.
    """

    alpha: float | None = None
    by: str = "score"
    plat: PlattMap | None = None
    cutoff: float | str | None = None
    scale: float | None = None
    prior: PositionPrior = PositionPrior()
    absolute: float | None = None
    fused_map: tuple[float, float] | None = None
    fused_threshold: float | None = None
    scorer: Scorer | None = None
    scorer_threshold: float = 0.5
    rank: bool = True
    signal: str = "attention"

    def __post_init__(self) -> None:
        if self.by not in BY:
            raise ValidationError(f"by must be one of {BY}, got {self.by!r}")
        if self.cutoff is not None and self.plat is None and self.absolute is None and self.scorer is None:
            raise ValidationError("a cutoff needs a calibration map (ServePolicy.of refuses it with a message)")

    @classmethod
    def of(cls, reranker: Any, *, fusion: float | str | None, cutoff: float | str | None = None,
           by: str = "score", method: str = "", scale: float | None = None) -> ServePolicy:
        """The policy of one request, resolved once.

        Args:
            reranker: The built reranker; read through its :class:`heedrank.seam.RerankerServing`
                (:func:`heedrank.seam.serving_of`): the default's ``scorer`` (served by it when
                ``fusion`` is ``"default"``, and for ``/rerank``), ``default_fusion`` (the weight its
                card records, for ``fusion="default"``), ``independent``, ``calibration`` (its Platt
                maps) and ``score_scale``; a plug-in without the record: none of them.
            fusion: ``"default"`` (the reranker's recorded weight; none when it records none),
                ``None``/``"none"`` (no fusion) or a number in [0, 1].
            cutoff: ``None``/``"none"``, ``"auto"`` or a probability.
            by: :data:`BY`.
            method: The method's name, for messages.
            scale: Override of the reranker's ``score_scale`` (``HEEDRANK_RERANK_SCORE_SCALE``).

        Raises:
            ValidationError: a bad fusion or cutoff value; a cutoff the reranker has no map
                for (the message says what to do).
        """
        cut = resolve_cutoff(cutoff)
        traits = serving_of(reranker)
        if traits.scorer is not None and (fusion in (None, "default") or by == "prior"):  # the default's scorer
            # /rerank's given order is a client's: its position is not a signal (module docstring)
            return cls(None, "score", None, cut, None, scorer=traits.scorer,
                       scorer_threshold=traits.scorer_threshold, rank=by != "prior", signal=traits.signal)
        alpha = None if by == "prior" else resolve_weight(fusion, traits.default_fusion)
        if traits.independent is not None:  # log-odds of each pair: sigmoid, no prior
            ind = traits.independent
            fused_map = ind.fused_map if alpha is not None else None
            return cls(alpha, "score" if by == "prior" else by, None, cut, None, absolute=ind.threshold,
                       fused_map=fused_map, fused_threshold=ind.fused_threshold if fused_map else None)
        plat = _map(traits.calibration, method, alpha, by=by, required=cut is not None)
        if alpha is not None:
            spread: float | None = 1.0  # z-scores
        elif traits.score_scale is None:
            spread = None
        else:
            spread = scale if scale is not None else float(traits.score_scale)
        return cls(alpha, by, plat, cut, spread)

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

    def apply(self, first_stage: Ranking, reranked: Ranking) -> Served:
        """Serve one query.

        Args:
            first_stage: The candidates in first-stage (or given) order, with their scores;
                a reranked candidate missing from it gets its lowest z-score.
            reranked: The reranker's result over those candidates.

        Returns:
            The :class:`Served` query.
        """
        if self.absolute is not None:
            return self._apply_absolute(first_stage, reranked)
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
            ranking = scored = self._fused(first_stage, reranked)
        scores = [float(h.score) for h in scored.hits]
        flat = (FLAT_LIST,) if scores and max(scores) - min(scores) <= EPS else ()
        if self.plat is None:
            relevance = dict(zip(scored.doc_ids, self.relevance(scores)))
            return Served(ranking, warnings=flat, order_prior=strength, relevance=relevance)
        if self.by == "prior":  # the served z-scores (a fixed map of ``scores``, order-preserving)
            mapped = [z_served[d] for d in scored.doc_ids]
        else:
            mapped = standardize_list(scores) if self.alpha is None else scores
        probs, threshold, _ = apply_cutoff(mapped, 1.0 if self.cutoff is None else self.cutoff, self.plat)
        probabilities = dict(zip(scored.doc_ids, probs))
        if self.cutoff is None:
            return Served(ranking, probabilities, warnings=flat, order_prior=strength, relevance=probabilities)
        # the documents at or above the threshold, in served order (a prefix)
        kept = Ranking(ranking.query_id, tuple(h for h in ranking.hits if probabilities[h.doc_id] >= threshold))
        far = self.plat.extrapolation(len(scores))
        return Served(kept, probabilities, threshold, ((far,) if far is not None else ()) + flat, strength,
                      probabilities)

    def _fused(self, first_stage: Ranking, reranked: Ranking) -> Ranking:
        """The reranked candidates with fused scores (:meth:`served_scores`'s formula; a candidate
        missing from ``first_stage`` gets its lowest z-score)."""
        assert self.alpha is not None
        ids = {h.doc_id for h in reranked.hits}
        present = [h for h in first_stage.hits if h.doc_id in ids]
        values = reciprocal_ranks(len(present)) if self.by == "rank" else [float(h.score) for h in present]
        z_first = dict(zip((h.doc_id for h in present), standardize_list(values)))
        low = min(z_first.values(), default=0.0)
        z_reranker = standardize_list([float(h.score) for h in reranked.hits])
        return Ranking.from_hits(reranked.query_id, (
            replace(h, score=float(combine(z_first.get(h.doc_id, low), z, self.alpha)))
            for h, z in zip(reranked.hits, z_reranker)))

    def _apply_absolute(self, first_stage: Ranking, reranked: Ranking) -> Served:
        """:meth:`apply` for a reranker whose scores are each pair's log-odds (module docstring)."""
        assert self.absolute is not None
        ranking = reranked if self.alpha is None else self._fused(first_stage, reranked)
        auto = self.absolute
        if self.fused_map is not None and self.alpha is not None:  # /search: the fused score's own map
            a, b = self.fused_map
            probabilities = {h.doc_id: sigmoid(a * float(h.score) + b) for h in ranking.hits}
            auto = self.fused_threshold if self.fused_threshold is not None else auto
        else:
            probabilities = {h.doc_id: sigmoid(float(h.score)) for h in reranked.hits}
        if self.cutoff is None:
            return Served(ranking, probabilities, relevance=probabilities)
        threshold = float(auto if self.cutoff == "auto" else self.cutoff)
        kept = Ranking(ranking.query_id, tuple(h for h in ranking.hits if probabilities[h.doc_id] >= threshold))
        return Served(kept, probabilities, threshold, relevance=probabilities)

    def apply_scorer(self, candidates: Ranking, attention: Ranking, dense: Mapping[str, float],
                     bm25: Mapping[str, float] | None = None) -> Served:
        """Serve one query by the default's scorer (:mod:`heedrank.scorer`): every candidate gets
        the logit of the signals it has, and the served order, the probability and the cut-off
        all read that one number.

        Args:
            candidates: Every candidate, in first-stage (or given) order.
            attention: The reranker's scores of the candidates it read, the scorer's :attr:`signal`
                (cached BlockRank's list-independent log-odds; the others, cold past the budget or
                over the request budget, have no ``attention``).
            dense: ``{doc_id: cosine}`` of the candidates with a dense signal.
            bm25: ``{doc_id: BM25 score}`` of the candidates the index's BM25 holds
                (:meth:`heedrank.index.store.Index.bm25_scores`); ``None``: no ``bm25`` signal.

        Returns:
            The :class:`Served` query; its ``without_lm`` counts the candidates scored without
            the attention signal. A candidate with no signal a model reads (no attention and no
            dense vector) keeps its place below the scored ones, with no probability.
        """
        assert self.scorer is not None
        att = {h.doc_id: float(h.score) for h in attention.hits}
        scored: list[tuple[Any, float]] = []
        unscored = []
        without = 0
        # read in part: attention steps from the model without it (one scale, Scorer.logit)
        step = self.signal == "attention" and 0 < len(att.keys() & {h.doc_id for h in candidates.hits}) < len(candidates)
        for i, h in enumerate(candidates.hits):
            x: dict[str, float | None] = {"attention": None, "dense": dense.get(h.doc_id),
                                          "rank": rank_feature(i) if self.rank else None,
                                          "bm25": None if bm25 is None else bm25.get(h.doc_id)}
            x[self.signal] = att.get(h.doc_id, x.get(self.signal))
            got = self.scorer.logit(x, step=step)
            if got is None:
                unscored.append(h)
                continue
            without += self.signal == "attention" and h.doc_id not in att
            scored.append((h, got[0]))
        low = min((s for _, s in scored), default=0.0)
        hits = [replace(h, score=s) for h, s in scored]
        hits += [replace(h, score=low - 1.0 - i) for i, h in enumerate(unscored)]
        ranking = Ranking.from_hits(candidates.query_id, hits)
        probabilities = {h.doc_id: sigmoid(s) for h, s in scored}
        warnings = ((f"{without} of {len(candidates)} candidates were scored without the reranker's attention "
                     "(cold past the budget or over the request budget): from the dense, BM25 and first-stage signals",)
                    if without else ())
        if self.cutoff is None:
            return Served(ranking, probabilities, warnings=warnings, relevance=probabilities, without_lm=without)
        threshold = float(self.scorer_threshold if self.cutoff == "auto" else self.cutoff)
        kept = Ranking(ranking.query_id, tuple(h for h in ranking.hits if probabilities.get(h.doc_id, 0.0) >= threshold))
        return Served(kept, probabilities, threshold, warnings, relevance=probabilities, without_lm=without)

    def relevance(self, scores: Sequence[float]) -> list[float]:
        """Scores in [0, 1], each from its own served score: ``sigmoid(score / scale)``
        (0.5 at a served score of 0: the candidates' mean when fused, as much attention as the
        content-free query for calibrated attention), or the scores as they are when
        :attr:`scale` is ``None`` (probabilities, or a plugin's own scores)."""
        if self.scale is None:
            return [float(s) for s in scores]
        return [sigmoid(float(s) / self.scale) for s in scores]


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


def _map(calibration: Any, method: str, alpha: float | None, *, by: str, required: bool) -> PlattMap | None:
    """The map of a reranker's ``calibration`` for scores served with fusion weight ``alpha`` and
    ``by``, or ``None``.

    Raises:
        ValidationError: ``required`` (a cut-off was asked for) and there is no map.
    """
    if calibration is None:
        if required:
            raise ValidationError(f"rerank method {method!r} has no calibrated scores, so it cannot apply a cutoff; "
                                  "use the default configuration (blockrank-cached with its weights card), or top_k")
        return None
    try:
        plat: PlattMap = calibration.map_for(alpha, by="score" if by == "prior" else by)
    except ValidationError:
        if required:
            raise
        return None
    return plat
