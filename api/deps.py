"""Request dependencies, as ``Annotated`` aliases for route signatures."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from heedrank.api.runtime import Runtime
from heedrank.errors import UnhealthyError
from heedrank.pipeline import Pipeline
from heedrank.settings import Settings


def get_settings(request: Request) -> Settings:
    """The service settings (set by the app factory)."""
    return request.app.state.settings


def get_runtime(request: Request) -> Runtime:
    """The running service state (built by the lifespan).

    Raises:
        UnhealthyError: the app has not started (or has stopped).
    """
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None:
        raise UnhealthyError("the service is not running")
    return runtime


def get_ready_runtime(request: Request) -> Runtime:
    """The runtime, once models are loaded. Raises UnhealthyError (503) before."""
    runtime = get_runtime(request)
    runtime.require_ready()
    return runtime


def get_pipeline(request: Request) -> Pipeline:
    """The default collection's pipeline."""
    return get_runtime(request).pipeline(None)


SettingsDep = Annotated[Settings, Depends(get_settings)]
RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
ReadyRuntimeDep = Annotated[Runtime, Depends(get_ready_runtime)]
PipelineDep = Annotated[Pipeline, Depends(get_pipeline)]
