"""``GET /health``: liveness (the app answers only once the lifespan has built the pipeline)."""

from __future__ import annotations

from fastapi import APIRouter

from api.schemas import HealthResponse

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthResponse, summary="Service is up")
async def health() -> HealthResponse:
    """``{"status": "ok"}`` once the service has started (index open, reranker loaded if preloaded)."""
    return HealthResponse()
