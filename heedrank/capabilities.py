"""What a reranker (or its class) declares beyond :class:`heedrank.protocols.Reranker`, for the
callers that read it (``GET /info``, ``/search``'s per-request budget): declared here, checked
with ``isinstance``, never probed with ``getattr``.

The declarations are what the built-in rerankers already have: :class:`LimitedReranker` is
what :class:`heedrank.reranker.base.AttentionReranker` holds (its ``config``, ``loaded_lm`` and
``limits()``), :class:`StoredBlocksDeclared` the class attribute ``cached`` of BlockRank
(:class:`heedrank.reranker.blockrank.BlockRankReranker`, ``False``) and cached BlockRank
(:class:`heedrank.reranker.cached.CachedBlockRankReranker`, ``True``), :class:`PrefetchesBlocks`
cached BlockRank's ``prefetch_blocks``. A plug-in without them
is served without what they give (no ``/info`` limits; its stopped rerankings teach the
per-request cost model, :class:`heedrank.api.costs.MethodCosts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from heedrank.config import RerankerConfig
    from heedrank.types import Document

__all__ = ["LimitedReranker", "PrefetchesBlocks", "StoredBlocksDeclared", "reads_stored_blocks"]


@runtime_checkable
class LimitedReranker(Protocol):
    """A reranker around a language model that states what the model holds (``GET /info``'s
    per-method limits, :func:`heedrank.api.routes.info.method_limits`).

    Attributes:
        config: Its configuration; another method is built around the same LM from it
            (``method`` and ``options`` replaced).
    """

    config: RerankerConfig

    @property
    def loaded_lm(self) -> Any:
        """The LM if it is loaded, else ``None``; reading it never loads the LM."""
        ...

    def limits(self) -> Mapping[str, Any]:
        """What the loaded LM holds for this method: ``context`` and ``max_query_tokens`` in LM
        tokens, ``max_doc_tokens``, ``max_candidates`` (``None``: no bound from the model),
        and the method's own.

        Raises:
            HeedrankError: the LM cannot give them (e.g. not loaded and not loadable).
        """
        ...


@runtime_checkable
class StoredBlocksDeclared(Protocol):
    """A reranker class (or instance) that declares, at class level, whether its candidate
    blocks come from a document KV store (``cached``): such a method may spend a request's
    time encoding cold blocks, so a reranking stopped by the per-request budget bounds only its
    cold cost per candidate (:meth:`heedrank.api.costs.MethodCosts.stopped`), and its jobs fit
    themselves to their deadline (:func:`heedrank.api.costs.fits_its_deadline`).

    Check a class with ``isinstance(cls, StoredBlocksDeclared)`` (a protocol with a data
    member: ``issubclass`` refuses it), or use :func:`reads_stored_blocks`.
    """

    cached: ClassVar[bool]


def reads_stored_blocks(reranker: Any) -> bool:
    """Whether ``reranker`` (a reranker class, e.g. :func:`heedrank.registry.reranker_class`'s
    answer, or an instance) reads its candidate blocks from a document KV store: its declared
    ``cached`` (:class:`StoredBlocksDeclared`); ``False`` for one that declares nothing."""
    return isinstance(reranker, StoredBlocksDeclared) and bool(reranker.cached)


@runtime_checkable
class PrefetchesBlocks(Protocol):
    """A reranker that can make candidates' blocks warm ahead of its query pass (cached BlockRank:
    :meth:`heedrank.reranker.cached.CachedBlockRankReranker.prefetch_blocks`), so that a reranking
    under a deadline encodes cold blocks a chunk at a time and stops when the time left would not
    cover the next chunk and the pass (:meth:`heedrank.pipeline.RerankerCache.rerank`)."""

    def prefetch_blocks(self, candidates: Sequence[Document], block_store: Any = None) -> int:
        """Encode (or read) the candidates' blocks into the store or the RAM tier; returns the blocks encoded now."""
        ...

