"""Filtered vector search that never comes back short: choose exact or ANN search by the
filter's selectivity, raise ``efSearch`` / ``nprobe`` as the filter gets more selective,
and retry exactly when the ANN answer is short (docs/design/algorithms.md section 5).

The filter arrives as the set of labels it allows (from the document store, see
:meth:`heedrank.index.store.Index.filter_vids`), so its selectivity ``s = allowed / live`` is
known exactly before searching. With ``k' = k * max_group`` labels wanted:

==================================================  =====================================
case                                                strategy
==================================================  =====================================
flat index                                          exact (``IDSelectorArray``: ``O(m d)``)
``allowed <= exact_max``                            exact over the allowed subset
HNSW, ``ef = max(ef_search / s ** ef_power,         exact when ``ef > max_ef``, else ANN
ef_factor * k' / s)``                               with a bitmap ``IDSelector`` and
                                                    that ``efSearch``
IVF, ``p = nprobe / s ** nprobe_power``             exact when ``p > max_probe_fraction *
                                                    nlist`` or when the ``p`` cells hold
                                                    about as many vectors as are allowed
                                                    (``allowed <= p / nlist * live``), else
                                                    ANN with the selector and ``nprobe = p``
==================================================  =====================================

Why these forms: the selector only hides non-matching vectors from the results, so a
filtered HNSW search sees about ``s * ef`` matching candidates; keeping recall needs a
larger ``ef`` as ``s`` falls (measured on MiniLM embeddings of NFCorpus + DL19: the
``ef`` reaching recall@10 >= 0.95 grows roughly as ``s ** -0.4`` down to ``s = 2 %``),
and ``ef_factor * k' / s`` keeps ``~ef_factor * k'`` matching candidates in view so the
answer is not short. IVF cells keep their share of matching vectors, so ``nprobe`` needs
less growth. Below ``exact_max`` matching vectors, or when the needed ``ef`` / ``nprobe``
would cost about as much as scanning the subset, exact search over the subset is both
faster and exact.

Every ANN answer is checked: a query that got fewer than ``min(k, matching documents)``
distinct documents is searched again exactly (``retry_exact``). So every answer has
``min(k, matching)`` results, all allowed; recall against exact filtered search is what
the ANN parameters buy (``bench/filtered_search.py`` measures it).

Chunked documents (``group_bits > 0``): a label is ``vid << group_bits | passage``; hits
are grouped by ``vid`` with the maximum passage score (MaxP). The exact search fetches
``k * max_group`` labels, which always contain the exact top-``k`` documents (a document
ranked ``i`` has at most ``(i - 1) * max_group`` better passages above its best one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from heedrank.errors import ValidationError

STRATEGIES = ("auto", "exact", "ann")


@dataclass(frozen=True)
class PlannerParams:
    """Thresholds of the filtered-search planner (see the module docstring).

    Attributes:
        exact_max: Exact search whenever at most this many vectors are allowed.
        ef_power: HNSW ``efSearch >= ef_search / selectivity ** ef_power`` (recall).
        ef_factor: HNSW ``efSearch >= ef_factor * k' / selectivity`` (no short answers).
        max_ef: Above this ``efSearch``, exact search is used instead.
        nprobe_power: IVF ``nprobe = nprobe / selectivity ** nprobe_power``.
        max_probe_fraction: Above this fraction of ``nlist`` cells, exact search is used.
        retry_exact: Re-run a short ANN answer exactly.
    """

    exact_max: int = 4096
    ef_power: float = 0.4
    ef_factor: float = 2.0
    max_ef: int = 2048
    nprobe_power: float = 0.25
    max_probe_fraction: float = 0.5
    retry_exact: bool = True

    def __post_init__(self) -> None:
        if (self.exact_max < 0 or self.ef_factor <= 0 or self.max_ef < 1 or self.nprobe_power < 0
                or self.ef_power < 0):
            raise ValidationError(f"invalid planner parameters {self}")
        if not 0 < self.max_probe_fraction <= 1:
            raise ValidationError(f"max_probe_fraction must be in (0, 1], got {self.max_probe_fraction}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlannerParams:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class SearchPlan:
    """What the planner chose for one batch.

    Attributes:
        strategy: ``"exact"`` or ``"ann"``.
        allowed: Vectors the search may return (live ones when unfiltered).
        selectivity: ``allowed / live`` in ``[0, 1]``.
        ef_search: HNSW ``efSearch`` of the ANN search (``None`` otherwise).
        nprobe: IVF ``nprobe`` of the ANN search (``None`` otherwise).
        reason: Why, in words.
    """

    strategy: str
    allowed: int
    selectivity: float
    ef_search: int | None = None
    nprobe: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class SearchReport:
    """A plan and what happened: ``retried`` queries were re-run exactly; ``seconds`` wall time."""

    plan: SearchPlan
    retried: int = 0
    seconds: float = 0.0


def make_plan(
    kind: str,
    default_ef: int,
    default_nprobe: int,
    nlist: int | None,
    k_labels: int,
    allowed: int,
    live: int,
    params: PlannerParams = PlannerParams(),
    *,
    filtered: bool = True,
    strategy: str = "auto",
) -> SearchPlan:
    """Choose the strategy for ``k_labels`` hits among ``allowed`` of ``live`` vectors."""
    if strategy not in STRATEGIES:
        raise ValidationError(f"unknown search strategy {strategy!r}; choose one of {list(STRATEGIES)}")
    s = allowed / live if live else 0.0
    if strategy == "exact" or kind == "flat":
        return SearchPlan("exact", allowed, s, reason="requested" if strategy == "exact" else "flat index")
    if allowed == 0:
        return SearchPlan("exact", 0, s, reason="nothing matches")
    if strategy == "auto" and filtered and allowed <= params.exact_max:
        return SearchPlan("exact", allowed, s, reason=f"{allowed} <= exact_max {params.exact_max}")
    if kind == "hnsw":
        ef = default_ef
        if filtered:
            s_ = max(s, 1e-12)
            ef = max(default_ef, math.ceil(default_ef / s_**params.ef_power), math.ceil(params.ef_factor * k_labels / s_))
        ef = max(ef, k_labels)
        if strategy == "auto" and ef > params.max_ef:
            return SearchPlan("exact", allowed, s, reason=f"efSearch {ef} > max_ef {params.max_ef}")
        return SearchPlan("ann", allowed, s, ef_search=min(ef, max(params.max_ef, k_labels)), reason="selector ANN")
    if kind == "ivf":
        nl = int(nlist or 1)
        probe = default_nprobe if not filtered else math.ceil(default_nprobe / max(s, 1e-12) ** params.nprobe_power)
        probe = min(max(probe, 1), nl)
        if strategy == "auto" and filtered and probe > params.max_probe_fraction * nl:
            return SearchPlan("exact", allowed, s, reason=f"nprobe {probe} > {params.max_probe_fraction} * nlist {nl}")
        scanned = probe / nl * live  # vectors in the cells the ANN search reads (cells of equal size)
        if strategy == "auto" and filtered and allowed <= scanned:
            return SearchPlan("exact", allowed, s, reason=f"{allowed} allowed <= {scanned:.0f} in {probe} of {nl} cells")
        return SearchPlan("ann", allowed, s, nprobe=probe, reason="selector ANN")
    raise ValidationError(f"unknown index kind {kind!r}")


def group_max(
    rows: list[tuple[np.ndarray, np.ndarray]], bits: int, k: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per query, labels grouped by ``label >> bits`` with the maximum score (MaxP), top ``k``,
    sorted by descending score. ``bits = 0`` only cuts to ``k``."""
    if bits == 0:
        return [(lab[:k], s[:k]) for lab, s in rows]
    out = []
    for lab, s in rows:
        groups = lab >> bits
        # rows are sorted by descending score: the first occurrence of a group is its max
        _, first = np.unique(groups, return_index=True)
        first = np.sort(first)[:k]
        out.append((groups[first], s[first]))
    return out


