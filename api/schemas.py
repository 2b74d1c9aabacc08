"""Request and response bodies of the REST API (pydantic v2)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from heedrank.textrules import id_problem, is_blank, json_problem, text_problem

MAX_QUERY_CHARS = 4096
"""Longest accepted query text, in characters."""


# The input rules of heedrank.textrules, as annotated types used by every request schema:
# a string that breaks them is a 422 naming the field, e.g. "documents[3].text: contains
# the unpaired surrogate U+D800 at character 7, ...". They run before pydantic's own str
# checks, so every field gets the same message.
def _text_rule(value: Any) -> Any:
    if isinstance(value, str) and (problem := text_problem(value)):
        raise ValueError(problem)
    return value


def _id_rule(value: Any) -> Any:
    if isinstance(value, str) and (problem := id_problem(value)):
        raise ValueError(f"id {problem}")
    return value


def _json_rule(value: Any) -> Any:
    found = json_problem(value)
    if found:
        path, problem = found
        raise ValueError(f"value at {path}: {problem}" if path else problem)
    return value


Text = Annotated[str, BeforeValidator(_text_rule)]
"""A string of Unicode scalar values (no unpaired surrogates)."""
DocId = Annotated[str, BeforeValidator(_id_rule)]
"""A document id: valid text without whitespace or control characters (TREC run files carry it)."""
JsonObject = Annotated[dict[str, Any], BeforeValidator(_json_rule)]
"""A JSON object whose keys and string values, at any depth, are valid text."""

# Counts and switches are strict: a JSON integer for an int (not true, "3" or 3.0), a JSON
# boolean for a bool (not 1 or "yes"); anything else is a 422 naming the field.
BLANK_QUERY = ("query must not be empty or only whitespace and invisible characters (zero-width spaces, soft "
               "hyphens); send some text")


def _non_blank(value: str) -> str:
    """A query with text left after BM25's Unicode analysis (:func:`heedrank.textrules.is_blank`)."""
    if is_blank(value):
        raise ValueError(BLANK_QUERY)
    return value


class ReAttnOptions(BaseModel):
    """ReAttn switches (docs/design/algorithms.md section 4)."""

    model_config = ConfigDict(extra="forbid")

    idf: StrictBool = Field(True, description="Down-weight tokens frequent across the candidates.")
    entropy: StrictBool = Field(True, description="Weight documents by the normalised entropy of their attention.")
    gamma: float = Field(0.5, ge=0, description="Exponent of the normalised entropy.")


CutoffValue = float | Literal["auto", "none"] | None
"""A request's ``cutoff``: a probability, ``"auto"`` or ``"none"``/null (:mod:`heedrank.calibration`)."""


