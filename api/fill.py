"""The service's background fill of a collection's document KV store, while no request is served
(:class:`BlockFiller`; started by :class:`heedrank.api.runtime.Runtime` once the models are loaded),
and what it waits for (:class:`QuietGate`).

The store, its header and the reranker's side of the contract are the core package's
(:mod:`heedrank.blocks`); this module is the service's thread that keeps a store filling, and
encodes the blocks of upserted documents (:meth:`BlockFiller.add`, from ``POST /documents``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from heedrank.blocks import BlockKey, block_store_for
from heedrank.types import Document

logger = logging.getLogger(__name__)

__all__ = ["BlockFiller", "IdleSignal", "QuietGate"]


class IdleSignal(Protocol):
    """What :class:`BlockFiller` waits on before each block: whether the service is idle
    (:class:`QuietGate` in the service; :class:`heedrank.pipeline.RerankerCache` counts the
    rerank calls in flight)."""

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until idle or ``timeout`` seconds passed (``0``: look once); whether idle."""
        ...


class IdlePool(Protocol):
    """A pool :class:`QuietGate` watches (:class:`heedrank.api.inference.InferencePool`)."""

    def idle_for(self) -> float:
        """Seconds since the pool last had a job queued or running; 0.0 while it has one."""
        ...


class QuietGate:
    """When the service's background LM work (the fill, upserted documents' blocks) may run: once
    none of ``pools`` has had a request queued or running for ``hold`` seconds, so that a stream
    of requests is not interleaved with that work. An :class:`IdleSignal`.

    Looking is cheap (one lock per pool, no I/O: :meth:`IdlePool.idle_for`); a waiter looks every
    ``poll`` seconds while a request is in flight, so it goes on at most ``poll`` seconds after
    the hold. A request that comes while a block is being encoded waits for that block only:
    the work looks before each block.

    Args:
        pools: The pools whose requests the work steps aside for (the service's ``rerank`` and
            ``search`` pools: :class:`heedrank.api.runtime.Runtime`).
        hold: Seconds every pool must have been idle (>= 0).
        poll: Seconds between two looks while waiting (> 0).

    Raises:
        ValueError: a negative ``hold`` or a ``poll`` that is not positive.
    """

    def __init__(self, pools: Sequence[IdlePool], *, hold: float = 0.3, poll: float = 0.05) -> None:
        if hold < 0 or poll <= 0:
            raise ValueError(f"hold must be >= 0 and poll > 0, got {hold}, {poll}")
        self.pools, self.hold, self.poll = tuple(pools), float(hold), float(poll)

    def quiet_in(self) -> float | None:
        """Seconds left until the work may go on if no request comes (0.0: it may now); ``None``
        while a request is queued or running."""
        idle = min((p.idle_for() for p in self.pools), default=float("inf"))
        if idle <= 0.0:
            return None
        return max(0.0, self.hold - idle)

    def _nap(self, left: float | None) -> float:
        return self.poll if left is None else min(left, self.poll)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the work may go on (see :meth:`quiet_in`), or ``timeout`` seconds
        (``None``: no limit; ``0``: look once); whether it may."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = self.quiet_in()
            if left == 0.0:
                return True
            nap = self._nap(left)
            if end is not None:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                nap = min(nap, remaining)
            time.sleep(nap)

    async def wait_idle_async(self) -> None:
        """:meth:`wait_idle` without a limit, on the event loop (cancellable)."""
        while (left := self.quiet_in()) != 0.0:
            await asyncio.sleep(self._nap(left))


