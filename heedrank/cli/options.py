"""The options several commands share, declared once: ``Annotated`` aliases (a command
writes ``model: ModelOpt = None``), the reranker configuration they add up to
(:func:`reranker_config`), and the engine flags (:func:`engine_flags`: five flags, one
:class:`~heedrank.engine.Engine` handed to the command).

Importing this module is light (typer, the core package and one read of the packaged weights
card, whose values the help shows), so ``heedrank --help`` stays instant.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer

from heedrank import registry
from heedrank.config import DEFAULT_LM, DEFAULT_MAX_DOC_TOKENS, RerankerConfig
from heedrank.engine import Engine

F = TypeVar("F", bound=Callable[..., Any])

# ---------------------------------------------------------------------------- the reranker
def _packaged_first() -> list[str]:
    """The packaged LMs, the default first (the help names them)."""
    return [DEFAULT_LM] + [m for m in registry.packaged_models() if m != DEFAULT_LM]


ModelOpt = Annotated[
    Optional[str],
    typer.Option("--model", help=f"Reranker LM: a packaged name ({', '.join(_packaged_first())}) or a local HF "
                                  f"causal-LM directory; default: {DEFAULT_LM}."),
]
MaxDocTokensOpt = Annotated[
    Optional[int], typer.Option("--max-doc-tokens", help="Per-document budget in LM tokens (truncation is reported); "
                                f"default: the method's ({registry.default_max_doc_tokens('blockrank-cached')} for the "
                                f"default method, blockrank-cached, its weights card's; else {DEFAULT_MAX_DOC_TOKENS}).")
]
DeviceOpt = Annotated[str, typer.Option("--device", help="torch device: cpu, cuda, cuda:N.")]
OptsOpt = Annotated[
    Optional[list[str]],
    typer.Option("--opt", help="Reranker option KEY=VALUE (VALUE parsed as JSON when it can be), repeatable: "
                 "--opt layer=22 --opt heads=qr --opt 'reattn={\"idf\": true}'."),
]

# ---------------------------------------------------------------------------- evaluation
RerankOpt = Annotated[str, typer.Option("--rerank", help="Reranker name or 'none'.")]
CandidatesOpt = Annotated[int, typer.Option("--candidates", help="First-stage hits reranked.")]
MaxQueriesOpt = Annotated[Optional[int], typer.Option("--max-queries", help="Seeded subset of this many queries.")]
SeedOpt = Annotated[int, typer.Option("--seed")]
ReportDirOpt = Annotated[Path, typer.Option("--out", help="Folder for the run file and JSON report.")]
DumpOpt = Annotated[Optional[Path], typer.Option("--dump", help="Also save an ICR attention dump (for heads/ablation).")]


def default_fusion_help() -> str:
    """What ``--fusion default`` means, for the help: the default method's weights card's
    ``fusion.alpha`` with the value read from the packaged card now
    (:func:`heedrank.registry.recorded_fusion`; a JSON read, no model), none for icr/blockrank."""
    alpha = registry.recorded_fusion(RerankerConfig())
    if alpha is None:  # the packaged card's scorer serves the default
        return ("'default' (the method's own way: the default's scorer over attention, dense and rank, no "
                "fusion weight; a card's fusion.alpha for a learned card; none for icr/blockrank)")
    return (f"'default' (the method's recorded weight: the default method's weights card's fusion.alpha, {alpha:g} "
            "in the packaged card; none for icr/blockrank)")


FusionOpt = Annotated[str, typer.Option(
    "--fusion", help="Rank by ALPHA z(first stage) + (1 - ALPHA) z(reranker) (the served fused path, "
    f"/search rerank.fusion): a number in [0, 1], {default_fusion_help()} or 'none' (the reranker's order).")]
"""``--fusion`` of the evaluators; its value becomes a weight with :func:`fusion_value`."""
BatchFusionOpt = Annotated[str, typer.Option(
    "--fusion", help="Rank by ALPHA z(first stage) + (1 - ALPHA) z(reranker) (z of the run's scores): a number, "
    f"{default_fusion_help()} or 'none'.")
]
"""``--fusion`` of ``rerank-batch``: :data:`FusionOpt` with that command's own help."""

# ---------------------------------------------------------------------------- the engine
QUERIES_ENGINE_HELP = ("Where the queries run: local (this process) or ray (a Ray actor pool; "
                       "needs pip install -e '.\\[ray]' in the heedrank checkout). Same output either way.")
BLOCKS_ENGINE_HELP = ("Where the blocks are encoded: local (this process) or ray (a Ray actor pool; the index must "
                      "be on a filesystem every node sees at the same path). Same store either way.")
VECTORS_ENGINE_HELP = ("Where the dense vectors are encoded: local (this process, as the build reads) or ray (a Ray "
                       "actor pool, each actor loading the embedder once; the output folder must be on a filesystem "
                       "every node sees at the same path). Same index either way.")
RayAddressOpt = Annotated[
    Optional[str], typer.Option("--ray-address", help="With --engine ray: the cluster to join (auto, HEAD:6379, "
                                "ray://HEAD:10001); default $RAY_ADDRESS, else a local Ray started for the run.")
]
ActorsOpt = Annotated[
    Optional[int], typer.Option("--actors", help="With --engine ray: reranker actors (each loads the LM once); default 1.")
]
ActorCpusOpt = Annotated[
    Optional[float], typer.Option("--actor-cpus", help="With --engine ray: CPUs per actor (its torch threads); default 1.")
]
ActorGpusOpt = Annotated[
    Optional[float], typer.Option("--actor-gpus", help="With --engine ray: GPUs per actor (with --device cuda); default 0.")
]