class RerankRequest(BaseModel):
    """Second-stage options of a search."""

    model_config = ConfigDict(extra="forbid")

    method: Text | None = Field(
        None,
        description="Reranker name: 'default' (the best measured configuration, blockrank-cached), "
        "'blockrank-cached', 'icr', 'blockrank', or 'none' for first-stage order; "
        "default: the service's reranker (HEEDRANK_RERANK_METHOD, 'default' unless set).",
        examples=["default"],
    )
    candidates: StrictInt | None = Field(
        None, ge=1,
        description="First-stage hits reranked (at most the service's max_candidates); "
        "default: HEEDRANK_DEFAULT_CANDIDATES.",
    )
    fusion: float | Literal["default", "none"] | None = Field(
        "default",
        description="Order the candidates by alpha * z(first-stage score) + (1 - alpha) * z(reranker score), each "
        "z-scored over the candidates: alpha in [0, 1]; 'default' (when omitted) = the method's recorded weight "
        "(GET /info shows it as reranker.default.fusion: none for the default, whose scorer orders the candidates "
        "from its own signals, the first stage's rank among them; the card's fusion.alpha with scoring='learned'; "
        "icr and blockrank: none); 'none' or null = the reranker's own order.",
        examples=[0.6, "none"],
    )
    cutoff: CutoffValue = Field(
        None,
        description="Return only the reranked results whose calibrated probability of relevance (their `score`) "
        "is at least this: a probability in [0, 1], or 'auto' = the threshold chosen on NFCorpus dev for the best F1; "
        "then fewer than top_k results, possibly none, come back. Only for a calibrated reranker (the default "
        "method) with fusion 'default' or 'none'; null or 'none' (when omitted) = top_k results.",
        examples=["auto", 0.3],
    )
    cold_budget: Annotated[StrictInt, Field(ge=0)] | Literal["unlimited"] | None = Field(
        None,
        description="Recompute budget: at most this many candidates whose document blocks are not stored yet are "
        "encoded now (about 0.06 s each); the other cold ones are not reranked and keep their first-stage "
        "positions, and the service stores their blocks in the background. 'unlimited' = rerank every candidate "
        "whatever it costs; null (when omitted) = the service's (HEEDRANK_COLD_BUDGET). A request with a cutoff "
        "reranks every candidate.",
        examples=[4, "unlimited"],
    )
    heads: Literal["all", "qr", "learned"] | list[tuple[StrictInt, StrictInt]] | None = Field(
        None,
        description="icr and blockrank: attention heads scored: 'all', 'qr' (the model's packaged query-focused "
        "heads), 'learned' (icr: their learned weights) or [[layer, head], ...]; default: the service's configuration.",
        examples=["qr"],
    )
    reattn: StrictBool | ReAttnOptions | None = Field(
        None,
        description="icr and blockrank: ReAttn re-weighting of token attention (true, false or {idf, entropy, gamma}); "
        "default: the service's configuration.",
    )

    def reranker_options(self) -> dict[str, Any]:
        """The ``RerankerConfig.options`` this request sets (``heads``/``reattn`` when given)."""
        out: dict[str, Any] = {}
        if self.heads is not None:
            out["heads"] = self.heads if isinstance(self.heads, str) else [list(h) for h in self.heads]
        if self.reattn is not None:
            out["reattn"] = self.reattn if isinstance(self.reattn, bool) else self.reattn.model_dump()
        return out


class SearchRequest(BaseModel):
    """Body of ``POST /search``."""

    model_config = ConfigDict(extra="forbid")

    query: Text = Field(..., max_length=MAX_QUERY_CHARS, description="Query text (non-empty).")
    top_k: StrictInt = Field(10, description="Number of results (at most the service's max_top_k).",
                       json_schema_extra={"minimum": 1})  # range checked by the pipeline, as in the library
    retriever: Text | None = Field(
        None, description="First-stage retriever: bm25, dense or hybrid (as indexed); default: the service's "
        "(HEEDRANK_DEFAULT_RETRIEVER, bm25 unless set; bm25 where the collection has no dense index).")
    rerank: RerankRequest | None = Field(
        default_factory=lambda: RerankRequest(),
        description="Reranking: omitted, true or {} = rerank with the service's default method and options (an "
        "object sets some); false or null = the first stage alone.",
    )
    collection: Text | None = Field(
        None, description="Collection searched (see GET /info); default: the service's default collection."
    )
    explain: StrictBool = Field(
        False,
        description="With rerank (the default method and icr): each reranked result carries `evidence`, the "
        "document spans that drew the most query attention at the heads that score (character offsets into its "
        "text).",
    )
    filter: JsonObject | None = Field(
        None,
        description="Metadata filter (Qdrant-style): {must, should, must_not} lists of {key, match: {value | any}}, "
        "{key, range: {gt, gte, lt, lte}}, {is_empty: {key}}, {is_null: {key}}, {has_id: [...]} or nested filters. "
        "Only matching documents are retrieved; an invalid filter is a 422 naming the offending clause.",
        examples=[{"must": [{"key": "year", "range": {"gte": 2015}}],
                   "must_not": [{"key": "tags", "match": {"any": ["retracted"]}}]}],
    )

    @field_validator("rerank", mode="before")
    @classmethod
    def _rerank_flag(cls, value: Any) -> Any:
        """``true`` = ``{}`` (the service's defaults), ``false`` = ``null`` (no reranking)."""
        if value is True:
            return {}
        if value is False:
            return None
        return value

    @field_validator("query")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        return _non_blank(value)


class Evidence(BaseModel):
    """A span of a result's document that drew the most query attention."""

    field: Literal["text", "title"] = Field(description="The document field that `start`/`end` index.")
    start: int = Field(description="First character (0-based) in that field.")
    end: int = Field(description="One past the last character: field[start:end] == text.")
    text: str = Field(description="The span's characters.")
    score: float = Field(
        description="Calibrated query attention of the span's tokens (attention mass summed over layers and heads, "
        "minus that of a content-free query): unitless, higher = more attended, comparable within one response."
    )


