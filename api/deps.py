"""Request dependencies, as ``Annotated`` aliases for route signatures."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import Depends, Request

from attnrank.pipeline import Pipeline
from attnrank.settings import Settings


def get_settings(request: Request) -> Settings:
    """The service settings (set by the app factory)."""
    return request.app.state.settings


def get_pipeline(request: Request) -> Pipeline:
    """The search pipeline (built by the lifespan)."""
    return request.app.state.pipeline


def get_limiter(request: Request) -> anyio.CapacityLimiter:
    """Limits concurrent blocking pipeline calls to ``settings.workers`` threads."""
    return request.app.state.limiter


SettingsDep = Annotated[Settings, Depends(get_settings)]
PipelineDep = Annotated[Pipeline, Depends(get_pipeline)]
LimiterDep = Annotated[anyio.CapacityLimiter, Depends(get_limiter)]