def planned_search(
    dense: Any,
    queries: np.ndarray,
    k: int,
    *,
    allowed: np.ndarray | None = None,
    params: PlannerParams = PlannerParams(),
    strategy: str = "auto",
    group_bits: int = 0,
    max_group: int = 1,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], SearchReport]:
    """Top-``k`` documents per query among ``allowed`` labels; never short.

    Args:
        dense: :class:`heedrank.index.dense.DenseIndex`.
        queries: float32 ``(n, dim)``.
        k: Documents wanted per query.
        allowed: Sorted int64 labels allowed by the filter, or ``None`` (no filter: all
            live vectors).
        params: Planner thresholds.
        strategy: ``"auto"`` (the planner), ``"exact"`` or ``"ann"`` (no selectivity
            switch; short answers are still retried exactly when ``params.retry_exact``).
        group_bits: Passage bits of the labels (0 = one vector per document).
        max_group: Most vectors one document has.

    Returns:
        ``(rows, report)``: per query ``(ids int64 (r,), scores float32 (r,))`` with ids =
        ``label >> group_bits``, sorted by descending score, ``r = min(k, matching
        documents)``; and the :class:`SearchReport`.
    """
    t0 = time.perf_counter()
    k = int(k)
    if allowed is not None:
        allowed = np.asarray(allowed, dtype=np.int64)
    k_labels = k * max(1, int(max_group))
    live = dense.num_live
    n_allowed = live if allowed is None else len(allowed)
    plan = make_plan(
        dense.kind, dense.params.ef_search, dense.params.nprobe,
        getattr(dense.index, "nlist", None) if dense.kind == "ivf" else None,
        k_labels, n_allowed, live, params, filtered=allowed is not None, strategy=strategy,
    )
    if plan.strategy == "exact":
        rows = group_max(dense.search_exact(queries, k_labels, allowed=allowed), group_bits, k)
        return rows, SearchReport(plan, 0, time.perf_counter() - t0)
    raw = dense.search_ann(queries, k_labels, allowed=allowed, ef_search=plan.ef_search, nprobe=plan.nprobe)
    rows = group_max(raw, group_bits, k)
    retried = 0
    if params.retry_exact:
        if group_bits == 0:
            want = min(k, n_allowed)
        else:
            source = allowed if allowed is not None else _live_labels(dense)
            want = min(k, len(np.unique(source >> group_bits)))
        short = [i for i, (ids, _) in enumerate(rows) if len(ids) < want]
        if short:
            q = np.asarray(queries, dtype=np.float32).reshape(len(rows), -1)[short]
            again = group_max(dense.search_exact(q, k_labels, allowed=allowed), group_bits, k)
            for i, row in zip(short, again):
                rows[i] = row
            retried = len(short)
    return rows, SearchReport(plan, retried, time.perf_counter() - t0)


def _live_labels(dense: Any) -> np.ndarray:
    labels = np.asarray(dense.labels())
    tomb = dense.tombstones
    if tomb:
        labels = labels[~np.isin(labels, np.fromiter(tomb, dtype=np.int64))]
    return labels