class Hit(BaseModel):
    """One result."""

    doc_id: str
    score: float | None = Field(
        description="The score to read. A reranked hit: in [0, 1], its calibrated probability of relevance where "
        "the method has a calibration for the scores served (rerank.calibrated; the default method: the sigmoid of "
        "its learned scorer's logit over the signals the hit has, the LM's attention, the embedder's cosine and the "
        "first stage's rank, fitted on training queries; a hit the LM did not read is scored from "
        "the others), else sigmoid of its served score. A hit with no signal to score (below the candidates, or "
        "skipped as cold by another method): null. Without reranking: the first-stage score. Results are in `rank` "
        "order, which `raw_score` gives."
    )
    raw_score: float = Field(
        description="What orders the results (descending, ties by doc_id): the served score of a reranked hit "
        "(the default method: its scorer's logit; other methods: alpha z(first stage) + (1 - alpha) z(reranker), "
        "or the reranker's own with fusion 'none'), the "
        "first-stage score otherwise (placed between or below the reranked ones); unitless, may be negative, "
        "comparable only within one response."
    )
    rank: int = Field(description="1-based position.")
    title: str
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict, description="The document's metadata fields.")
    evidence: list[Evidence] | None = Field(
        None, description="With explain: the reranked document's most attended spans, best first; null otherwise."
    )
    first_stage_rank: int | None = Field(
        None, description="1-based position in the first-stage ranking (before reranking); null when unknown."
    )
    reranked: bool | None = Field(
        None, description="Whether the reranker scored this hit: false for a candidate skipped as cold (its block not "
        "stored yet, rerank.cold_budget spent; it keeps its first-stage position) and for hits below the candidates; "
        "null without reranking."
    )


class Timings(BaseModel):
    """Seconds spent per pipeline stage, and waiting for an inference worker."""

    retrieve: float
    hydrate: float
    rerank: float
    total: float = Field(description="retrieve + hydrate + rerank (without queue).")
    queue: float = Field(0.0, description="Seconds the request waited for an inference worker.")


class RerankInfo(BaseModel):
    """What the reranker did."""

    method: str = Field(description="The registered method that reranked, an alias resolved (`default` is reported "
                        "as `blockrank-cached`), as POST /rerank's `meta.method`.")
    candidates: int = Field(description="First-stage hits reranked (fewer than requested when the first stage found fewer).")
    truncated: int = Field(description="Candidates longer than the per-document token budget: the reranker read "
                           "their first doc_tokens LM tokens.")
    doc_tokens: int | None = Field(None, description="The per-document token budget: LM tokens of each candidate "
                                   "the reranker read.")
    prompt_tokens: int = Field(description="LM tokens processed for this query.")
    warnings: list[str] = Field(
        default_factory=list,
        description="How the reranker ranked: a query cut to its token budget, candidates scored in several "
        "windows, duplicate texts sharing one score.",
    )
    cache: dict[str, int] | None = Field(
        None, description="Cached BlockRank (blockrank-cached, the default): candidate blocks read from the document "
        "KV store or the RAM cache (`hits`) and computed now (`misses`)."
    )
    fusion: float | None = Field(
        None, description="The fusion weight alpha used (alpha z(first stage) + (1 - alpha) z(reranker)); null = the "
        "reranker's own order.")
    cutoff: float | None = Field(
        None, description="The probability threshold applied (rerank.cutoff; 'auto' resolved); null = none.")
    calibrated: bool = Field(
        False, description="Whether a reranked hit's `score` is the calibrated probability of relevance (else "
        "sigmoid of its served score).")
    reranked: int | None = Field(
        None, description="Candidates the reranker scored: `candidates` less those skipped as cold.")
    skipped_cold: int = Field(
        0, description="Candidates not reranked because their blocks were not stored yet and the recompute budget "
        "(rerank.cold_budget) was spent: they keep their first-stage positions (`reranked: false` on the hit) and "
        "are stored in the background, so a later search reranks them.")


