"""``heedrank serve``: the REST API over one index (and optional named collections)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from heedrank.cli.options import DeviceOpt, MaxDocTokensOpt, ModelOpt, OptsOpt, reranker_config

EXAMPLES = """\
Examples:

  heedrank serve --index indexes/nfcorpus
  heedrank serve --index indexes/nfcorpus --rerank-method icr --opt heads=qr
  heedrank serve --index ix --collection trials=indexes/trials --host 0.0.0.0 --port 8080
  HEEDRANK_API_KEY=secret heedrank serve --index ix --device cuda
"""


def serve(
    index: Annotated[Path, typer.Option("--index", help="Index directory.")],
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8000,
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
    rerank_method: Annotated[str, typer.Option("--rerank-method", help="Reranker loaded at start-up: default "
                                               "(blockrank-cached, the best measured), icr, blockrank.")] = "default",
    collection: Annotated[
        Optional[list[str]], typer.Option("--collection", help="More collections as NAME=INDEX_DIR (repeatable).")
    ] = None,
    opts: OptsOpt = None,
) -> None:
    """Serve the REST API (uvicorn) over one index (the default collection) and optional
    named collections. Other settings (API key, workers, queue size, limits) come from
    HEEDRANK_* environment variables (see heedrank.settings.Settings)."""
    import uvicorn

    from heedrank.api.app import create_app
    from heedrank.settings import Settings

    collections: dict[str, str] = {}
    for item in collection or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise typer.BadParameter(f"expected NAME=INDEX_DIR, got {item!r}", param_hint="--collection")
        collections[name] = path
    extra: dict[str, Any] = {"collections": collections} if collections else {}
    settings = Settings(
        index=str(index), model=model, max_doc_tokens=max_doc_tokens, device=device, rerank_method=rerank_method,
        rerank_options=reranker_config(rerank_method, model, max_doc_tokens, device, opts).given_options, **extra,
    )
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info")
