"""Service settings (pydantic-settings): environment variables prefixed ``ATTNRANK_``."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from attnrank.config import DEFAULT_MAX_DOC_TOKENS, PipelineConfig, RerankerConfig


class Settings(BaseSettings):
    """Settings of the REST service.

    Every field can be set from the environment, e.g. ``ATTNRANK_INDEX=indexes/nfcorpus``.
    """

    model_config = SettingsConfigDict(env_prefix="ATTNRANK_", extra="ignore")

    index: str = Field("indexes/nfcorpus", description="Index directory built by `attnrank index build`.")
    model: str | None = Field(None, description="Reranker LM: packaged default when unset, or a local HF directory.")
    rerank_method: str = Field("icr", description="Reranker loaded at start-up.")
    max_doc_tokens: int = Field(DEFAULT_MAX_DOC_TOKENS, ge=8, le=4096, description="Per-document LM token budget.")
    device: str = "cpu"
    dtype: str = "float32"
    max_top_k: int = Field(100, ge=1, le=10_000)
    max_candidates: int = Field(100, ge=1, le=1_000)
    default_candidates: int = Field(20, ge=1)
    preload: bool = Field(True, description="Load the reranker at start-up instead of on first request.")
    workers: int = Field(1, ge=1, le=64, description="Inference threads (one model instance is shared).")

    def pipeline_config(self) -> PipelineConfig:
        return PipelineConfig(
            index_dir=self.index,
            reranker=RerankerConfig(
                method=self.rerank_method,
                model=self.model,
                max_doc_tokens=self.max_doc_tokens,
                device=self.device,
                dtype=self.dtype,
            ),
            max_top_k=self.max_top_k,
            max_candidates=self.max_candidates,
        )
