"""Fakes for the API unit tests: a tiny in-memory corpus, a term-overlap retriever and a
FAKE reranker (registered by the ``fake_reranker`` fixture), so that no index or language
model is loaded."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from block_fakes import FakeCached  # tests/block_fakes.py
from heedrank.config import RerankerConfig
from heedrank.pipeline import Pipeline, reranker_factory
from heedrank.protocols import RerankResult
from heedrank.types import Document, Query, Ranking
from serving_fakes import AttributeServing  # noqa: E402

DOCS = [
    Document("d01", "Apples are red or green fruit grown in orchards.", "Apples", {"year": 2020, "tags": ["fruit"]}),
    Document("d02", "Green apples taste sour; red apples taste sweet.", "Apple taste"),
    Document("d03", "Bananas are yellow fruit.", "Bananas"),
    Document("d04", "An apple a day keeps the doctor away, says an old proverb about fruit.", "Proverb"),
    Document("d05", "Orchards grow apples, pears and plums.", "Orchards"),
    Document("d06", "Pears are sweet fruit related to apples.", "Pears"),
    Document("d07", "Cider is made from fermented apples.", "Cider"),
    Document("d08", "Plums are purple stone fruit.", "Plums"),
    Document("d09", "Fruit salad mixes apples, bananas, pears and grapes.", "Fruit salad"),
    Document("d10", "Grapes grow in vineyards.", "Grapes"),
    Document("d11", "Apple pie is a baked dessert with apples and cinnamon.", "Apple pie"),
    Document("d12", "Citrus fruit such as oranges are rich in vitamin C.", ""),
]


def _terms(text: str) -> set[str]:
    return {t.strip(".,;:!?").lower() for t in text.split()} - {""}


class OverlapRetriever:
    """Scores every document by the number of query terms in its content (ties by doc id)."""

    def __init__(self, docs: Sequence[Document], name: str = "bm25", fail: Exception | None = None) -> None:
        self.name = name
        self.docs = list(docs)
        self.fail = fail
        self.calls: list[dict[str, Any]] = []

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: Mapping[str, Any] | None = None) -> list[Ranking]:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        self.calls.append({"k": k, "on_event_loop": on_loop})
        if self.fail is not None:
            raise self.fail
        out = []
        for q in queries:
            qt = _terms(q.text)
            scores = {d.doc_id: float(len(qt & _terms(d.content))) for d in self.docs}
            out.append(Ranking.from_scores(q.query_id, scores, k))
        return out


class FakeReranker(AttributeServing):
    """Scores candidates by ``1 / len(content)`` (shorter first) so the order differs from the
    first stage; documents longer than 60 characters are reported as truncated."""

    name = "fake"
    loads = 0

    def __init__(self, config: RerankerConfig) -> None:
        self.config = config
        self.model_loaded = False
        FakeReranker.loads += 1

    def load(self) -> FakeReranker:
        """Stands for loading the LM (the API calls it at start-up with ``preload``)."""
        self.model_loaded = True
        return self

    @classmethod
    def from_config(cls, config: RerankerConfig) -> FakeReranker:
        return cls(config)

    def rerank(self, query: Query, candidates: Sequence[Document]) -> RerankResult:
        scores = {d.doc_id: 1.0 / len(d.content) for d in candidates}
        return RerankResult(
            ranking=Ranking.from_scores(query.query_id, scores),
            truncated=tuple(d.doc_id for d in candidates if len(d.content) > 60),
            prompt_tokens=sum(len(d.content.split()) for d in candidates),
        )

    def rerank_batch(self, queries, candidates):
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self) -> dict[str, Any]:
        return {"method": "fake", "model": "none"}


def make_pipeline(retriever: OverlapRetriever | None = None, factory=None) -> Pipeline:
    from heedrank.index.memory import InMemoryDocStore

    retriever = retriever or OverlapRetriever(DOCS)
    return Pipeline(
        retrievers={retriever.name: retriever},
        docstore=InMemoryDocStore(DOCS),
        reranker_factory=factory or reranker_factory(RerankerConfig()),
        max_top_k=20,
        max_candidates=8,
    )


class SlowReranker(FakeReranker):
    """A fake reranker that waits for ``gate`` (when set) and sleeps ``delay`` seconds per
    call, to fill the inference queue and pass deadlines. Registered as ``"slow"``."""

    name = "slow"
    gate: threading.Event | None = None
    delay = 0.0
    started = 0

    def rerank(self, query: Query, candidates: Sequence[Document]) -> RerankResult:
        SlowReranker.started += 1
        if SlowReranker.gate is not None:
            assert SlowReranker.gate.wait(30), "test gate never opened"
        if SlowReranker.delay:
            time.sleep(SlowReranker.delay)
        rr = super().rerank(query, candidates)
        return replace(rr, seconds=SlowReranker.delay)


class BlockingLoadReranker(FakeReranker):
    """A fake whose ``load()`` waits for ``gate`` (models "still loading") or raises ``fail``."""

    name = "blockload"
    gate: threading.Event | None = None
    fail: Exception | None = None

    def load(self) -> BlockingLoadReranker:
        if BlockingLoadReranker.gate is not None:
            assert BlockingLoadReranker.gate.wait(30), "test gate never opened"
        if BlockingLoadReranker.fail is not None:
            raise BlockingLoadReranker.fail
        return super().load()


class ExplainingReranker(FakeReranker):
    """A fake with ``rerank_with_evidence``: the first word of each text is its evidence."""

    name = "explain"

    def rerank_with_evidence(self, query: Query, candidates: Sequence[Document], *, max_spans: int = 3) -> RerankResult:
        from heedrank.types import EvidenceSpan

        rr = self.rerank(query, candidates)
        ev = {}
        for d in candidates:
            word = d.text.split()[0]
            ev[d.doc_id] = [EvidenceSpan("text", 0, len(word), word, 1.0)][:max_spans]
        return replace(rr, evidence=ev)


class BatchedReranker(FakeReranker):
    """A fake that scores its candidates in batches of ``batch_size``, sleeping ``batch_seconds``
    per batch and calling :func:`heedrank.cancel.check` between batches, as the attention
    rerankers do at each layer: a job whose caller stopped waiting stops at its next batch.
    Registered as ``"batched"``; ``calls`` counts the rerankings started, ``batches`` the
    batches scored."""

    name = "batched"
    batch_size = 10
    batch_seconds = 0.4
    calls = 0
    batches = 0

    def rerank(self, query: Query, candidates: Sequence[Document]) -> RerankResult:
        from heedrank.cancel import check

        t0 = time.perf_counter()
        BatchedReranker.calls += 1
        for _ in range(0, len(candidates), BatchedReranker.batch_size):
            check()
            time.sleep(BatchedReranker.batch_seconds)
            BatchedReranker.batches += 1
        return replace(super().rerank(query, candidates), seconds=time.perf_counter() - t0)


class SlowBlocks(FakeCached):
    """:class:`block_fakes.FakeCached` that takes ``seconds`` per block and says when each
    block's encoding started: ``starts`` (:func:`time.monotonic`, one per block), and
    ``encoding`` is set at each start (a test clears it to see whether another block starts)."""

    def __init__(self, seconds: float = 0.02) -> None:
        super().__init__()
        self.seconds = seconds
        self.starts: list[float] = []
        self.encoding = threading.Event()

    def encode_block_arrays(self, texts: Sequence[str]) -> list[tuple[Any, Any, Any]]:
        out = []
        for text in texts:
            self.starts.append(time.monotonic())
            self.encoding.set()
            time.sleep(self.seconds)
            out += super().encode_block_arrays([text])
        return out

    def wait_encoded(self, n: int, seconds: float = 20.0) -> None:
        """Wait until ``n`` blocks are encoded."""
        deadline = time.monotonic() + seconds
        while len(self.encoded) < n:
            assert time.monotonic() < deadline, f"{len(self.encoded)} of {n} blocks encoded"
            self.encoding.wait(0.05)


class HeldRequest:
    """One request held in ``pool`` (an :class:`heedrank.api.inference.InferencePool`) from
    :meth:`start` until :meth:`release`: a job that waits on an event, submitted from a thread
    with its own event loop. ``submitted_at`` is the :func:`time.monotonic` time just before the
    job was queued (no await between), ``running`` is set once the job runs, and ``released_at``
    is the time :meth:`release` was called (the job ends after it)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.running = threading.Event()
        self._release = threading.Event()
        self.submitted_at: float | None = None
        self.released_at: float | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._submit()), daemon=True)

    async def _submit(self) -> None:
        self.submitted_at = time.monotonic()
        await self.pool.run(self._job)

    def _job(self) -> None:
        self.running.set()
        assert self._release.wait(30), "the held request was never released"

    def start(self) -> HeldRequest:
        self._thread.start()
        assert self.running.wait(10), "the held request never ran"
        return self

    def release(self) -> None:
        self.released_at = time.monotonic()
        self._release.set()
        self._thread.join(10)
