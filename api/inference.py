"""Bounded inference pools: blocking pipeline work off the event loop, admission by queue size.

A :class:`InferencePool` owns ``workers`` threads and a FIFO queue of at most
``queue_size`` waiting jobs. :meth:`InferencePool.run` admits a job when a worker is idle
or the queue has room, and otherwise raises :class:`~heedrank.errors.OverloadedError`
(HTTP 429) at once, so that many clients get answers or a quick 429, never an unbounded
wait. Jobs start in arrival order (first come, first served). A job whose caller stopped
waiting (deadline passed, request cancelled) before it started is dropped unrun; one that
has started is asked to stop (:mod:`heedrank.cancel`): an attention reranker stops at its
next layer, so the worker is free for the next job instead of finishing work nobody reads.
A caller whose client hung up gets :class:`ClientGoneError` (the app answers 499).

A job may carry an absolute ``deadline`` (:func:`time.perf_counter` seconds, e.g. a request's
arrival plus its budget: :mod:`heedrank.api.deadline`) that covers its wait for a worker and its
run alike: :meth:`InferencePool.run` raises :class:`DeadlineExceeded` at once when the estimate
says the job cannot end by then, when a worker frees with less time left than the job's estimated
run, or at the deadline itself (the job dropped, or stopped at its next layer).

The service runs two pools (see :mod:`heedrank.api.runtime`): ``search`` for first-stage-only
searches (cheap, several threads) and ``rerank`` for anything that runs the language
model (one model instance shared, ``HEEDRANK_WORKERS`` threads).

Example:
    >>> pool = InferencePool("rerank", workers=1, queue_size=8)
    >>> result = await pool.run(pipeline.search, query, options, units=20)   # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from heedrank.cancel import CancelToken, cancel_scope
from heedrank.errors import JobCancelledError, OverloadedError, UnhealthyError

logger = logging.getLogger(__name__)


class ClientGoneError(asyncio.CancelledError):
    """:meth:`InferencePool.run`'s cancellation when its client went away: an
    :class:`asyncio.CancelledError` (the job was cancelled) that says why, so that the app
    answers it as the client's doing (499 ``client_closed``, logged at info:
    :class:`heedrank.api.middleware.ClientGoneMiddleware`) and never as a crash. Raised only
    for a disconnected client, never for a cancellation of the waiting task itself."""


class DeadlineExceeded(TimeoutError):
    """:meth:`InferencePool.run`'s answer when a job cannot end by its deadline (or ``timeout``).

    Args:
        reason: ``"estimate"``: the job never started: its estimated end (the work queued and
            running ahead, then its own, from the running mean of seconds per unit) was past
            the deadline when it was submitted, or when a worker freed for it; ``"timeout"``:
            the deadline passed while it waited (dropped unrun) or ran (asked to stop).
        message: What happened, for logs.
        ran: Seconds the job had run when the deadline stopped it (0.0: it never started).
    """

    def __init__(self, reason: str, message: str, ran: float = 0.0) -> None:
        super().__init__(message)
        self.reason = reason
        self.ran = ran


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    units: float
    enqueued: float = field(default_factory=time.perf_counter)
    token: CancelToken = field(default_factory=CancelToken)
    started: bool = False
    started_at: float | None = None
    deadline: float | None = None
    elastic: bool = False
    client_gone: bool = False
    is_disconnected: Callable[[], Coroutine[Any, Any, bool]] | None = None


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller gave up (deadline, cancellation)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class InferencePool:
    """A fixed set of worker threads with a bounded FIFO queue.

    Args:
        name: Pool name (metrics label, messages).
        workers: Worker threads (>= 1).
        queue_size: Jobs that may wait while every worker is busy (>= 0).
        max_wait: Refuse (429) a job whose estimated wait for a worker is longer than this
            many seconds, even when the queue has room (``None``: no limit). The estimate
            is the running mean of seconds per unit times the units queued and running,
            shared by the workers; it exists once a job has finished.
        observe: Called as ``observe(stage, seconds)`` with ``"queue_wait"`` and
            ``"run"`` times of each job, and ``("rejected", 0.0)`` for each refusal
            (metrics); exceptions in it are logged.
        ewma_alpha: Weight of the newest job in the running mean of seconds per unit.
        stop_abandoned: Ask a started job to stop (:mod:`heedrank.cancel`) when its caller
            stops waiting (client gone, timeout, cancellation). ``False`` for work that must
            finish once started (durable writes).

    Attributes:
        rejected: Jobs refused because the queue was full.
    """

    def __init__(
        self,
        name: str,
        workers: int,
        queue_size: int,
        *,
        max_wait: float | None = None,
        observe: Callable[[str, float], None] | None = None,
        ewma_alpha: float = 0.2,
        stop_abandoned: bool = True,
    ) -> None:
        if workers < 1 or queue_size < 0:
            raise ValueError(f"workers must be >= 1 and queue_size >= 0, got {workers}, {queue_size}")
        self.name = name
        self.workers = workers
        self.queue_size = queue_size
        self.max_wait = max_wait
        self.observe = observe
        self.ewma_alpha = ewma_alpha
        self.stop_abandoned = stop_abandoned
        self.rejected = 0
        self._queue: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._idle = 0
        self._busy_units = 0.0
        self._queued_units = 0.0
        self._seconds_per_unit: float | None = None
        self._last_job = time.monotonic()  # when a worker last came back from a job (or started)
        self._closed = False
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> InferencePool:
        """Start the worker threads (idempotent); returns once they wait for jobs."""
        with self._cond:
            if self._threads:
                return self
            for i in range(self.workers):
                t = threading.Thread(target=self._work, name=f"heedrank-{self.name}-{i}", daemon=True)
                self._threads.append(t)
            for t in self._threads:
                t.start()
            # capacity counts idle workers: return once every worker waits for a job
            self._cond.wait_for(lambda: self._idle == self.workers, timeout=10)
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Refuse new jobs, fail the waiting ones with :class:`UnhealthyError`, stop the
        workers (a running job finishes; waits at most ``timeout`` seconds per worker)."""
        with self._cond:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._queued_units = 0.0
            self._cond.notify_all()
        for job in pending:
            self._resolve(job, None, UnhealthyError("the service is shutting down"))
        for t in self._threads:
            t.join(timeout)

    # -- state -----------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Jobs waiting for a worker."""
        return len(self._queue)

    @property
    def busy(self) -> int:
        """Workers running a job."""
        with self._cond:
            return len(self._threads) - self._idle if self._threads else 0

    def idle_for(self) -> float:
        """Seconds (:func:`time.monotonic`) since the pool last had a job queued or running; 0.0
        while it has one (a job waiting for a worker, dropped or not yet, counts; a closed pool
        has none). One lock, no I/O: the service's background LM work polls it to step aside
        (:class:`heedrank.api.fill.QuietGate`)."""
        with self._cond:
            if not self._closed and (self._queue or (self._threads and self._idle < len(self._threads))):
                return 0.0
            return time.monotonic() - self._last_job

    def seed(self, seconds_per_unit: float) -> None:
        """Start the running mean from a measurement (e.g. a warm-up call) instead of
        waiting for the first job, so that admission by ``max_wait`` and deadline
        estimates work from the first request on."""
        with self._cond:
            self._seconds_per_unit = float(seconds_per_unit)

    @property
    def seconds_per_unit(self) -> float | None:
        """Running mean of job seconds per unit of work (``None`` before the first job)."""
        return self._seconds_per_unit

    def estimate_seconds(self, units: float) -> float | None:
        """Estimated seconds until a job of ``units`` submitted now would finish: the work
        queued and running, shared by the workers, plus its own; ``None`` before any job
        has finished (nothing to estimate from)."""
        with self._cond:
            return self._estimate(units)

    def _estimate(self, units: float) -> float | None:  # caller holds self._cond
        spu = self._seconds_per_unit
        if spu is None:
            return None
        return spu * ((self._queued_units + self._busy_units) / self.workers + units)

    # -- submission ------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], *args: Any, units: float = 1.0) -> asyncio.Future:
        """Queue ``fn(*args)``; returns a future of the running event loop. Cancel the
        future to drop the job if it has not started, or (``stop_abandoned``) to stop it
        at its next batch or layer boundary if it has.

        Raises:
            OverloadedError: every worker is busy and ``queue_size`` jobs already wait, or
                the estimated wait exceeds ``max_wait``.
            UnhealthyError: the pool is closed.
        """
        return self._submit(fn, args, units)[0]

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], units: float,
                is_disconnected: Callable[[], Coroutine[Any, Any, bool]] | None = None,
                deadline: float | None = None, elastic: bool = False) -> tuple[asyncio.Future, _Job]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        job = _Job(fn, args, future, loop, float(units), is_disconnected=is_disconnected, deadline=deadline,
                   elastic=elastic)
        job.token.deadline = deadline  # what the work reads (heedrank.cancel.time_left) to fit itself to it
        if self.stop_abandoned:
            token = job.token
            future.add_done_callback(lambda f: token.cancel(
                "its caller stopped waiting (deadline passed or request cancelled)") if f.cancelled() else None)
        refusal = None
        with self._cond:
            if self._closed:
                raise UnhealthyError("the service is shutting down")
            wait = self._estimate(0.0)
            no_idle_worker = len(self._queue) >= self._idle
            if len(self._queue) >= self.queue_size + self._idle:
                refusal = OverloadedError(
                    f"the {self.name} queue is full ({self.workers} busy, {len(self._queue)} waiting); retry later",
                    retry_after=wait if wait is not None else 1.0,
                )
            elif self.max_wait is not None and wait is not None and wait > self.max_wait and no_idle_worker:
                refusal = OverloadedError(
                    f"the {self.name} queue is full: the estimated wait of {wait:.1f} s is over the limit of "
                    f"{self.max_wait:g} s; retry later",
                    retry_after=wait - self.max_wait,
                )
            else:
                late = self._late_at_submit(job)
                if late is not None:  # not a refusal: the caller answers by its deadline path
                    raise late
                self._queue.append(job)
                self._queued_units += job.units
                self._cond.notify()
                return future, job
            self.rejected += 1
        self._report("rejected", 0.0)
        raise refusal

    def _late_at_submit(self, job: _Job) -> DeadlineExceeded | None:  # caller holds self._cond
        if job.deadline is None:
            return None
        left = job.deadline - time.perf_counter()
        if left <= 0:
            return DeadlineExceeded("timeout", f"the {self.name} job's deadline passed before it was submitted")
        estimate = self._estimate(0.0 if job.elastic else job.units)  # an elastic job: only the wait ahead
        if estimate is not None and estimate > left:
            return DeadlineExceeded("estimate", f"the {self.name} job would end in about {estimate:.1f} s "
                                                f"(queued and running work first), {left:.1f} s are left")
        return None

    def _late_at_start(self, job: _Job) -> DeadlineExceeded | None:  # caller holds self._cond
        """A job a worker took: too late when less time is left than its own estimated run."""
        if job.deadline is None:
            return None
        left = job.deadline - time.perf_counter()
        spu = self._seconds_per_unit
        run = 0.0 if spu is None or job.elastic else spu * job.units
        if left > run:
            return None
        return DeadlineExceeded("estimate", f"a {self.name} worker freed {left:.1f} s before the job's deadline, "
                                            f"less than its estimated run of {run:.1f} s")

    async def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        units: float = 1.0,
        timeout: float | None = None,
        deadline: float | None = None,
        is_disconnected: Callable[[], Coroutine[Any, Any, bool]] | None = None,
        elastic: bool = False,
    ) -> Any:
        """Run ``fn(*args)`` on a worker and return its result (or raise its exception).

        Args:
            units: Size of the job (e.g. documents reranked) for the time estimate.
            timeout: Seconds to wait from now; then :class:`DeadlineExceeded` (a
                :class:`TimeoutError`, reason ``"timeout"``) is raised and the job is dropped
                if it has not started, or asked to stop if it has (see ``stop_abandoned``).
            deadline: The :func:`time.perf_counter` time by which the job must have ended, its
                wait for a worker included. As ``timeout`` at that time, and besides, once a job
                has finished (the running mean of seconds per unit exists): a job whose
                estimated end is past it is not queued, and a queued one whose worker frees
                with less time left than its estimated run is not started (both raise
                :class:`DeadlineExceeded`, reason ``"estimate"``, at once). With both, the
                earlier limit applies. The job reads it as :func:`heedrank.cancel.time_left`.
            elastic: The job fits its work to its deadline (it reads :func:`heedrank.cancel.time_left`:
                cached BlockRank encodes only the cold blocks that fit, :meth:`heedrank.pipeline.RerankerCache.rerank`),
                so the estimate refuses it only when the wait ahead alone would pass the deadline, never
                for its own size.
            is_disconnected: Polled every ``disconnect_poll`` seconds while the job waits
                or runs, and once more just before a worker starts it (e.g.
                ``request.is_disconnected``): a job whose client went away is dropped before it
                starts, or asked to stop if it has, and :class:`ClientGoneError` is raised.

        Raises:
            OverloadedError: the queue is full, or the estimated wait is over ``max_wait``
                (checked before ``deadline``).
            DeadlineExceeded: ``timeout`` or ``deadline`` (see above).
            ClientGoneError: ``is_disconnected`` said the client went away.
        """
        end = deadline
        if timeout is not None:
            end = min(time.perf_counter() + timeout, deadline if deadline is not None else float("inf"))
        future, job = self._submit(fn, args, units, is_disconnected, deadline, elastic)  # estimates: the deadline only
        watcher = None
        if is_disconnected is not None:
            watcher = asyncio.create_task(self._watch(future, job, is_disconnected))
        try:
            if end is None:
                return await future
            return await asyncio.wait_for(future, max(0.0, end - time.perf_counter()))
        except asyncio.CancelledError:
            if job.client_gone:
                raise ClientGoneError(f"the client closed the connection before its {self.name} job ended") from None
            raise
        except TimeoutError:
            if not future.cancelled():  # the job's own error, or a worker's "estimate"
                raise
            started_at = job.started_at
            ran = 0.0 if started_at is None else time.perf_counter() - started_at
            raise DeadlineExceeded("timeout", f"the {self.name} job's deadline passed "
                                              + (f"after it ran {ran:.2f} s" if started_at is not None
                                                 else "while it waited for a worker"), ran) from None
        finally:
            if watcher is not None:
                watcher.cancel()

    disconnect_poll = 0.5

    async def _watch(self, future: asyncio.Future, job: _Job, is_disconnected: Callable[[], Coroutine[Any, Any, bool]]) -> None:
        while not future.done():
            await asyncio.sleep(self.disconnect_poll)
            if not future.done() and await is_disconnected():
                logger.info("%s: the client went away; %s its job", self.name,
                            "stopping" if job.started and self.stop_abandoned else "dropping")
                job.client_gone = True
                job.token.cancel("the client closed the connection")
                future.cancel()
                return

    # -- workers ---------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                self._last_job = time.monotonic()
                if self._idle == self.workers:
                    self._cond.notify_all()  # start() waits for every worker to be idle
                while not self._queue and not self._closed:
                    self._cond.wait()
                self._idle -= 1
                if self._closed and not self._queue:
                    return
                job = self._queue.popleft()
                self._queued_units -= job.units
                if job.future.cancelled():  # the caller stopped waiting before the job started
                    continue
                late = self._late_at_start(job)
            if late is not None:  # answered at once, by its caller's deadline path
                self._resolve(job, None, late)
                continue
            if self._client_gone(job):  # its client hung up since the watcher last looked
                continue
            started = time.perf_counter()
            with self._cond:
                job.started = True
                job.started_at = started
                self._busy_units += job.units
            result: Any = None
            error: BaseException | None = None
            try:
                with cancel_scope(job.token if self.stop_abandoned else None):
                    result = job.fn(*job.args)
            except JobCancelledError as exc:  # nobody waits for it: no error to report
                logger.info("%s: job stopped after %.2f s (%s)", self.name, time.perf_counter() - started,
                            job.token.reason or exc)
                error = exc
            except BaseException as exc:  # handed to the caller, who maps it to an error body
                error = exc
            seconds = time.perf_counter() - started
            with self._cond:
                self._busy_units -= job.units
                if error is None and job.units > 0:
                    spu = seconds / job.units
                    prev = self._seconds_per_unit
                    self._seconds_per_unit = spu if prev is None else prev + self.ewma_alpha * (spu - prev)
            self._report("queue_wait", started - job.enqueued)
            self._report("run", seconds)
            self._resolve(job, result, error)

    start_check_timeout = 0.2
    """Seconds a worker waits for the event loop to say whether a job's client is still there."""

    def _client_gone(self, job: _Job) -> bool:
        """Ask the job's client (on its event loop) just before the job starts: jobs of
        clients that hung up together, e.g. on one client-side timeout, are all dropped
        instead of each running until its own watcher looks. A busy loop (no answer within
        :attr:`start_check_timeout`) or a failing check lets the job run."""
        if job.is_disconnected is None:
            return False
        if job.loop.is_closed():
            return False
        check: concurrent.futures.Future[bool] | None = None
        try:
            check = asyncio.run_coroutine_threadsafe(job.is_disconnected(), job.loop)
            gone = bool(check.result(timeout=self.start_check_timeout))
        except Exception:  # noqa: BLE001 - no answer: run the job, the watcher still looks
            if check is not None:
                check.cancel()
            return False
        if gone:
            logger.info("%s: the client went away; dropping its job", self.name)
            job.client_gone = True
            job.token.cancel("the client closed the connection")
            try:
                job.loop.call_soon_threadsafe(job.future.cancel)
            except RuntimeError:  # the event loop is closed: nobody is waiting any more
                pass
        return gone

    def _report(self, stage: str, seconds: float) -> None:
        if self.observe is None:
            return
        try:
            self.observe(stage, seconds)
        except Exception:  # pragma: no cover - metrics must never break inference
            logger.exception("metrics observer failed")

    @staticmethod
    def _resolve(job: _Job, result: Any, error: BaseException | None) -> None:
        try:
            job.loop.call_soon_threadsafe(_settle, job.future, result, error)
        except RuntimeError:  # the event loop is closed: nobody is waiting any more
            pass