class SearchResponse(BaseModel):
    """Body of a successful ``POST /search``; ``results`` are in rank order (descending ``raw_score``)."""

    results: list[Hit]
    timings: Timings
    rerank: RerankInfo | None = None


class HealthResponse(BaseModel):
    """Body of ``GET /health`` when the service is ready (HTTP 200). While models load, or
    after loading failed, the answer is HTTP 503 with the error body plus ``status``:
    ``{"status": "loading" | "failed", "error": ..., "error_type": "unhealthy"}``."""

    status: Literal["ok"] = "ok"


class HealthUnavailable(BaseModel):
    """Body of ``GET /health`` with HTTP 503."""

    status: Literal["loading", "failed"]
    error: str
    error_type: Literal["unhealthy"] = "unhealthy"


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: str = Field(description="What went wrong and what to do.")
    error_type: str = Field(
        description="validation, unauthorized, not_found, method_not_allowed, payload_too_large, "
        "unsupported_media_type, bad_request, overloaded, unhealthy, model_unavailable, internal, ..."
    )


# ------------------------------------------------------------------ POST /rerank (Cohere v2)
class RerankDocumentIn(BaseModel):
    """A document as an object (Cohere v1 style); only ``text`` is read, other fields are
    ignored (but, like every string of a request, must be valid text)."""

    model_config = ConfigDict(extra="allow")

    text: Text = Field(description="Document text.")

    @model_validator(mode="after")
    def _extra_fields_are_valid_text(self) -> RerankDocumentIn:
        _json_rule(self.model_extra or {})
        return self


def _document_object(value: Any) -> Any:
    if isinstance(value, str):
        return {"text": value}
    if not isinstance(value, (dict, RerankDocumentIn)):
        raise ValueError("a document must be a string or an object with a `text` field")
    return value


RerankDocument = Annotated[
    RerankDocumentIn, BeforeValidator(_document_object, json_schema_input_type=str | RerankDocumentIn)
]
"""A /rerank document: a string, or an object with ``text``; a string is read as ``{"text": ...}``,
so both forms name an invalid text ``documents[i].text``."""


class CohereRerankRequest(BaseModel):
    """Body of ``POST /rerank``: the Cohere v2 rerank request, plus ``return_documents``
    (the v1 / Jina extension) and ``deadline_ms``."""

    model_config = ConfigDict(extra="forbid")

    model: Text | None = Field(
        None,
        description="Optional here. When given it must name the served reranker: its method (e.g. 'icr'), its LM "
        "(e.g. 'smollm2-135m-instruct'), '<lm>/<method>', or an external id the operator maps to it "
        "(HEEDRANK_MODEL_ALIASES, e.g. Cohere's 'rerank-v3.5'); GET /info lists them; anything else is a 422.",
        examples=["icr"],
    )
    query: Text = Field(..., max_length=MAX_QUERY_CHARS, description="Query text (non-empty).")
    documents: list[RerankDocument] = Field(
        ..., min_length=1,
        description="Documents to rank: strings, or objects with a `text` field. At most the service's "
        "max_documents (413 above). A document longer than max_tokens_per_doc LM tokens is cut to them and "
        "ranked on its beginning (listed in meta.truncated and meta.warnings); only the body size "
        "(max_body_bytes) bounds its length.",
    )
    top_n: StrictInt | None = Field(None, ge=1, description="Results returned (best first); default: all documents.")
    max_tokens_per_doc: StrictInt | None = Field(
        None, ge=1,
        description="LM tokens read per document (longer ones are truncated and listed in meta.truncated); "
        "default and upper bound: the service's max_doc_tokens (larger values are clamped, with a warning).",
    )
    return_documents: StrictBool = Field(False, description="Add `document: {text}` to each result.")
    rank_fields: list[Text] | None = Field(
        None, description="Cohere v1: fields of object documents to rank on; only ['text'] is supported."
    )
    max_chunks_per_doc: StrictInt | None = Field(None, ge=1, description="Cohere v1; accepted and ignored.")
    priority: StrictInt | None = Field(None, description="Cohere v2 request priority; accepted and ignored.")
    fusion: float | Literal["default", "none"] | None = Field(
        "default",
        description="heedrank extension: how the order the documents come in counts. 'default' (when omitted): "
        "as a position prior that the reranker updates, worth something only when the order agrees with the "
        "reranker more than chance (a first stage's order; a shuffled or arbitrary order is ignored), so a "
        "document the reranker is confident about ranks first wherever it was sent (heedrank.serving.PositionPrior; "
        "meta.order_prior says how much the order counted). A number alpha in [0, 1]: fused as a first stage "
        "(score 1 / rank), alpha * z(1 / rank) + (1 - alpha) * z(reranker). 'none' or null: the reranker's own "
        "order. Measured: docs/results/default.md, \"/rerank's default: a position prior\".",
        examples=["default", "none", 0.6],
    )
    cutoff: CutoffValue = Field(
        None,
        description="heedrank extension: return only the documents whose calibrated probability of relevance "
        "(relevance_score, meta.calibrated) is at least this: a probability in [0, 1], or 'auto' = the threshold "
        "chosen on NFCorpus dev for the best F1 (possibly no result). Only for a calibrated reranker (the default "
        "method) with fusion 'default', 'none' or the card's weight; applied before top_n; null or 'none' (when "
        "omitted): every document.",
        examples=["auto", 0.3],
    )
    deadline_ms: StrictInt | None = Field(
        None, ge=1,
        description="Answer within this many milliseconds: when reranking would exceed it (estimated from recent "
        "requests and the queue, or it runs over), the answer comes without the LM and says so in meta "
        "(reranked=false, deadline_exceeded=true, warnings) instead of timing out: the documents scored by the "
        "default's scorer from the embedder's cosine alone, or in their given order when it cannot score them.",
    )

    @field_validator("query")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        return _non_blank(value)

    def texts(self) -> list[str]:
        return [d.text for d in self.documents]


