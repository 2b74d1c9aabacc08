"""``GET /metrics``: Prometheus text exposition (see :mod:`heedrank.api.metrics`)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from heedrank.api.deps import RuntimeDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, summary="Prometheus metrics")
async def metrics(runtime: RuntimeDep) -> Response:
    """Request counts and latency per route, latency per pipeline stage, queue depth,
    rejections and deadline fallbacks, readiness."""
    body, content_type = runtime.metrics.render()
    return Response(body, media_type=content_type)
