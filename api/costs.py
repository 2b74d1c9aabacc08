"""What each reranking method costs per candidate on this service, warm and cold, so that a
request the per-request budget cannot hold is refused up front instead of reranking nothing.

Two figures per method (seconds per candidate): **warm**, its candidates' blocks read (from the
document KV store or the RAM tier: cached BlockRank's ``/search`` once the store is filled), and
**cold**, each candidate's block encoded now (cached BlockRank's ``/rerank`` of new documents).
A method that stores no blocks (icr, blockrank, dense) reads every candidate's full text each
time: its two figures are one.

One :class:`MethodCosts` per service (:attr:`heedrank.api.runtime.Runtime.costs`), known before
the first request: the start-up warm-up times the served method (:func:`measure`: a cold pass
of :data:`COST_DOCUMENTS` new documents, then a warm pass of the same ones; ``Settings.warmup``)
and seeds both figures (:meth:`MethodCosts.seed`); another method, or other options, is timed
likewise the first time a ``/search`` builds it (:func:`heedrank.api.routes.search.measure_first_build`).
The requests served then refine them, as running means: a reranking whose candidates were all
warm (no block cache misses) teaches the warm figure, all cold the cold one (a mix teaches
neither); a request stopped by the budget (``HEEDRANK_REQUEST_BUDGET_S``) teaches a lower bound,
the seconds it ran over its candidates (:meth:`MethodCosts.stopped`; of the cold figure alone for
a method that reads stored blocks: its time may have gone to encoding).

From them, :meth:`MethodCosts.max_candidates` is the most candidates that fit the budget.
``GET /info`` shows both per method (:func:`budget_limits`: ``reranker.limits.<method>``'s
``seconds_per_candidate``, ``max_candidates_in_budget`` and ``max_documents_in_budget``, each
``{"warm": ..., "cold": ...}``, ``null`` where not measured), and a request past them gets a
422 at once that names the figure, unless its method can answer in part (:func:`serves_in_part`:
the default's scorer reads as many candidates with the LM as fit and scores the rest from its
other signals): ``/search`` against the warm figure (the store fills; cold candidates are bounded
by the recompute budget), ``/rerank`` against the cold one (its documents are new; not with
``deadline_ms``, whose client asked for an answer by then, nor with a smaller
``max_tokens_per_doc``, cheaper than measured).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heedrank.protocols import RerankResult
    from heedrank.types import Document, Query

HEADROOM = 0.9
"""Share of the budget a request is planned to fill (the rest: the first stage, queueing, noise)."""

WARM, COLD = "warm", "cold"
KINDS = (WARM, COLD)
"""The two figures of a method: its candidates' blocks read (warm) or encoded now (cold)."""

COST_DOCUMENTS = 8
"""Documents of a timed pass (:func:`measure`): at start-up for the served method, at the first
build for another; each long enough to be cut to the method's per-document token budget."""

_WORDS = ("attention reranking reads which passages a language model looks at when it reads a query and "
          "scores each passage by the attention it draws from the query tokens at one layer").split()
_PROBES = itertools.count()


def probe_documents(n: int, words: int = 220) -> list[Document]:
    """``n`` documents of ``words`` words each, their texts new to this process (a counter in
    each), so that a cached reranker holds no block of them yet (:func:`measure`'s cold pass).
    220 words are at least 220 LM tokens: every method cuts them to its own per-document budget
    (128 or 160 by default), as it cuts most real documents."""
    from heedrank.types import Document

    probe = next(_PROBES)
    return [Document(f"cost-probe-{probe}-{i}",
                     f"probe {probe} passage {i}: " + " ".join(_WORDS[(i + j) % len(_WORDS)] for j in range(words)))
            for i in range(n)]


