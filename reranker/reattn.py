"""ReAttn: post-hoc re-weighting of token-level attention for reranking.

Source: Tian, Mo, Zhang, Qi, Nie, "ReAttn: Improving Attention-based Re-ranking via
Attention Re-weighting", Findings of EACL 2026 (arXiv 2602.19969), Section 3. No official
code; the formulas are docs/design/algorithms.md section 4 (**our choice**, every constant an option):

1. Cross-document IDF on query-overlapping tokens: a document token overlaps the query
   when its normalised surface form (lower-cased word piece, prefix marks stripped) also
   occurs in the query. ``df(t)`` = number of candidates containing ``t``;
   ``w(t) = log((N + 1) / (df(t) + 0.5))``, normalised so the mean weight over overlapping
   token occurrences is 1; other tokens keep weight 1. ``B_j = w(t_j) b_j``.
2. Entropy regularisation: ``p_ij = B_ij / sum_j B_ij``,
   ``E_i = -sum_j p_ij log p_ij / log(n_i)`` in [0, 1], ``W_i = E_i ** gamma``.
3. ``s_i = W_i * sum_j B_ij``.

Input ``b_j >= 0``: calibrated attention with negative values clipped to 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from heedrank.errors import ValidationError

_PREFIX_MARKS = ("Ġ", "▁", "##", "Ċ")


@dataclass(frozen=True)
class ReAttnConfig:
    """Switches of ReAttn. ``gamma``: exponent of the normalised entropy (0 = no effect)."""

    idf: bool = True
    entropy: bool = True
    gamma: float = 0.5

    @classmethod
    def parse(cls, value: Any) -> ReAttnConfig | None:
        """From ``None``/``False`` (off), ``True`` (both on), or a mapping of the fields.

        Raises:
            ValidationError: unknown keys or bad values.
        """
        if value in (None, False):
            return None
        if value is True:
            return cls()
        if isinstance(value, ReAttnConfig):
            return value
        if not isinstance(value, Mapping):
            raise ValidationError(f"reattn must be a bool or {{idf, entropy, gamma}}, got {value!r}")
        unknown = set(value) - {"idf", "entropy", "gamma"}
        if unknown:
            raise ValidationError(f"unknown reattn keys {sorted(unknown)}; use idf, entropy, gamma")
        cfg = cls(bool(value.get("idf", True)), bool(value.get("entropy", True)), float(value.get("gamma", 0.5)))
        if cfg.gamma < 0:
            raise ValidationError("reattn.gamma must be >= 0")
        return None if not (cfg.idf or cfg.entropy) else cfg


def surface_form(token: str) -> str:
    """Lower-cased word piece with tokenizer prefix marks and surrounding punctuation stripped."""
    for mark in _PREFIX_MARKS:
        token = token.replace(mark, "")
    return token.strip().strip(".,;:!?()[]{}\"'").lower()


def idf_weights(doc_forms: Sequence[Sequence[str]], query_forms: set[str]) -> list[list[float]]:
    """Per-token weights ``w(t_j)`` (1.0 for tokens that do not overlap the query).

    Args:
        doc_forms: Surface form of every token of each of the ``N`` candidates.
        query_forms: Surface forms of the query's tokens (empty strings ignored).

    Returns:
        One list of weights per candidate, aligned with its tokens.
    """
    n = len(doc_forms)
    q = {f for f in query_forms if f}
    df: dict[str, int] = {}
    for forms in doc_forms:
        for f in set(forms) & q:
            df[f] = df.get(f, 0) + 1
    raw = {f: math.log((n + 1) / (c + 0.5)) for f, c in df.items()}
    occurrences = [raw[f] for forms in doc_forms for f in forms if f in raw]
    mean = sum(occurrences) / len(occurrences) if occurrences else 1.0
    scale = 1.0 / mean if mean > 0 else 1.0
    return [[raw[f] * scale if f in raw else 1.0 for f in forms] for forms in doc_forms]


def normalised_entropy(mass: Sequence[float]) -> float:
    """``-sum p log p / log(n)`` of a non-negative vector (1.0 for n <= 1 or zero mass)."""
    n = len(mass)
    total = float(sum(mass))
    if n <= 1 or total <= 0:
        return 1.0
    h = -sum((m / total) * math.log(m / total) for m in mass if m > 0)
    return h / math.log(n)


def reattn_scores(
    token_mass: Sequence[Sequence[float]],
    doc_forms: Sequence[Sequence[str]],
    query_forms: set[str],
    config: ReAttnConfig,
) -> list[float]:
    """ReAttn document scores.

    Args:
        token_mass: ``b_j >= 0`` per token of each candidate (negative values are clipped).
        doc_forms: Surface form per token of each candidate (same shapes).
        query_forms: Surface forms of the query tokens.
        config: Which parts are on.

    Returns:
        One score per candidate: ``W_i * sum_j B_ij`` (unitless attention mass; higher = more relevant).
    """
    mass = [[max(0.0, float(b)) for b in doc] for doc in token_mass]
    if config.idf:
        weights = idf_weights(doc_forms, query_forms)
        mass = [[b * w for b, w in zip(doc, ws)] for doc, ws in zip(mass, weights)]
    scores = []
    for doc in mass:
        total = sum(doc)
        w = normalised_entropy(doc) ** config.gamma if config.entropy else 1.0
        scores.append(w * total)
    return scores


def token_forms(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Surface forms of token ids."""
    return [surface_form(t) for t in tokenizer.convert_ids_to_tokens(list(ids))]
