"""Service settings (pydantic-settings): environment variables prefixed ``HEEDRANK_``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from heedrank.config import (
    BLOCK_CACHE_BUDGET,
    DEFAULT_RERANK_METHOD,
    ENV_PREFIX,
    KV_CACHE_BUDGET,
    KVTiers,
    PipelineConfig,
    RerankerConfig,
    SearchLimits,
)


class Settings(BaseSettings):
    """Settings of the REST service.

    Every field can be set from the environment, e.g. ``HEEDRANK_INDEX=indexes/nfcorpus``.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    index: str = Field("indexes/nfcorpus", description="Index directory built by `heedrank index build`.")
    model: str | None = Field(None, description="Reranker LM: packaged default when unset, or a local HF directory.")
    rerank_method: str = Field(
        DEFAULT_RERANK_METHOD,
        description="Reranker loaded at start-up and used by /rerank and /search's `\"rerank\": {}`: 'default' (the "
        "best measured configuration: cached BlockRank with learned head weights, the query adapter and fusion with "
        "the first stage, method blockrank-cached), 'icr', 'blockrank', or a registered plugin.",
    )
    rerank_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the start-up reranker (JSON object, e.g. HEEDRANK_RERANK_OPTIONS="
        "'{\"scoring\": \"calibrated\"}'); GET /info lists each method's options.",
    )
    max_doc_tokens: int | None = Field(
        None, ge=8, le=4096,
        description="Per-document LM token budget of every method the service builds; unset = the start-up "
        "method's own (128 for the default, blockrank-cached; 160 for icr and blockrank).",
    )
    device: str = Field("cpu", description="torch device of the reranker LM: cpu, cuda, cuda:N.")
    dtype: str = Field("float32", description="torch dtype of the reranker LM: float32, float16 or bfloat16.")
    default_retriever: str = Field(
        "bm25", description="First stage of a /search that names none (bm25 where a collection lacks it).")
    max_top_k: int = Field(100, ge=1, le=10_000, description="Largest `top_k` a request may ask for (422 above).")
    max_candidates: int = Field(
        100, ge=1, le=1_000, description="Most first-stage candidates one search may rerank (422 above).")
    default_candidates: int = Field(20, ge=1, description="Candidates reranked when a request names none.")
    preload: bool = Field(True, description="Load the reranker at start-up instead of on first request.")
    torch_threads: int | None = Field(
        None, ge=1, le=256,
        description="torch intra-op threads (torch.set_num_threads) set at start-up; unset = torch's default. "
        "On a machine shared with other CPU-heavy processes, 1 can be many times faster than the default.",
    )
    warmup: bool = Field(
        True, description="After loading, rerank a few passages once (first-call costs; seeds the wait estimate), "
        "then time the method cold and warm on 8 more (seconds per candidate: GET /info reranker.limits, the "
        "over-budget 422s); another method is timed likewise the first time a /search builds it. false = neither: "
        "the costs are learned from the requests alone.",
    )
    workers: int = Field(
        2, ge=1, le=64,
        description="Reranking threads (one model instance is shared). Cached BlockRank (the default) runs that many "
        "query passes at once, each with its share of the torch threads; other methods run one call at a time.",
    )
    queue_size: int = Field(
        8, ge=0, le=10_000,
        description="Reranking requests that may wait for a worker; beyond them a request gets 429 overloaded.",
    )
    max_queue_wait_s: float | None = Field(
        30.0, gt=0,
        description="A reranking request whose estimated wait for a worker is longer gets 429 at once "
        "(estimated from recent requests; unset = only queue_size limits).",
    )
    request_budget_s: float | None = Field(
        20.0, gt=0,
        description="Most seconds one reranking request may take, its wait for a worker included: past it the "
        "reranking is stopped (at its next layer) and the request is answered without the LM, saying so (/search: "
        "rerank.warnings; /rerank: meta.warnings, deadline_exceeded): in the order of the default's scorer from the "
        "signals it has without the LM (the embedder's cosine; on /search also the first-stage rank), or in "
        "the first stage's (given) order where that scorer cannot run (an index without vectors, a method without a "
        "scorer, no time left). So one slow request cannot hold the reranking worker for long. /rerank's "
        "deadline_ms lowers it per request. Unset (null) = no budget.",
    )
    max_query_tokens: int | None = Field(
        None, ge=1, le=4096,
        description="Most LM tokens of a query the start-up reranker reads; a longer query is cut, with a warning "
        "(rerank.warnings, meta.warnings). Unset = the method's own (option max_query_tokens: 64, above every "
        "query of NFCorpus and TREC DL, so they are never cut).",
    )
    search_workers: int = Field(2, ge=1, le=64, description="Threads of first-stage-only searches.")
    search_queue_size: int = Field(64, ge=0, le=100_000, description="First-stage searches that may wait (then 429).")
    collections: dict[str, str] = Field(
        default_factory=dict,
        description="More named collections, name -> index directory (JSON, e.g. "
        'HEEDRANK_COLLECTIONS=\'{"scifact": "indexes/scifact"}\'); `index` is the default collection.',
    )
    default_collection: str = Field("default", min_length=1, description="Name of the collection `index` serves.")
    api_key: SecretStr | None = Field(
        None, description="When set, every route but /health needs `Authorization: Bearer <api_key>`."
    )
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="Largest request body in bytes (413 above).")
    max_documents: int = Field(100, ge=1, le=10_000, description="Most documents per /rerank request (413 above).")
    max_document_chars: int = Field(
        20_000, ge=1,
        description="Most characters (title + text) per document of POST /documents (413 above). /rerank has no "
        "such limit: it ranks a longer document on its first max_tokens_per_doc LM tokens.",
    )
    max_ingest_documents: int = Field(
        1_000, ge=1, le=100_000, description="Most documents per POST /documents request (413 above)."
    )
    ingest_workers: int = Field(1, ge=1, le=16, description="Threads applying document upserts and deletes.")
    ingest_queue_size: int = Field(
        16, ge=0, le=10_000, description="Upserts and deletes that may wait for an ingest worker (then 429)."
    )
    evidence_spans: int = Field(3, ge=1, le=20, description="Evidence spans per document with `explain`.")
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Origins whose web pages may call the API from a browser (CORS), e.g. HEEDRANK_CORS_ORIGINS="
        "'[\"https://app.example.org\"]', or '[\"*\"]' for any; empty (the default) = CORS off. Preflight OPTIONS "
        "requests are answered without the API key; the other requests still need it.",
    )
    model_aliases: dict[str, str] = Field(
        default_factory=dict,
        description="External model ids POST /rerank accepts as `model`, each mapped to a served id (the method, "
        "the LM or '<lm>/<method>'), for clients that must send one, e.g. Cohere's SDK: HEEDRANK_MODEL_ALIASES="
        "'{\"rerank-v3.5\": \"icr\"}'; the key '*' maps any other id.",
    )
    rerank_score_scale: float | None = Field(
        None, gt=0,
        description="Scale s of /rerank's relevance_score = 1 / (1 + exp(-raw / s)) for methods whose raw score is "
        "not a probability; unset = the reranker's own (score_scale: heedrank.reranker.base.SCORE_SCALES).",
    )

    cold_budget: int | None = Field(
        4, ge=0,
        description="/search's recompute budget: candidates whose document blocks are not stored yet that one search "
        "encodes inline (about 0.06 s each); the others keep their first-stage positions and are stored by the "
        "background fill. HEEDRANK_COLD_BUDGET=unlimited (or null) = no budget: every candidate is reranked. /rerank (the "
        "client's documents, never stored) and rerank-batch (a batch is judged in full) rerank every candidate.",
    )
    fill_blocks: bool = Field(
        True,
        description="Fill each collection's document KV store in the background while no request is served: first "
        "the blocks searches skipped, then every document's; it yields to a request within one block, resumes after "
        "a restart, and stops at the store's disk budget.",
    )
    fill_hold_s: float = Field(
        0.3, ge=0, le=60,
        description="Seconds the rerank and search pools must have had no request queued or running before the "
        "background fill, and the encoding of upserted documents' blocks (POST /documents), go on: they step aside "
        "within one block (one document's encoding) when a request comes, and a stream of requests is not "
        "interleaved with their work. 0 = resume as soon as no request is in flight.",
    )
    kv_disk_bytes: int | None = Field(
        None, gt=0,
        description="Disk budget of each collection's document KV store, bytes of stored blocks (about 0.85 MB per "
        "128-token int8 block); beyond it the least recently used blocks are evicted (kv_eviction) and searches "
        "encode them again when they need them. Unset = unbounded (every document's block is kept).",
    )
    kv_eviction: Literal["lru", "lfu", "fifo"] = Field(
        "lru", description="Which blocks leave the document KV store first when it is at its disk budget.")
    kv_admit_after: int | None = Field(
        None, ge=1,
        description="A block a search encodes is written to the store on its n-th use (among the last 100,000 "
        "blocks seen) when writing it would evict, so that a one-off candidate does not evict a popular one; "
        "while the store has room every block is written. Unset = 2 with a disk budget, 1 without. The "
        "background fill is not subject to it.",
    )
    kv_cache_bytes: int = Field(KV_CACHE_BUDGET.default, ge=0, description=KV_CACHE_BUDGET.description)
    block_cache_bytes: int = Field(BLOCK_CACHE_BUDGET.default, ge=0, description=BLOCK_CACHE_BUDGET.description)

    @field_validator("kv_cache_bytes", "block_cache_bytes", mode="before")
    @classmethod
    def _byte_budget(cls, value: Any, info: Any) -> int:
        # one parser for the service and for code built without Settings (heedrank.config.ByteBudget)
        return {b.name: b for b in (KV_CACHE_BUDGET, BLOCK_CACHE_BUDGET)}[info.field_name].parse(value)

    @model_validator(mode="after")
    def _method_budget(self) -> Settings:
        if self.max_doc_tokens is None:
            from heedrank.registry import default_max_doc_tokens

            self.max_doc_tokens = default_max_doc_tokens(self.rerank_method)
        return self

    @field_validator("cold_budget", "request_budget_s", mode="before")
    @classmethod
    def _no_budget(cls, value: Any) -> Any:
        # HEEDRANK_COLD_BUDGET=null | none | unlimited | (empty): no budget, as "unlimited" in a request (the same
        # for HEEDRANK_REQUEST_BUDGET_S)
        if isinstance(value, str) and value.strip().lower() in ("", "null", "none", "unlimited"):
            return None
        return value

    @field_validator("api_key")
    @classmethod
    def _non_empty_key(cls, value: SecretStr | None) -> SecretStr | None:
        return value if value is not None and value.get_secret_value() else None

    def collection_dirs(self) -> dict[str, str]:
        """Every collection, name -> index directory; the default one first.

        Raises:
            ValueError: a named collection reuses the default collection's name.
        """
        if self.default_collection in self.collections and self.collections[self.default_collection] != self.index:
            raise ValueError(
                f"collection {self.default_collection!r} is the default collection (HEEDRANK_INDEX={self.index}); "
                "name the other one differently"
            )
        named = {k: v for k, v in self.collections.items() if k != self.default_collection}
        return {self.default_collection: self.index, **named}

    def _reranker_options(self) -> dict[str, Any]:
        """``rerank_options`` with ``max_query_tokens`` set from the service's setting (when set and
        the options do not name it)."""
        options = dict(self.rerank_options)
        if self.max_query_tokens is not None:
            options.setdefault("max_query_tokens", self.max_query_tokens)
        return options

    def search_limits(self) -> SearchLimits:
        """The bounds every collection's pipeline checks searches against."""
        return SearchLimits(max_top_k=self.max_top_k, max_candidates=self.max_candidates)

    def pipeline_config(self, index_dir: str | None = None) -> PipelineConfig:
        limits = self.search_limits()
        return PipelineConfig(
            index_dir=index_dir or self.index,
            reranker=RerankerConfig(
                method=self.rerank_method,
                model=self.model,
                options=self._reranker_options(),
                max_doc_tokens=self.max_doc_tokens,
                device=self.device,
                dtype=self.dtype,
            ),
            max_top_k=limits.max_top_k,
            max_candidates=limits.max_candidates,
            kv_cache_bytes=self.kv_cache_bytes,
            kv_tiers=KVTiers(self.kv_disk_bytes, self.kv_eviction, self.kv_admit_after),
            block_cache_bytes=self.block_cache_bytes,
        )