class BlockFiller:
    """Fills one collection's document KV store in the background, while no request is
    served: first the blocks that searches skipped (:meth:`offer`, most recent request
    first), then those of upserted documents (:meth:`add`, in the order given), then every
    document's block the store lacks, in document order.

    It looks at ``idle`` before each block and encodes one block at a time, under the
    reranker's lock, only when ``idle`` says the service is idle (in the service a
    :class:`QuietGate`: no request queued or running in the ``rerank`` and ``search`` pools for
    ``HEEDRANK_FILL_HOLD_S``), so a request waits for at most the one block in progress (about
    0.06 s for the packaged SmolLM2 on 2 cores). While it waits, :attr:`paused` is true, blocks
    encoded are still committed after ``commit_seconds``, and :meth:`stop` stops it within
    :attr:`pause_poll` seconds. Encoded blocks are committed in batches of
    ``commit_every`` (or after ``commit_seconds``), with ``admit=False`` (an explicit fill is
    not subject to the store's admission rule, only to its disk budget). A restart loses the
    queues (skipped blocks, upserted documents), not the fill: the document scan starts again,
    skips what is stored and encodes what is missing. The scan stops when the store holds its
    disk budget (a store with a budget exposes ``disk_budget``); queued blocks still go in (the
    store evicts for them).

    The log says how far the document scan is: a line each :attr:`progress_step` percent of
    the documents, and one when every block is stored. :meth:`describe` (``GET /info``)
    reads counters this thread keeps, never the store's files, so it answers at once
    while the store fills.

    Args:
        index: The collection's index (a :class:`heedrank.blocks.BlockStoreOwner` with a ``docstore``).
        reranker: The service's start-up reranker in cached mode (:class:`heedrank.blocks.BlockCachingReranker`).
        lock: What admits the reranker's calls (:func:`heedrank.pipeline.call_gate`); the fill
            takes it around each block it encodes.
        idle: Whether the service is idle (:class:`IdleSignal`; the service's :class:`QuietGate`).
        name: The collection's name, for logs.
    """

    commit_every = 16
    commit_seconds = 2.0
    scan_chunk = 256
    progress_step = 10
    """Percent of the documents between two progress lines of the document scan."""
    stats_seconds = 10.0
    """Least seconds between two reads of the store's byte counts (:meth:`describe`'s ``live_bytes``)."""
    pause_poll = 0.1
    """Most seconds between two looks at the stop flag while the fill waits for the service to be idle."""

    def __init__(self, index: Any, reranker: Any, lock: threading.BoundedSemaphore, idle: IdleSignal, *,
                 name: str = "default") -> None:
        self.index, self.reranker, self.lock, self.idle, self.name = index, reranker, lock, idle, name
        self.store: Any = None
        self.filled = 0
        """Blocks encoded and committed by this filler since it started."""
        self.scan_done = False
        """Every document's block was found stored or encoded."""
        self.at_budget = False
        """The scan stopped because the store holds its disk budget."""
        self.documents: int | None = None
        """Live documents of the collection when the scan started (``None`` before)."""
        self.scanned = 0
        """Documents the scan has looked at: their blocks found stored, or handed to the fill to
        encode (the one in progress included). Equals :attr:`documents` once the scan is done."""
        self.paused = False
        """The fill waits for the service to be idle (a request is queued or running, or was within the hold)."""
        self.pauses = 0
        """Times the fill stepped aside for requests since it started."""
        self._next_progress = self.progress_step  # percent
        self._blocks: int | None = None
        self._live_bytes: int | None = None
        self._stats_at = 0.0
        self._queue: dict[BlockKey, str] = {}
        self._added: deque[str] = deque()  # texts of upserted documents, oldest first
        self._ready: deque[tuple[BlockKey, str]] = deque()  # the filling thread's: keys of the next added texts
        self._qlock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> BlockFiller:
        """Open the store (created when missing) and start the filling thread; a no-op when
        the reranker reads no stored blocks or the index keeps none."""
        self.store = block_store_for(self.reranker, self.index, create=True)
        if self.store is None or self.store.readonly:
            return self
        self._read_stats()
        self._thread = threading.Thread(target=self._run, name=f"heedrank-fill-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop after the block in progress, or within :attr:`pause_poll` seconds while the fill
        steps aside (the blocks encoded are committed); waits at most ``timeout`` seconds for
        the thread (``None``: no limit)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def describe(self) -> dict[str, Any]:
        """The store and its fill, for ``GET /info``: ``blocks`` stored, ``live_bytes`` (as of
        the last commit, read at most every :attr:`stats_seconds`), ``disk_budget`` (bytes or
        ``None``), ``filling`` (the thread runs), ``queued`` skipped blocks, ``filled`` (blocks
        this fill encoded), ``paused`` (stepped aside for requests: :attr:`paused`), ``pauses``,
        ``scan_done``, ``at_budget``, ``documents`` and ``scanned`` (the
        document scan's progress: equal once ``scan_done``). ``blocks`` may stay below
        ``documents`` with the scan done: documents whose blocks have the same tokens (identical
        texts, or texts identical up to the block's token budget) share one block (NFCorpus: 40
        of its 3633 documents repeat another's text). Counters only: no store I/O, no lock the
        fill holds for long (the block count is the store's in-memory one)."""
        blocks = self._blocks
        if self.store is not None:
            try:
                blocks = len(self.store)
            except Exception:  # noqa: BLE001 - a closed store: the last count read
                pass
        return {
            "blocks": blocks,
            "live_bytes": self._live_bytes,
            "disk_budget": getattr(self.store, "disk_budget", None),
            "filling": self.running and (not (self.scan_done or self.at_budget) or self.queued() > 0),
            "queued": self.queued(), "filled": self.filled, "paused": self.paused, "pauses": self.pauses,
            "scan_done": self.scan_done, "at_budget": self.at_budget,
            "documents": self.documents, "scanned": self.scanned,
        }

    def _read_stats(self, force: bool = True) -> None:
        """Refresh the counters :meth:`describe` reports: the block count (cheap, in memory)
        always, the byte counts (a pass over the store's files) when ``force`` or at most every
        :attr:`stats_seconds`."""

        try:
            self._blocks = len(self.store)
            if force or time.monotonic() - self._stats_at >= self.stats_seconds:
                self._live_bytes = int(self.store.stats().live_bytes)
                self._stats_at = time.monotonic()
        except Exception:  # noqa: BLE001 - counters for /info only
            logger.debug("collection %r: reading the document KV store's counters failed", self.name, exc_info=True)

    def _progress(self) -> None:
        """A log line each time the scan passes another :attr:`progress_step` of the documents."""
        total = self.documents
        percent = self.scanned * 100 // total if total else 0
        if not total or percent < self._next_progress:
            return
        logger.info("collection %r: document KV store fill %d%% (%d of %d documents scanned; %s blocks stored, "
                    "%d encoded by this fill)", self.name, percent, self.scanned, total,
                    "?" if self._blocks is None else self._blocks, self.filled)
        self._next_progress = (percent // self.progress_step + 1) * self.progress_step

    def queued(self) -> int:
        """Blocks waiting to be filled: skipped ones (:meth:`offer`) and those of upserted
        documents (:meth:`add`; counted before the store is asked, so some may be stored already)."""
        with self._qlock:
            return len(self._queue) + len(self._added) + len(self._ready)

    def add(self, documents: Sequence[Document]) -> None:
        """Queue the blocks of upserted ``documents`` (after their commit) to be encoded, after
        the skipped blocks and ahead of the document scan; those already stored are skipped.
        Never blocks: no tokenisation, no LM (the filling thread does both). The queue is in
        memory: after a restart the document scan finds the blocks still missing (unless the
        store is at its disk budget, when searches compute them on first use)."""
        with self._qlock:
            self._added.extend(d.content for d in documents)
        self._wake.set()

    def offer(self, documents: Sequence[Document]) -> None:
        """Queue the blocks of ``documents`` (candidates a search skipped as cold) ahead of the
        document scan. Tokenisation only; never blocks on the LM."""
        texts = [d.content for d in documents]
        keys = self.reranker.block_keys(texts)
        with self._qlock:
            for key, text in zip(keys, texts):
                self._queue.pop(key, None)
                self._queue[key] = text  # most recent last: taken first
        self._wake.set()

    def _next_queued(self) -> tuple[BlockKey, str] | None:
        with self._qlock:
            if not self._queue:
                return None
            key = next(reversed(self._queue))
            return key, self._queue.pop(key)

    def _next_added(self) -> tuple[BlockKey, str] | None:
        """The next upserted document's ``(key, text)``; keys computed :attr:`scan_chunk` texts at a time."""
        if not self._ready:
            with self._qlock:
                texts = [self._added.popleft() for _ in range(min(self.scan_chunk, len(self._added)))]
            if texts:
                ready = deque(zip(self.reranker.block_keys(texts), texts))
                with self._qlock:  # counted by queued() throughout
                    self._ready = ready
        if not self._ready:
            return None
        with self._qlock:
            return self._ready.popleft()

    def _scan(self) -> Iterator[tuple[BlockKey, str]]:
        """``(key, text)`` of every live document whose block the store lacks (checked again
        before encoding), in document order."""
        chunk: list[str] = []
        for doc in self.index.docstore.iter_documents():
            chunk.append(doc.content)
            if len(chunk) >= self.scan_chunk:
                yield from self._missing(chunk)
                chunk = []
        yield from self._missing(chunk)

    def _missing(self, texts: list[str]) -> Iterator[tuple[BlockKey, str]]:
        if self._stop.is_set():
            return
        for key, text in zip(self.reranker.block_keys(texts), texts):
            # counted before the yield: the fill encodes a yielded block before it asks for the next
            # item, and may never ask again (the disk budget reached), so a count after the yield
            # missed the last document handed over
            self.scanned += 1
            self._progress()
            if not self.store.contains(key):
                yield key, text

    def _full(self, pending: int) -> bool:
        """Whether one more block (after the ``pending`` ones not committed yet) could evict
        another: each counted at the largest a block can be."""
        budget = getattr(self.store, "disk_budget", None)
        if not budget:
            return False
        header = self.store.header
        largest = self.store.codec.nbytes(header.max_doc_tokens)
        return int(self.store.budget_bytes()) + (pending + 1) * largest > int(budget)  # O(1): checked per block

    def _run(self) -> None:

        scan: Iterator[tuple[BlockKey, str]] | None = self._scan()
        pending: dict[BlockKey, tuple[Any, Any]] = {}
        finished = full = False
        last_commit = time.monotonic()
        try:
            self.documents = len(self.index.docstore)
        except Exception:  # noqa: BLE001 - progress lines only
            self.documents = None
        logger.info("collection %r: filling the document KV store in the background (%s blocks stored, %s "
                    "documents; a log line every %d%%)", self.name, "?" if self._blocks is None else self._blocks,
                    "?" if self.documents is None else self.documents, self.progress_step)
        try:
            while not self._stop.is_set():
                item = self._next_queued()
                if item is None:
                    item = self._next_added()
                if item is None and scan is not None:
                    if self._full(len(pending)):
                        full = True
                        logger.info("collection %r: the document KV store holds its disk budget; the background "
                                    "fill stops its document scan", self.name)
                        scan = None
                    else:
                        item = next(scan, None)
                        if item is None:
                            scan = None
                            finished = True
                if item is None:
                    self._commit(pending)
                    self._read_stats(force=False)  # idle: blocks written by searches and ingests count too
                    if full:
                        self.at_budget = True  # after the commit: what the scan stored is visible
                    if finished and not self.scan_done:
                        self.scan_done = True
                        self._read_stats()
                        logger.info("collection %r: document KV store full: every document's block is stored "
                                    "(%s blocks, %d encoded by this fill)", self.name,
                                    "?" if self._blocks is None else self._blocks, self.filled)
                    self._wake.wait(1.0)
                    self._wake.clear()
                    continue
                key, text = item
                if key in pending or self.store.contains(key):
                    continue
                if not self.idle.wait_idle(0):
                    last_commit = self._step_aside(pending, last_commit)
                    if self._stop.is_set() or self.store.contains(key):  # a search may have stored it meanwhile
                        continue
                with self.lock:
                    ((k, kk, vv),) = self.reranker.encode_block_arrays([text])
                pending[k] = (kk, vv)
                if len(pending) >= self.commit_every or time.monotonic() - last_commit > self.commit_seconds:
                    self._commit(pending)
                    last_commit = time.monotonic()
            self._commit(pending)
        except Exception:  # noqa: BLE001 - a background task: log, never take the service down
            logger.exception("collection %r: the background fill of the document KV store stopped", self.name)

    def _step_aside(self, pending: dict[BlockKey, tuple[Any, Any]], last_commit: float) -> float:
        """Wait until ``idle`` says the service is idle or :meth:`stop` is called, committing
        ``pending`` once it is ``commit_seconds`` old; the time of the last commit."""
        self.paused = True
        self.pauses += 1
        logger.debug("collection %r: the background fill steps aside for requests", self.name)
        try:
            while not self._stop.is_set() and not self.idle.wait_idle(self.pause_poll):
                if pending and time.monotonic() - last_commit > self.commit_seconds:
                    self._commit(pending)
                    last_commit = time.monotonic()
        finally:
            self.paused = False
        return last_commit

    def _commit(self, pending: dict[BlockKey, tuple[Any, Any]]) -> None:
        if not pending:
            return
        written = self.store.put_many(pending, admit=False)
        self.filled += int(written)
        pending.clear()
        self._read_stats(force=False)