def measure(rerank: Callable[[Query, Sequence[Document]], RerankResult], *, stored_blocks: bool,
            documents: int | None = None) -> tuple[float | None, float | None]:
    """Time a reranker's passes: ``(warm, cold)`` seconds per candidate, ``None`` where not measured.

    One untimed pass over one document (first-call costs), then a timed pass over ``documents``
    (``None``: :data:`COST_DOCUMENTS`) new documents (:func:`probe_documents`): the cold figure.
    With ``stored_blocks`` (a method that reads stored blocks,
    :func:`heedrank.capabilities.reads_stored_blocks`), the documents that pass reranked again,
    for another query, their blocks now in its RAM tier: the warm figure (``None`` when that pass
    still encoded some, e.g. a RAM tier of 0 bytes). Another method's warm figure is its cold
    one. Each pass's seconds are divided by the candidates it reranked (a pass under a deadline
    may read fewer, :meth:`heedrank.pipeline.RerankerCache.rerank`).

    Args:
        rerank: Reranks one query's documents, e.g. through
            :meth:`heedrank.pipeline.RerankerCache.rerank` (the reranker's lock, its running costs).
        stored_blocks: Whether the method reads stored blocks (two passes).

    Raises:
        HeedrankError: what ``rerank`` raises.
    """
    from heedrank.types import Query

    query = Query("cost-probe", "which passages does the model attend to")
    rerank(query, probe_documents(1))
    docs = probe_documents(documents or COST_DOCUMENTS)
    cold, _, read = _timed(rerank, query, docs)
    if not stored_blocks:
        return cold, cold
    again = [d for d in docs if d.doc_id in read]
    if not again:
        return None, cold
    warm, misses, _ = _timed(rerank, Query("cost-probe-warm", "how does a query draw attention to a passage"), again)
    return (warm if not misses else None), cold


def _timed(rerank: Callable[[Query, Sequence[Document]], RerankResult], query: Query,
           docs: Sequence[Document]) -> tuple[float | None, int, set[str]]:
    """One pass: seconds per candidate reranked (``None``: none), its block cache misses and the
    doc ids it reranked."""
    t0 = time.perf_counter()
    result = rerank(query, docs)
    seconds, read = time.perf_counter() - t0, set(result.ranking.doc_ids)
    return (seconds / len(read) if read else None), int((result.cache or {}).get("misses", 0)), read


class MethodCosts:
    """Seconds per candidate of each reranking method, warm and cold (module docstring), under a
    cost key: the method, with a request's options when it has some
    (:func:`heedrank.api.routes.search.method_cost_key`).

    Args:
        alpha: Weight of the newest request in the running means (0..1].
    """

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self._lock = threading.Lock()
        self._spc: dict[str, dict[str, float]] = {}
        self._probing: set[str] = set()

    def seed(self, method: str, warm: float | None, cold: float | None) -> None:
        """The prior of ``method`` (seconds per candidate, from :func:`measure`): set where no
        figure is known yet, then refined by the requests served; ``None`` or <= 0: none."""
        with self._lock:
            entry = self._spc.setdefault(method, {})
            for kind, value in ((WARM, warm), (COLD, cold)):
                if value is not None and value > 0 and math.isfinite(value):
                    entry.setdefault(kind, value)

    def observe(self, method: str, seconds: float, candidates: int, *, cold: int | None = None) -> None:
        """A reranking of ``candidates`` candidates by ``method`` took ``seconds``.

        Args:
            cold: How many of them had their blocks encoded now (block cache misses): 0 teaches
                the warm figure, all of them the cold one, a mix neither; ``None``: a method that
                stores no blocks (both figures are one).
        """
        if candidates < 1 or seconds <= 0:
            return
        kinds = KINDS if cold is None else (WARM,) if cold == 0 else (COLD,) if cold >= candidates else ()
        value = seconds / candidates
        with self._lock:
            entry = self._spc.setdefault(method, {})
            for kind in kinds:
                old = entry.get(kind)
                entry[kind] = value if old is None else (1 - self.alpha) * old + self.alpha * value

    def stopped(self, method: str, seconds: float, candidates: int, *, cold: int | None = None) -> None:
        """A reranking of ``candidates`` by ``method`` was stopped by the budget after it ran
        ``seconds`` (its wait for a worker not included): it costs at least
        ``seconds / candidates`` per candidate.

        Args:
            cold: How many of them may have had their blocks encoded: 0 bounds both figures,
                more only the cold one (the time may have gone to encoding); ``None``: a method
                that stores no blocks (both).
        """
        if candidates < 1 or seconds <= 0:
            return
        kinds = KINDS if not cold else (COLD,)
        with self._lock:
            entry = self._spc.setdefault(method, {})
            for kind in kinds:
                entry[kind] = max(entry.get(kind, 0.0), seconds / candidates)

    def seconds_per_candidate(self, method: str, kind: str = WARM) -> float | None:
        """The ``kind`` (:data:`WARM` or :data:`COLD`) figure of ``method`` in seconds, or
        ``None`` before it was measured."""
        with self._lock:
            return self._spc.get(method, {}).get(kind)

    def known(self, method: str) -> bool:
        """Whether ``method`` has a figure of either kind."""
        with self._lock:
            return bool(self._spc.get(method))

    def max_candidates(self, method: str, budget: float | None, kind: str = WARM) -> int | None:
        """The most candidates ``method`` reranks within ``HEADROOM * budget`` seconds at its
        ``kind`` figure (at least 1), or ``None``: not measured yet, or no budget."""
        spc = self.seconds_per_candidate(method, kind)
        if spc is None or budget is None or spc <= 0:
            return None
        return max(1, math.floor(HEADROOM * budget / spc))

    def claim_probe(self, method: str) -> bool:
        """Whether the caller may time ``method`` now (:func:`measure`): no figure of it yet and
        no other caller timing it; then it must call :meth:`release_probe`."""
        with self._lock:
            if self._spc.get(method) or method in self._probing:
                return False
            self._probing.add(method)
            return True

    def release_probe(self, method: str) -> None:
        """End :meth:`claim_probe`'s claim."""
        with self._lock:
            self._probing.discard(method)