def engine_from_flags(engine: str = "local", ray_address: str | None = None, actors: int | None = None,
                      actor_cpus: float | None = None, actor_gpus: float | None = None) -> Engine:
    """The :class:`~heedrank.engine.Engine` of the engine flags: one
    :class:`~heedrank.engine.EngineOptions`, built here once (:func:`heedrank.engine.make_engine`).

    Raises:
        ValidationError: an unknown engine, Ray flags without ``--engine ray``, or a Ray
            flag out of range.
        MissingDependencyError: ``--engine ray`` without Ray installed.
    """
    from heedrank.engine import EngineOptions, check_engine_name, make_engine
    from heedrank.errors import ValidationError

    name = check_engine_name(engine)
    given = [flag for flag, value in (("--ray-address", ray_address), ("--actors", actors),
                                      ("--actor-cpus", actor_cpus), ("--actor-gpus", actor_gpus)) if value is not None]
    if name == "local" and given:
        raise ValidationError(f"{', '.join(given)} only apply with --engine ray")
    options = EngineOptions(engine=name, address=ray_address, actors=1 if actors is None else actors,
                            num_cpus=1.0 if actor_cpus is None else actor_cpus,
                            num_gpus=0.0 if actor_gpus is None else actor_gpus)
    return make_engine(options)


def engine_flags(engine_help: str) -> Callable[[F], F]:
    """Decorate a command whose ``engine: Engine`` parameter should come from the engine
    flags: in the command's signature (and so its ``--help``) that parameter becomes
    ``--engine`` (help ``engine_help``), ``--ray-address``, ``--actors``, ``--actor-cpus``
    and ``--actor-gpus``, at its place, and the command receives the engine they describe
    (:func:`engine_from_flags`), built before its body runs."""

    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        if "engine" not in signature.parameters:
            raise TypeError(f"{command.__name__} has no engine parameter to put the engine flags in")
        kind = signature.parameters["engine"].kind
        flags = [
            inspect.Parameter("engine", kind, default="local",
                              annotation=Annotated[str, typer.Option("--engine", help=engine_help)]),
            inspect.Parameter("ray_address", kind, default=None, annotation=RayAddressOpt),
            inspect.Parameter("actors", kind, default=None, annotation=ActorsOpt),
            inspect.Parameter("actor_cpus", kind, default=None, annotation=ActorCpusOpt),
            inspect.Parameter("actor_gpus", kind, default=None, annotation=ActorGpusOpt),
        ]
        params = [q for p in signature.parameters.values() for q in (flags if p.name == "engine" else [p])]

        @functools.wraps(command)
        def with_engine(*args: Any, **kwargs: Any) -> Any:
            given = {flag.name: kwargs.pop(flag.name, flag.default) for flag in flags}
            return command(*args, engine=engine_from_flags(**given), **kwargs)

        with_engine.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        with_engine.__annotations__ = {p.name: p.annotation for p in params}
        return with_engine  # type: ignore[return-value]

    return decorate


# ---------------------------------------------------------------------------- helpers
def parse_opts(opts: list[str] | None) -> dict[str, Any]:
    """``--opt KEY=VALUE`` items as a dict, each VALUE parsed as JSON when it can be.

    Raises:
        typer.BadParameter: an item without ``=`` or without a key.
    """
    out = {}
    for item in opts or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--opt takes KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def reranker_config(
    method: str, model: str | None, max_doc_tokens: int | None, device: str, opts: list[str] | None = None
) -> RerankerConfig:
    """The :class:`~heedrank.config.RerankerConfig` of a command: ``--opt`` typed once, here, before any model loads.

    Raises:
        ValidationError: an unknown option of ``method`` (the message names the valid
            ones), a bad value, or options with ``--rerank none``.
    """
    options = parse_opts(opts)
    if method == "none" and options:
        from heedrank.errors import ValidationError

        raise ValidationError(f"reranker options {sorted(options)} need a reranking method; pick one with --rerank")
    return RerankerConfig(method=method, model=model, max_doc_tokens=max_doc_tokens, device=device, options=options)


def eval_reranker_config(
    rerank: str, model: str | None, max_doc_tokens: int | None, device: str, opts: list[str] | None, dump: Path | None
) -> RerankerConfig:
    """Reranker config of an eval command; ``--dump`` makes ICR keep its attention.

    Raises:
        ValidationError: bad ``--opt`` (see :func:`reranker_config`), or ``--dump`` with a
            reranker other than ICR.
    """
    if dump and rerank != "icr":
        from heedrank.errors import ValidationError

        raise ValidationError(f"--dump saves ICR attention; it needs --rerank icr, not {rerank!r}")
    return reranker_config(rerank, model, max_doc_tokens, device, (opts or []) + (["keep_attention=true"] if dump else []))


def fusion_value(value: str, config: RerankerConfig | None) -> float | None:
    """``--fusion``'s value: a number, ``None`` for ``none``, or for ``default`` the weight the
    method records (:func:`heedrank.registry.recorded_fusion`; read without loading a model).

    Raises:
        ValidationError: anything else, or a number outside [0, 1].
    """
    from heedrank.fusion import resolve_weight
    from heedrank.registry import recorded_fusion

    recorded = recorded_fusion(config) if config is not None and value.strip().lower() == "default" else None
    return resolve_weight(value, recorded, name="--fusion")
