"""Typed errors. Every error carries an ``error_type`` (the API's error body field) and a
message that says what to do. The API maps error types to HTTP statuses."""

from __future__ import annotations


class HeedrankError(Exception):
    """Base class of all heedrank errors."""

    error_type: str = "internal"
    status_code: int = 500


class ValidationError(HeedrankError, ValueError):
    """Bad input from a caller (HTTP 422)."""

    error_type = "validation"
    status_code = 422


class UnknownNameError(ValidationError, KeyError):
    """An unknown retriever, reranker, metric or other registry name (HTTP 422)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class ContextOverflowError(ValidationError):
    """A reranking prompt would exceed the model's context (HTTP 422).

    Attributes:
        max_candidates: The largest candidate count that fits (0 when none does).
    """

    def __init__(self, message: str, max_candidates: int) -> None:
        super().__init__(message)
        self.max_candidates = max_candidates


class NotFoundError(HeedrankError, LookupError):
    """A document, index or collection that does not exist (HTTP 404)."""

    error_type = "not_found"
    status_code = 404


class IndexMismatchError(HeedrankError):
    """An index built with other models or parameters than those requested (HTTP 409)."""

    error_type = "index_mismatch"
    status_code = 409


class KVStoreError(HeedrankError):
    """The persistent document KV store cannot be read or written (disk full, locked,
    damaged files) (HTTP 500)."""

    error_type = "kv_store"
    status_code = 500


class KVStoreMismatchError(KVStoreError, IndexMismatchError):
    """A document KV store built for another model, adapter, layer, prompt or dtype (HTTP 409).

    Attributes:
        fields: Names of the header fields that differ.
        stored: The store's header fields (``{}`` when unknown).
    """

    error_type = "index_mismatch"
    status_code = 409

    def __init__(self, message: str, fields: tuple[str, ...] = (), stored: dict | None = None) -> None:
        super().__init__(message)
        self.fields = tuple(fields)
        self.stored = dict(stored or {})


class ModelLoadError(HeedrankError):
    """A model that cannot be found or loaded (HTTP 503)."""

    error_type = "model_unavailable"
    status_code = 503


class PayloadTooLargeError(HeedrankError):
    """A request over a size limit: body bytes, documents per request or characters per
    document (HTTP 413)."""

    error_type = "payload_too_large"
    status_code = 413


class OverloadedError(HeedrankError):
    """The inference queue is full; retry after ``retry_after`` seconds (HTTP 429)."""

    error_type = "overloaded"
    status_code = 429

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, round(self.retry_after)))}


class UnhealthyError(HeedrankError):
    """The service cannot answer yet (models still loading) or any more (load failed,
    shutting down) (HTTP 503)."""

    error_type = "unhealthy"
    status_code = 503

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


class ClientClosedError(HeedrankError):
    """The client closed the connection before its answer was ready (HTTP 499, the nginx
    convention). Not a server error: the service counts it as ``status="499"`` and logs it
    at info level; the answer is never read."""

    error_type = "client_closed"
    status_code = 499


class JobCancelledError(HeedrankError):
    """Work stopped at a batch or layer boundary because nobody waits for its result any
    more (its client hung up, or its deadline passed): see :mod:`heedrank.cancel`. Raised
    only inside a cancellation scope, i.e. in the service's inference workers."""

    error_type = "cancelled"
    status_code = 499


class UnauthorizedError(HeedrankError):
    """A missing or wrong API key (HTTP 401)."""

    error_type = "unauthorized"
    status_code = 401

    @property
    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class MissingDependencyError(HeedrankError, ImportError):
    """An optional dependency is not installed; the message names the pip command."""

    error_type = "missing_dependency"
    status_code = 500


def require(module: str, extra: str):
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra to install.

    Raises:
        MissingDependencyError: chained to the original ImportError.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"{module!r} is needed here but could not be imported ({exc}); install it with "
            f"`pip install -e '.[{extra}]' (in the heedrank checkout)`"
        ) from exc