class RerankedDocument(BaseModel):
    text: str


class CohereRerankResult(BaseModel):
    """One ranked document."""

    index: int = Field(description="Position of the document in the request's `documents` (0-based).")
    relevance_score: float = Field(
        description="Relevance in [0, 1]. With a calibrated reranker (the default method; meta.calibrated): the "
        "probability that the document is relevant, from the served score (Platt scaling fitted on held-out "
        "NFCorpus train queries; with the default fusion the given order's position prior is inside it), so results, "
        "which come best first, are sorted by relevance_score. Otherwise as Cohere's (thresholds set on Cohere's "
        "scores apply): the reranker's own score r (meta.raw_scores), less the position prior in its units, becomes "
        "1 / (1 + exp(-r / s)), per document, with the method's scale s "
        "(meta.score_scale) for icr (calibrated attention mass summed over layers and heads: 0.5 = as much "
        "attention as a content-free query) and blockrank's calibrated and learned scoring; blockrank's "
        "scoring='signal' scores are attention probabilities (in [0, 1], summing to 1 over the documents) and are "
        "kept, as are a plugin reranker's own scores (unless HEEDRANK_RERANK_SCORE_SCALE is set). With fusion "
        "(meta.fusion, on by default for the default method): 1 / (1 + exp(-f)) of the fused score f (z-score "
        "units). When meta.reranked is false (the LM stopped by deadline_ms or the per-request budget): the "
        "probability from the default's scorer reading the embedder's cosine alone, or, when it could not score the "
        "documents, 1 / (1 + position) of the given order, in (0, 1]."
    )
    document: RerankedDocument | None = Field(None, description="With return_documents: the document's text.")


class ApiVersion(BaseModel):
    version: str = "2"


class BilledUnits(BaseModel):
    search_units: int = 1


class TokenCounts(BaseModel):
    input_tokens: int = Field(description="LM tokens processed (all passes).")
    output_tokens: int = 0


