"""Query passes of one reranker run side by side: at most ``n`` at once, each in its own
context buffer, the torch threads shared among those running.

A cached BlockRank query pass only reads the model (its blocks are encoded by the base model,
its query adapter is never switched inside a pass), so several requests' passes can run at once
on one model instance; what each needs of its own is the storage its context is assembled into
(:class:`heedrank.reranker.doccache.ContextBuffer`, one per slot, reused).

What two passes share, and why none of it can change a score:

* the model's weights (the base model's, and the query adapter's private copy): only read, in
  ``torch.inference_mode``; a block encoder switches LoRA layers off on the base model only, which
  has none (the adapter lives in the copy, :mod:`heedrank.reranker.cached.adapter`);
* the tokenizer: every call goes through :func:`heedrank.reranker.prompt.token_encoder`, two
  private copies of the Rust tokenizer configured once and never written again. The tokenizer's
  own calls write their options (``split_special_tokens``, truncation) into the one shared Rust
  tokenizer before encoding, so two passes tokenising at once could split a template's special
  token or honour a document's: that was the race that moved scores by 0.27 with two passes;
* block 0's keys and values (computed once under a lock, then only read), the RAM tier of blocks
  and the tokenised-blocks LRU (each behind its own lock), the store (its own locks);
* nothing else: the context buffer is the slot's, the capture of the query rows' attention is an
  argument of the pass (never a module hook), the cache a pass writes its own keys into is built
  per pass over the slot's buffer, and the torch thread count is per OS thread.

Threads: torch's intra-op thread count is per OS thread (OpenMP's ``nthreads`` ICV; a thread
takes the last value set anywhere when it first runs an op). A pass entering a slot sets its own
thread's count to ``threads // running`` (at least 1), so that one pass alone uses every thread
(a lone request is as fast as with one slot), and two passes running on a 2-thread budget use
one each instead of four threads on two cores. With ``n = 1`` the count is never touched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from heedrank.reranker.doccache import ContextBuffer

logger = logging.getLogger(__name__)

__all__ = ["PassSlots"]


class PassSlots:
    """At most ``n`` query passes at once, each holding one :class:`ContextBuffer`.

    Args:
        n: Passes that may run at once (``>= 1``); the service's rerank workers.
        threads: torch intra-op threads shared by the running passes; ``None``: the calling
            thread's :func:`torch.get_num_threads` at the first slot (the service sets it at
            start-up, ``HEEDRANK_TORCH_THREADS``).

    Raises:
        ValueError: ``n < 1`` or ``threads < 1``.
    """

    def __init__(self, n: int, threads: int | None = None) -> None:
        if n < 1 or (threads is not None and threads < 1):
            raise ValueError(f"passes must be >= 1 and threads >= 1, got {n}, {threads}")
        self.n = n
        self.threads = threads
        self._sem = threading.BoundedSemaphore(n)
        self._guard = threading.Lock()
        self._free: list[ContextBuffer] = []
        self._running = 0

    @property
    def running(self) -> int:
        """Passes in a slot now."""
        with self._guard:
            return self._running

    @property
    def idle_buffers(self) -> list[ContextBuffer]:
        """The buffers of the slots not in use (the next passes reuse them, last left first)."""
        with self._guard:
            return list(self._free)

    @property
    def nbytes(self) -> int:
        """Bytes held by the idle slots' buffers."""
        with self._guard:
            return sum(b.nbytes for b in self._free)

    @contextmanager
    def slot(self) -> Iterator[ContextBuffer]:
        """Wait for a free slot; yields its buffer (the context assembled into it is valid until
        the slot is left) with the calling thread's torch threads set to its share."""
        self._sem.acquire()
        try:
            with self._guard:
                buffer = self._free.pop() if self._free else ContextBuffer()
                self._running += 1
                running = self._running
            if self.n > 1:
                self._share_threads(running)
            try:
                yield buffer
            finally:
                with self._guard:
                    self._running -= 1
                    self._free.append(buffer)
        finally:
            self._sem.release()

    def _share_threads(self, running: int) -> None:
        import torch

        if self.threads is None:
            self.threads = torch.get_num_threads()
        share = max(1, self.threads // running)
        if torch.get_num_threads() != share:
            torch.set_num_threads(share)
