"""Where the reranker's data files live and what they are named by: the package's data folder
(``reranker/data``: head sets, weights cards, query adapters) and the user card folder, where
the recipes install the files of a model that ships none; :func:`model_card_name` is the name a
model's files are filed under. One module both :mod:`heedrank.reranker.heads` and
:mod:`heedrank.reranker.cached.card` read, so neither imports the other."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The package's data folder."""

CARD_DIR_ENV = "HEEDRANK_CARD_DIR"
"""Environment variable naming the user card folder (default ``$HEEDRANK_CACHE_DIR/cards``)."""


def packaged_data_dir() -> Path:
    """Folder of the data shipped with the reranker (head sets, weights cards)."""
    return DATA_DIR


def user_card_dir() -> Path:
    """The user card folder: ``$HEEDRANK_CARD_DIR``, else ``<cache>/cards``
    (:func:`heedrank.files.cache_dir`: ``$HEEDRANK_CACHE_DIR`` or ``~/.cache/heedrank``). Cards
    and query adapters of models that ship none are installed here (``recipes/default``
    ``install``), never into the package. Not created here."""
    from heedrank.files import cache_dir

    env = os.environ.get(CARD_DIR_ENV)
    return Path(env).expanduser() if env else cache_dir() / "cards"


def model_card_name(identity: Mapping[str, Any] | str) -> str:
    """The name a model's card and adapter are filed under: a packaged LM's name
    (``smollm2-135m-instruct``); for a local directory (``identity["source"] == "directory"``)
    its folder name lower-cased to ``[a-z0-9._-]`` plus the first 12 hex digits of its sha256
    (``my-model-0123456789ab``), so that two folders of the same name do not share one.

    Args:
        identity: :func:`heedrank.reranker.lm.model_identity` of the model, or a bare name.
    """
    if isinstance(identity, str):
        return identity
    name = str(identity.get("name") or "model")
    if identity.get("source") != "directory":
        return name
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "model"
    sha = str(identity.get("sha256") or "")
    return f"{slug}-{sha[:12]}" if sha else slug
