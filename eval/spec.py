"""One record for an evaluation run: :class:`EvalSpec`, read by
:func:`heedrank.eval.beir.evaluate_beir`, :func:`heedrank.eval.trecdl.evaluate_trec_dl`
and :func:`heedrank.eval.harness.run_evaluation` (and built once by ``heedrank eval
beir|trec-dl``). A new evaluation knob is one field here, one CLI option and its use.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from heedrank.config import RerankerConfig
from heedrank.engine import Engine
from heedrank.errors import ValidationError
from heedrank.pipeline import NO_RERANK

BEIR_FIELDS = ("retriever", "index_dir", "build_dense", "keep_identical_ids")
"""Fields that apply to BEIR only."""
TREC_DL_FIELDS = ("run_name", "year", "topics", "qrels", "run_file")
"""Fields that apply to TREC DL only."""


@dataclass(frozen=True)
class EvalSpec:
    """What to evaluate and how: one BEIR or TREC DL evaluation run.

    Attributes:
        data_dir: The dataset folder: BEIR layout (``corpus.jsonl[.gz]``,
            ``queries.jsonl[.gz]``, ``qrels/<split>.tsv``), or a candidate-list set for
            ``eval trec-dl`` (:func:`heedrank.eval.sets.load_candidate_set`): one TREC DL year
            (topics, qrels and ``retrieve_results_<RUN>_<year>_top100.json[.gz]`` under
            Anserini / rank_llm names), the MS MARCO dev sample ``msmarco-passage-dev-600`` or
            NovelEval. TREC DL: ``None`` when ``topics``, ``qrels`` and ``run_file`` are all given.
        rerank: Reranker name, or ``"none"`` for first-stage order.
        candidates: First-stage hits reranked per query.
        fusion: ``alpha`` in [0, 1]: rank by ``alpha * z(first stage) + (1 - alpha) *
            z(reranker)`` (:attr:`heedrank.pipeline.SearchOptions.fusion`, the served fused
            path); ``None`` = the reranker's order. Named ``-f<alpha>`` in the report.
        reranker_config: Model, ``max_doc_tokens``, device, options; its ``method`` is
            replaced by ``rerank``. ``None`` = ``RerankerConfig()``.
        max_queries: Evaluate a fixed seeded subset of this many judged queries
            (:func:`heedrank.eval.harness.select_queries`); ``None`` = all.
        seed: Seed of the subset.
        metrics: Metric names (:mod:`heedrank.eval.metrics`); ``None`` = the dataset's
            (``BEIR_METRICS``; a candidate-list set's :attr:`heedrank.eval.sets.SetKind.metrics`,
            e.g. ``TREC_DL_METRICS``).
        out_dir: Folder of ``<name>.trec`` (top-100 run) and ``<name>.json`` (report).
        dump_dir: Also save an attention dump of the reranked queries (ICR with option
            ``keep_attention``), for head detection and ablations; needs the local engine.
        engine: Where the searches run (:class:`heedrank.engine.Engine`, e.g. the Ray
            engine; the first stage still runs here); ``None`` = this process. The report is
            the same apart from timings and ``params.engine``.
        show_progress: Progress bars.
        split: The queries evaluated. BEIR: the qrels split (``"test"``, ``"dev"``,
            ``"train"``). ``eval trec-dl``: a fold of a set with folds (``"test"``,
            ``"train"``, or ``"all"``; :func:`heedrank.eval.sets.seeded_folds`); the other
            sets hold test queries only (``"test"`` or ``"all"``).
        retriever: BEIR first stage (``"bm25"``, ``"dense"``, ``"hybrid"``).
        index_dir: BEIR index directory; ``None`` = built once into the cache
            (:func:`heedrank.eval.beir.ensure_index`) and reused.
        build_dense: BEIR: when building the cached index, also compute dense vectors
            (always done for the ``dense`` and ``hybrid`` retrievers).
        keep_identical_ids: BEIR: keep a retrieved document whose id equals the query id.
            Default ``False`` follows BEIR (``ignore_identical_ids=True``), dropping it
            before reranking (:class:`heedrank.eval.beir.IgnoreIdenticalIds`).
        run_name: TREC DL first-stage run, e.g. ``"BM25"``, ``"SPLADE_P_P_ENSEMBLE_DISTIL"``
            (NovelEval: ``"BM25"`` or ``"web"``, :data:`heedrank.eval.sets.NOVELEVAL_RUNS`);
            ``None`` = ``"BM25"``, or with ``run_file`` the ``<RUN>`` of its name.
        year: TREC DL track year (``"dl21"``, ``"2021"``) or set tag (``"dev600"``);
            ``None`` = detected from the file names.
        topics, qrels, run_file: TREC DL file paths (topics TSV, qrels, rank_llm run JSON)
            for files named otherwise; they replace the ones found in ``data_dir``.
    """

    data_dir: str | Path | None = None
    rerank: str = NO_RERANK
    candidates: int = 20
    fusion: float | None = None
    reranker_config: RerankerConfig | None = None
    max_queries: int | None = None
    seed: int = 0
    metrics: tuple[str, ...] | None = None
    out_dir: str | Path = "runs"
    dump_dir: str | Path | None = None
    engine: Engine | None = None
    show_progress: bool = True
    split: str = "test"
    # BEIR
    retriever: str = "bm25"
    index_dir: str | Path | None = None
    build_dense: bool = True
    keep_identical_ids: bool = False
    # TREC DL
    run_name: str | None = None
    year: str | None = None
    topics: str | Path | None = None
    qrels: str | Path | None = None
    run_file: str | Path | None = None

    @property
    def reranking(self) -> bool:
        """Whether the run reranks (``rerank != "none"``)."""
        return self.rerank != NO_RERANK

    def check_for(self, dataset: Literal["beir", "trec-dl"]) -> None:
        """Refuse fields of the other dataset kind set to anything but their default (they
        would be ignored).

        Raises:
            ValidationError: naming the fields and the kind they belong to.
        """
        other = TREC_DL_FIELDS if dataset == "beir" else BEIR_FIELDS
        defaults = {f.name: f.default for f in fields(self)}
        given = [name for name in other if getattr(self, name) != defaults[name]]
        if given:
            owner = "eval trec-dl" if dataset == "beir" else "eval beir"
            raise ValidationError(f"{', '.join(given)} apply to {owner} only; leave them out of a {dataset} evaluation")

