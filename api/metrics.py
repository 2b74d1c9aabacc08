"""Prometheus metrics of one app (its own ``CollectorRegistry``: no process-global state, so
several apps, e.g. in tests, never share counters).

=============================================  =========  ===============================
metric                                         type       labels
=============================================  =========  ===============================
``heedrank_requests_total``                    counter    route, method, status
``heedrank_request_duration_seconds``          histogram  route
``heedrank_stage_duration_seconds``            histogram  stage: retrieve, hydrate, rerank
``heedrank_queue_wait_seconds``                histogram  pool: time from admission to start
``heedrank_job_seconds``                       histogram  pool: time a worker ran the job
``heedrank_queue_depth``                       gauge      pool: jobs waiting for a worker
``heedrank_queue_busy_workers``                gauge      pool
``heedrank_rejected_total``                    counter    pool, reason (overloaded)
``heedrank_deadline_fallbacks_total``          counter    reason (estimate, timeout, overloaded, budget)
``heedrank_ready``                             gauge      1 once models are loaded, else 0
=============================================  =========  ===============================

``route`` is the route's path template (``/documents/{doc_id}``), or ``unmatched``.
"""

from __future__ import annotations

from collections.abc import Mapping

from heedrank.errors import require

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """The service's metrics (see the module docstring)."""

    def __init__(self) -> None:
        prom = require("prometheus_client", "api")
        self._prom = prom
        self.registry = prom.CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = prom.Counter(
            "heedrank_requests", "HTTP requests answered.", ["route", "method", "status"], registry=r
        )
        self.request_seconds = prom.Histogram(
            "heedrank_request_duration_seconds", "HTTP request latency in seconds.", ["route"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.stage_seconds = prom.Histogram(
            "heedrank_stage_duration_seconds", "Seconds per pipeline stage (retrieve, hydrate, rerank).",
            ["stage"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.queue_wait_seconds = prom.Histogram(
            "heedrank_queue_wait_seconds", "Seconds a job waited for an inference worker.", ["pool"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.job_seconds = prom.Histogram(
            "heedrank_job_seconds", "Seconds an inference worker ran a job.", ["pool"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.queue_depth = prom.Gauge(
            "heedrank_queue_depth", "Jobs waiting for an inference worker.", ["pool"], registry=r
        )
        self.busy_workers = prom.Gauge("heedrank_queue_busy_workers", "Workers running a job.", ["pool"], registry=r)
        self.rejected = prom.Counter("heedrank_rejected", "Requests refused.", ["pool", "reason"], registry=r)
        self.deadline_fallbacks = prom.Counter(
            "heedrank_deadline_fallbacks", "Rerank requests answered without the LM (scored by the default's scorer "
            "from the embedder's cosine, or in first-stage order) because of deadline_ms or the per-request budget "
            "(reason budget: HEEDRANK_REQUEST_BUDGET_S).",
            ["reason"], registry=r,
        )
        self.ready = prom.Gauge("heedrank_ready", "1 once the models are loaded.", registry=r)
        self.block_cache = prom.Counter(
            "heedrank_block_cache", "Candidate blocks of cached BlockRank: read from the document KV store or RAM "
            "cache (hit) or computed (miss).", ["result"], registry=r,
        )

    def observe_block_cache(self, cache: Mapping[str, int] | None) -> None:
        """Count one rerank's block ``{"hits", "misses"}`` (no-op for ``None``)."""
        if cache:
            self.block_cache.labels("hit").inc(int(cache.get("hits", 0)))
            self.block_cache.labels("miss").inc(int(cache.get("misses", 0)))

    def watch_pools(self, pools: Mapping[str, object]) -> None:
        """Read queue depth and busy workers of each pool at scrape time."""
        for name, pool in pools.items():
            self.queue_depth.labels(name).set_function(lambda p=pool: p.depth)
            self.busy_workers.labels(name).set_function(lambda p=pool: p.busy)

    def observer(self, pool: str):
        """An ``observe(stage, seconds)`` callback for :class:`heedrank.api.inference.InferencePool`."""

        def observe(stage: str, seconds: float) -> None:
            if stage == "rejected":
                self.rejected.labels(pool, "overloaded").inc()
                return
            hist = self.queue_wait_seconds if stage == "queue_wait" else self.job_seconds
            hist.labels(pool).observe(seconds)

        return observe

    def observe_timings(self, timings: Mapping[str, float]) -> None:
        """Pipeline stage timings of one search (seconds); ``total`` is skipped."""
        for stage, seconds in timings.items():
            if stage != "total":
                self.stage_seconds.labels(stage).observe(float(seconds))

    def render(self) -> tuple[bytes, str]:
        """The text exposition format and its content type."""
        return self._prom.generate_latest(self.registry), self._prom.CONTENT_TYPE_LATEST