def budget_limits(costs: MethodCosts, method: str, budget: float | None, max_candidates: int,
                  max_documents: int) -> dict[str, dict[str, float | int | None]]:
    """``GET /info``'s figures of ``method`` (``reranker.limits.<method>``), each ``{"warm": ...,
    "cold": ...}`` with ``None`` where not measured (or, for the ``max_*`` ones, without a budget):

    * ``seconds_per_candidate``: seconds per candidate (4 decimals);
    * ``max_candidates_in_budget``: the most candidates (``/search``) that fit ``budget``, at
      most ``max_candidates``;
    * ``max_documents_in_budget``: the most documents (``/rerank``) that fit it, at most
      ``max_documents``.
    """
    def capped(most: int | None, cap: int) -> int | None:
        return None if most is None else min(most, cap)

    spc = {k: costs.seconds_per_candidate(method, k) for k in KINDS}
    most = {k: costs.max_candidates(method, budget, k) for k in KINDS}
    return {
        "seconds_per_candidate": {k: None if v is None else round(v, 4) for k, v in spc.items()},
        "max_candidates_in_budget": {k: capped(most[k], max_candidates) for k in KINDS},
        "max_documents_in_budget": {k: capped(most[k], max_documents) for k in KINDS},
    }


def serves_in_part(reranker: Any, *, fusion: float | str | None, cutoff: float | str | None,
                   by: str = "score") -> bool:
    """Whether a request of ``reranker`` with this ``fusion``, ``cutoff`` and ``by`` (as
    :meth:`heedrank.stage.RerankStage.open` resolves them) is served by the default's scorer
    (:class:`heedrank.serving.ScorerServing`, ``strategy.without_reranker``): the LM reads as many
    candidates as fit the budget and the scorer serves the rest from their other signals, so a
    request past the budget's figures is answered, not refused. ``True`` too when the policy
    cannot be resolved (the pipeline then gives its own error).
    """
    from heedrank.errors import HeedrankError
    from heedrank.serving import ServePolicy

    try:
        policy = ServePolicy.of(reranker, fusion=None if by == "prior" else fusion, cutoff=cutoff, by=by)
    except HeedrankError:
        return True
    return bool(policy.strategy.without_reranker)


def fits_its_deadline(reranker_class: Any, reranker: Any, *, fusion: float | str | None, cutoff: float | str | None,
                      by: str = "score") -> bool:
    """Whether a reranking job fits itself to its deadline (the pool's ``elastic``,
    :meth:`heedrank.api.inference.InferencePool.run`): its method reads stored blocks
    (:func:`heedrank.capabilities.reads_stored_blocks`: cold blocks are encoded only as many as fit,
    :meth:`heedrank.pipeline.RerankerCache.rerank`) and the request can be served with only part of
    its candidates read (:attr:`heedrank.serving.ServePolicy.serves_partly`): by the default's scorer
    (:func:`serves_in_part`), or, for ``/search`` (``by="score"``) without a cut-off, with the unread
    candidates at their first-stage places. ``reranker`` ``None`` (not built yet): ``/search``
    without a cut-off only."""
    from heedrank.capabilities import reads_stored_blocks

    if not reads_stored_blocks(reranker_class):
        return False
    if by == "score" and cutoff is None:
        return True
    return reranker is not None and serves_in_part(reranker, fusion=fusion, cutoff=cutoff, by=by)