class CohereRerankMeta(BaseModel):
    """Cohere's ``meta`` plus what this service did."""

    api_version: ApiVersion = Field(default_factory=ApiVersion)
    billed_units: BilledUnits = Field(default_factory=BilledUnits)
    tokens: TokenCounts
    warnings: list[str] = Field(default_factory=list)
    model: str = Field(description="The served reranker, '<lm>/<method>'.")
    method: str = Field(description="Reranking method: its name says how to read relevance_score.")
    reranked: bool = Field(description="False when deadline_ms or the per-request budget stopped the LM: the documents "
                           "were scored without it (the default's scorer from the embedder's cosine), or are in the "
                           "given order.")
    deadline_exceeded: bool = Field(False, description="True when deadline_ms or the per-request budget "
                                    "(HEEDRANK_REQUEST_BUDGET_S) stopped the reranking.")
    truncated: int = Field(0, description="Documents longer than the token budget (doc_tokens): each was ranked on "
                           "its beginning (meta.warnings names them).")
    doc_tokens: int | None = Field(None, description="LM tokens of each document the reranker read.")
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds: queue, rerank, total.")
    cutoff: float | None = Field(None, description="The probability threshold applied (request `cutoff`, 'auto' "
                                 "resolved); absent = none.")
    score_scale: float | None = Field(
        None, description="The scale s of relevance_score = 1 / (1 + exp(-raw / s)); null when relevance_score is "
        "the calibrated probability (calibrated) or the raw score (a probability, a plugin's score, or the given "
        "order's 1 / (1 + position))."
    )
    calibrated: bool = Field(False, description="Whether relevance_score is the calibrated probability of relevance.")
    order_prior: float | None = Field(
        None, description="With the default fusion: how much the given order counted, in z-units of reranker score "
        "per unit of log(1 + position) (0: not at all, the order did not agree with the reranker more than chance; "
        "at most 1.0).")
    raw_scores: list[float] = Field(
        default_factory=list,
        description="The reranker's own score of each result, in the order of results. The default "
        "(blockrank-cached with its scorer): the LM's list-independent attention log-odds, one of the inputs of "
        "relevance_score (the scorer's sigmoid over it and the embedder's cosine), the same for a document in any "
        "list; a document the LM did not read in time has its served score instead (meta.warnings says so). Other "
        "methods: their own score (meta.method says which), compare only within one response.",
    )
    fusion: float | None = Field(
        None, description="The weight alpha of the given order in the results' order (request field `fusion`); null "
        "= the reranker's own order.")


class CohereRerankResponse(BaseModel):
    """Body of a successful ``POST /rerank`` (Cohere v2 shape): results best first."""

    id: str = Field(description="Request id (UUID4).")
    results: list[CohereRerankResult]
    meta: CohereRerankMeta


# ------------------------------------------------------------------ GET /info
class RerankerInfo(BaseModel):
    method: str = Field(description="Reranker used by /rerank and by /search's default rerank.")
    explain_methods: list[str] = Field(
        default_factory=list, description="Methods (and aliases) whose /search results can carry evidence (explain).")
    default_retriever: str = Field("bm25", description="First stage of a /search that names none.")
    default: dict[str, Any] = Field(
        default_factory=dict,
        description="The default configuration ('default'): the method it names, its options, fusion weight, and "
        "the dev and test nDCG@10 recorded in its weights card.",
    )
    model: dict[str, Any] | None = Field(None, description="The loaded reranker's describe(); null until loaded.")
    card: dict[str, Any] | None = Field(
        None, description="The weights card the loaded reranker found for its model: path (a packaged card's file "
        "name), packaged, model and model_sha256 it was fitted for, layer; null when none answered (no card for "
        "the model, a method without cards, or not loaded yet).")
    scoring: str | None = Field(
        None, description="The scorer the loaded reranker uses ('learned' with a card; 'calibrated' for a model "
        "without one); null until loaded or for a method without scorers.")
    signals: list[str] | None = Field(
        None, description="The signals the default's scorer reads (heedrank.scorer: attention, dense, rank; one "
        "logistic model per subset, so a candidate missing one is scored from the rest; query_words: the query's "
        "length, read by the scorer's query gate, which leans the score of a query longer than its training "
        "sources' on the embedder alone); null when the loaded reranker is not served by it.")
    model_ids: list[str] = Field(description="Values /rerank accepts as `model`.")
    methods: list[str] = Field(description="Rerank methods /search accepts.")
    max_doc_tokens: int
    device: str
    dtype: str
    options: dict[str, list[dict[str, Any]]] = Field(
        default_factory=dict,
        description="Per method: its options ({name, type, default, doc}); unknown options are refused (422).",
    )
    limits: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Per method, what the loaded model holds (empty until loaded): context and window_tokens "
        "(positions), max_query_tokens (longer queries are cut, with a warning), max_doc_tokens, and "
        "max_candidates / max_documents: the most candidates a /search or documents a /rerank request may send "
        "(the service limits, when the model holds them); icr adds candidates_per_window. What fits the "
        "per-request budget (HEEDRANK_REQUEST_BUDGET_S), each an object {\"warm\": ..., \"cold\": ...}: warm = the "
        "candidates' blocks read (from the document KV store: cached BlockRank's /search once the store is filled), "
        "cold = each block encoded now (cached BlockRank's /rerank of new documents); a method that stores no blocks "
        "(icr, blockrank, dense) reads every candidate's text each time, so its two are one. "
        "seconds_per_candidate: seconds per candidate reranked; max_candidates_in_budget: the most candidates a "
        "/search may ask it for within the budget (at most max_candidates); max_documents_in_budget: the most "
        "documents a /rerank may send it (at most max_documents). null where not measured: the served method is "
        "timed at start-up (HEEDRANK_WARMUP), another the first time a /search builds it; the requests served then "
        "refine them. Past max_candidates_in_budget.warm (/search) or max_documents_in_budget.cold (/rerank) a "
        "request gets a 422 at once that names the figure, unless its method is served by the default's scorer "
        "(the default, unless a request gives a fusion weight): the LM then reads as many as fit and the "
        "rest are scored from their other signals.",
    )


