"""A first stage read from a fixed run (TREC DL: the candidates come from a run file)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from heedrank.protocols import FilterArg
from heedrank.types import Query, Ranking
from heedrank.retriever.base import check_args


class RunRetriever:
    """Serves the hits of a run ``{query_id: {doc_id: score}}`` by query id.

    Scores are the run's own. Hits are ordered by ``(-score, doc_id)`` (a run whose
    tied scores were ranked otherwise in its file is reordered among the ties). A query
    id absent from the run gets an empty ranking; the query text is ignored.

    Args:
        run: The run (copied; the caller's mapping is not kept).
        name: Retriever name for reports (e.g. ``"BM25"``).
    """

    def __init__(self, run: Mapping[str, Mapping[str, float]], name: str = "run") -> None:
        self.name = name
        self._rankings = {qid: Ranking.from_scores(qid, scores) for qid, scores in run.items()}

    @property
    def query_ids(self) -> list[str]:
        """Query ids of the run, sorted."""
        return sorted(self._rankings)

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: FilterArg | None = None) -> list[Ranking]:
        """The run's top-``k`` of each query (empty for an unknown query id).

        Raises:
            ValidationError: ``k < 1``, or a non-empty metadata filter (a fixed run has no
                document metadata to filter on).
        """
        k, parsed = check_args(k, filter)
        if parsed is not None:
            from heedrank.errors import ValidationError

            raise ValidationError(f"the fixed run {self.name!r} cannot apply a metadata filter")
        out = []
        for q in queries:
            ranking = self._rankings.get(q.query_id)
            out.append(ranking.top(k) if ranking is not None else Ranking(q.query_id))
        return out

    def __len__(self) -> int:
        return len(self._rankings)

    def __repr__(self) -> str:
        return f"RunRetriever({self.name!r}, {len(self)} queries)"
