"""``GET /health``: readiness (no API key needed)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from heedrank.api.deps import RuntimeDep
from heedrank.api.schemas import HealthResponse, HealthUnavailable

router = APIRouter(tags=["health"])


@router.get(
    "/health",
    response_model=HealthResponse,
    responses={503: {"model": HealthUnavailable, "description": "Models still loading, or loading failed."}},
    summary="Service readiness",
)
async def health(runtime: RuntimeDep):
    """``200 {"status": "ok"}`` once models are loaded; ``503 {"status": "loading"|"failed",
    "error", "error_type": "unhealthy"}`` before, or if loading failed."""
    if runtime.status == "ok":
        return HealthResponse()
    message = "models are still loading" if runtime.status == "loading" else str(runtime.error)
    body = HealthUnavailable(status=runtime.status, error=message)
    return JSONResponse(body.model_dump(), status_code=503, headers={"Retry-After": "5"})