class InfoResponse(BaseModel):
    """Body of ``GET /info``."""

    version: str
    status: Literal["loading", "ok", "failed"]
    uptime_seconds: float
    reranker: RerankerInfo
    default_collection: str
    collections: dict[str, dict[str, Any]] = Field(description="Per collection: index parameters and live counts.")
    limits: dict[str, int] = Field(
        description="The service's hard caps (settings; over them a request gets a 422 or 413): max_top_k, "
        "max_candidates (first-stage candidates one /search may rerank), max_documents (documents per /rerank), "
        "max_document_chars, max_body_bytes, max_query_chars, and the pools' workers and queue sizes. Whether that "
        "many fit the per-request budget depends on the method: reranker.limits.<method>.max_candidates_in_budget "
        "and max_documents_in_budget say, warm and cold.")
    auth: bool = Field(description="Whether routes need an API key.")


# ------------------------------------------------------------------ /documents
class DocumentIn(BaseModel):
    """A document to add or replace (upsert by ``id``)."""

    model_config = ConfigDict(extra="forbid")

    id: DocId = Field(
        ..., min_length=1, max_length=512,
        description="Document id, unique in the collection; no whitespace or control characters (TREC run files "
        "carry it).",
    )
    text: Text = Field(..., description="Body text (at most the service's max_document_chars characters, else 413).")
    title: Text = Field("", description="Title; indexed together with the text.")
    metadata: JsonObject = Field(
        default_factory=dict,
        description="JSON metadata fields, filterable in POST /search (`filter`). Replaced as a whole on upsert.",
    )

    @model_validator(mode="after")
    def _has_content(self) -> DocumentIn:
        if not (self.text.strip() or self.title.strip()):
            raise ValueError(f"document {self.id!r} has no text or title; there is nothing to index")
        return self


class UpsertRequest(BaseModel):
    """Body of ``POST /documents``: a batch upsert into one collection."""

    model_config = ConfigDict(extra="forbid")

    collection: Text | None = Field(None, description="Target collection; default: the service's default collection.")
    documents: list[DocumentIn] = Field(
        ..., min_length=1, description="Documents to add or replace; ids unique within the batch. At most the "
        "service's max_ingest_documents (413 above)."
    )


class UpsertResponse(BaseModel):
    """Answer of ``POST /documents``, sent only once every document is durable (committed to
    SQLite with ``synchronous=FULL``, WAL mode) and searchable."""

    collection: str
    added: list[str] = Field(description="Ids that were new to the collection.")
    replaced: list[str] = Field(description="Ids whose previous version was replaced.")
    num_docs: int = Field(description="Live documents in the collection after the upsert.")


class DocumentOut(BaseModel):
    """Body of ``GET /documents/{doc_id}``."""

    collection: str
    id: str
    title: str
    text: str
    metadata: dict[str, Any]


class DeleteResponse(BaseModel):
    """Answer of ``DELETE /documents/{doc_id}``, sent once the deletion is durable."""

    collection: str
    deleted: str
    num_docs: int
