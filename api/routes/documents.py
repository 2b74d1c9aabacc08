"""``POST /documents`` (batch upsert), ``GET`` and ``DELETE /documents/{doc_id}``.

Writes go to the collection's index directory through :meth:`heedrank.index.store.Index.add_documents`
and :meth:`heedrank.index.store.Index.delete_documents`: one SQLite transaction (WAL mode,
``synchronous=FULL``), then BM25 (delta) and the vector index in memory. The answer is sent
only after the commit, so an acknowledged upsert survives a ``kill -9`` at any later
moment: when the index is opened again, the vector and BM25 files catch up from SQLite
(:meth:`heedrank.index.store.Index.open`). Writes run in the bounded ``ingest`` pool, never on the
event loop; a full queue answers 429.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query as QueryParam

from heedrank.api.deps import RuntimeDep, SettingsDep
from heedrank.api.schemas import DeleteResponse, ErrorBody, DocumentOut, UpsertRequest, UpsertResponse
from heedrank.errors import IndexMismatchError, NotFoundError, OverloadedError, PayloadTooLargeError
from heedrank.pipeline import Pipeline
from heedrank.settings import Settings
from heedrank.types import Document

logger = logging.getLogger(__name__)

router = APIRouter(tags=["documents"])

_READ_ERRORS: dict[int | str, dict[str, Any]] = {  # FastAPI's `responses` type
    401: {"model": ErrorBody, "description": "Missing or wrong API key (when the service has one)."},
    404: {"model": ErrorBody, "description": "Unknown collection, or the collection has no such document."},
    422: {"model": ErrorBody, "description": "Invalid request."},
}
_WRITE_ERRORS: dict[int | str, dict[str, Any]] = {  # FastAPI's `responses` type
    **_READ_ERRORS,
    409: {"model": ErrorBody, "description": "The collection is read-only (an index of an older format, or not "
          "backed by an index directory)."},
    413: {"model": ErrorBody, "description": "Body, document count or document length over the limits."},
    422: {"model": ErrorBody, "description": "Invalid documents (blank or repeated id, an id with whitespace or "
          "control characters, text that is not valid Unicode, no text, extra fields); the message names the field."},
    429: {"model": ErrorBody, "description": "Ingest queue full (overloaded); retry after Retry-After seconds."},
}

CollectionParam = Annotated[
    str | None, QueryParam(description="Collection; default: the service's default collection.")
]


def _writable_index(pipeline: Pipeline, name: str):
    index = pipeline.index
    if index is None or not hasattr(index, "add_documents"):
        raise IndexMismatchError(
            f"collection {name!r} is not backed by an index directory and cannot be updated; "
            "serve an index built by `heedrank index build`"
        )
    return index


ENCODE_CHUNK = 2
"""Documents per ingest-pool job when upserted documents' blocks are encoded without the
collection's background fill: a request waits for at most this many blocks' encoding."""


def _encode_blocks_later(runtime: Any, pipeline: Pipeline, name: str, docs: list[Document]) -> None:
    """After the commit (the acknowledgement does not wait), compute the new documents' blocks
    for the collection's document KV store in the background, stepping aside for requests
    (:attr:`heedrank.api.runtime.Runtime.quiet`) within one block or :data:`ENCODE_CHUNK` blocks.

    Where the collection's background fill runs, they join its queue
    (:meth:`heedrank.api.fill.BlockFiller.add`: one block at a time, committed in batches;
    after a restart its document scan finds those still missing). Otherwise (the fill off, the
    models loading) :meth:`heedrank.blocks.BlockSync.encode_new` runs in the ingest pool,
    :data:`ENCODE_CHUNK` documents per job, each once the service is quiet, so that upserts and
    deletes queue between jobs; a full ingest queue is waited out, and a failure or a shutdown
    leaves the rest to be computed on first use, logged."""
    filler = runtime.fillers.get(name)
    if filler is not None and filler.running:
        filler.add(docs)
        return

    async def run() -> None:
        written = 0
        try:
            for start in range(0, len(docs), ENCODE_CHUNK):
                written += await _encode_when_quiet(runtime, pipeline, docs[start:start + ENCODE_CHUNK])
        except Exception as exc:  # noqa: BLE001 - best effort: first use computes the block
            logger.warning("document blocks not precomputed (%s); they are computed on first use", exc)
        if written:
            logger.info("stored %d document blocks for %d new documents", written, len(docs))

    runtime.spawn(run())


async def _encode_when_quiet(runtime: Any, pipeline: Pipeline, docs: list[Document]) -> int:
    """:meth:`heedrank.blocks.BlockSync.encode_new` of ``docs`` in the ingest pool once the
    service is quiet; the blocks written. A full ingest queue is retried after its
    ``Retry-After`` (0.1 to 5 s).

    Raises:
        KVStoreError, KVStoreMismatchError: see :meth:`heedrank.blocks.BlockSync.encode_new`.
        UnhealthyError: the pool closed (shutdown).
    """
    while True:
        await runtime.quiet.wait_idle_async()
        try:
            return await runtime.pools["ingest"].run(pipeline.blocks.encode_new, docs, units=len(docs))
        except OverloadedError as exc:  # writes queued first: they are acknowledged before this
            await asyncio.sleep(min(5.0, max(0.1, float(exc.retry_after or 1.0))))


def _check_sizes(body: UpsertRequest, settings: Settings) -> None:
    if len(body.documents) > settings.max_ingest_documents:
        raise PayloadTooLargeError(
            f"{len(body.documents)} documents is over the limit of {settings.max_ingest_documents} per request; "
            "send them in several requests"
        )
    for i, d in enumerate(body.documents):
        n = len(d.title) + len(d.text)
        if n > settings.max_document_chars:
            raise PayloadTooLargeError(
                f"documents[{i}] ({d.id!r}) has {n} characters, over the limit of {settings.max_document_chars}; "
                "split it into several documents"
            )


@router.post("/documents", response_model=UpsertResponse, responses=_WRITE_ERRORS, summary="Add or replace documents")
async def upsert_documents(body: UpsertRequest, runtime: RuntimeDep, settings: SettingsDep) -> UpsertResponse:
    """Add documents, or replace those whose ``id`` exists (text, title and metadata as a
    whole). All or nothing: a batch with a repeated id or invalid metadata is rejected (422)
    and nothing is written. The answer comes once the batch is durable and searchable
    (BM25 at once; dense vectors are encoded before the commit).

    Errors: 413 too many documents or a document too long; 409 read-only collection; 404
    unknown collection; 429 ingest queue full.
    """
    name = body.collection or settings.default_collection
    pipeline = runtime.pipeline(name)
    _check_sizes(body, settings)
    index = _writable_index(pipeline, name)
    docs = [Document(d.id, d.text, d.title, d.metadata) for d in body.documents]
    result = await runtime.pools["ingest"].run(index.add_documents, docs, units=len(docs))
    _encode_blocks_later(runtime, pipeline, name, docs)
    return UpsertResponse(collection=name, added=result["added"], replaced=result["replaced"],
                          num_docs=len(index.docstore))


@router.get("/documents/{doc_id:path}", response_model=DocumentOut, responses=_READ_ERRORS, summary="Get a document")
async def get_document(doc_id: str, runtime: RuntimeDep, settings: SettingsDep,
                       collection: CollectionParam = None) -> DocumentOut:
    """The stored document ``doc_id`` (404 if the collection does not hold it)."""
    name = collection or settings.default_collection
    pipeline = runtime.pipeline(name)
    found = pipeline.docstore.get_many([doc_id])
    if doc_id not in found:
        raise NotFoundError(f"collection {name!r} has no document {doc_id!r}")
    d = found[doc_id]
    return DocumentOut(collection=name, id=d.doc_id, title=d.title, text=d.text, metadata=dict(d.metadata))


@router.delete("/documents/{doc_id:path}", response_model=DeleteResponse, responses=_WRITE_ERRORS,
               summary="Delete a document")
async def delete_document(doc_id: str, runtime: RuntimeDep, settings: SettingsDep,
                          collection: CollectionParam = None) -> DeleteResponse:
    """Delete ``doc_id``; answered once the deletion is durable, after which no search
    returns it. Its block in the collection's document KV store (cached BlockRank) is
    dropped right after the commit, before the answer
    (:meth:`heedrank.pipeline.Pipeline.delete_documents`). 404 if the collection does not
    hold it."""
    name = collection or settings.default_collection
    pipeline = runtime.pipeline(name)
    index = _writable_index(pipeline, name)
    result = await runtime.pools["ingest"].run(pipeline.delete_documents, [doc_id])
    if not result["deleted"]:
        raise NotFoundError(f"collection {name!r} has no document {doc_id!r}")
    return DeleteResponse(collection=name, deleted=doc_id, num_docs=len(index.docstore))
