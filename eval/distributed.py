"""The names of the Ray engine as they were before it moved to :mod:`heedrank.engine.ray`.

The engine runs the index build as well as the evaluation, so it lives in the core package
now (:mod:`heedrank.engine`: the :class:`~heedrank.engine.Engine` seam, :class:`LocalEngine`,
:class:`~heedrank.engine.EngineOptions`; :mod:`heedrank.engine.ray`: the Ray engine). This
module keeps the old import paths working:

* :class:`RayEngine` is the engine plus :meth:`RayEngine.run_batch`, the
  ``rerank_batch(runner=...)`` form (``rerank_batch(engine=...)`` does the same).
* :func:`build_index_blocks_ray` is :func:`heedrank.index.kv.build_index_blocks` with a
  Ray engine.
* ``kv_shards`` and ``build_kv_shard`` are :func:`heedrank.engine.ray.split_parts` and
  :func:`heedrank.index.kv.build_part`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from heedrank.engine import ENGINES, EngineOptions
from heedrank.engine.ray import (
    RAY_EXTRA,
    RayExecutionError,
    RayOptions,
    RunStats,
    ray_session,
    require_ray,
    split_parts,
)
from heedrank.engine.ray import RayEngine as _RayEngine
from heedrank.index.kv import build_part

if TYPE_CHECKING:
    from collections.abc import Sequence

    from heedrank.config import RerankerConfig
    from heedrank.eval.batch import BatchSummary, Progress
    from heedrank.index.kv import BuildReport, KVStore
    from heedrank.pipeline import Pipeline, SearchOptions
    from heedrank.types import Query

kv_shards = split_parts
build_kv_shard = build_part


class RayEngine(_RayEngine):
    """:class:`heedrank.engine.ray.RayEngine`, with :meth:`run_batch` for callers of
    ``rerank_batch(..., runner=RayEngine(...).run_batch)``."""

    def run_batch(self, pipeline: Pipeline, options: SearchOptions, todo: Sequence[Query], progress: Progress,
                  tag: str, summary: BatchSummary, show_progress: bool) -> None:
        """The :data:`heedrank.eval.batch.BatchRunner` of this engine
        (:func:`heedrank.eval.batch.run_on_engine`): reranks ``todo`` on the actor pool and
        commits each query in ``todo`` order."""
        from heedrank.eval.batch import run_on_engine

        run_on_engine(self, pipeline, options, todo, progress, tag, summary, show_progress)


def build_index_blocks_ray(
    index: Any,
    encoder: Any,
    config: RerankerConfig,
    options: EngineOptions | None = None,
    *,
    batch_size: int = 32,
    part_batches: int = 4,
    show_progress: bool = False,
    verify_existing: bool = False,
    prune: bool = False,
) -> tuple[KVStore, BuildReport]:
    """:func:`heedrank.index.kv.build_index_blocks` with the LM work spread over a Ray
    actor pool (:meth:`heedrank.engine.ray.RayEngine.build_blocks`, ``part_batches`` batches
    per part). Same store, same keys, same blocks.

    Raises:
        See :func:`~heedrank.index.kv.build_index_blocks` and
        :meth:`~heedrank.engine.ray.RayEngine.build_blocks`; MissingDependencyError: Ray is
        not installed.
    """
    from heedrank.index.kv import build_index_blocks

    engine = _RayEngine(options or RayOptions(), part_batches=part_batches)
    return build_index_blocks(index, encoder, engine=engine, config=config, batch_size=batch_size,
                              show_progress=show_progress, verify_existing=verify_existing, prune=prune)


__all__ = [
    "ENGINES",
    "RAY_EXTRA",
    "RayEngine",
    "RayExecutionError",
    "RayOptions",
    "RunStats",
    "build_index_blocks_ray",
    "build_kv_shard",
    "kv_shards",
    "ray_session",
    "require_ray",
]
