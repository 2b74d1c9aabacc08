"""Query-focused retrieval heads: per-head document scores, head detection, head sets.

Sources: Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context
Factuality"; Zhang et al. 2025, "Query-Focused Retrieval Heads Improve Long-Context
Reasoning and Re-ranking" (QRHead), Section 3 (repo princeton-pli/QRHead); QRRanker (Li et
al. 2026, arXiv 2602.12192) for trained head scoring. Specified in docs/design/algorithms.md section 2.

- Per-head document score (detection): ``s_h(d) = sum_{j in d, kept by the mask of c_h} c_h,j``
  where ``c_h,j`` is head ``h``'s calibrated query-span attention to token ``j`` and the mask
  drops tokens at or below ``mean - 2 std`` of that head's scores within the document.
- QRScore_h = mean over queries of ``sum_{d in gold} s_h(d)``; or per-head nDCG@10.
- Head sets are JSON files (:class:`HeadSet`); the set detected for the packaged default LM
  ships in ``reranker/data/``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from heedrank.errors import NotFoundError, ValidationError
from heedrank.reranker.cards import DATA_DIR, model_card_name, user_card_dir

HEADSET_FORMAT = 1


def per_head_document_scores(calibrated, spans: Sequence[tuple[int, int]], n_std: float | None = 2.0):
    """Per-(layer, head) masked document scores.

    Args:
        calibrated: float tensor ``(L, H, T)`` of calibrated token attention ``c[l,h,j]``.
        spans: ``[start, end)`` token ranges of the ``N`` documents.
        n_std: Per-document, per-head mask threshold in standard deviations (None = no mask).

    Returns:
        float32 tensor ``(L, H, N)``: ``s_h(d)`` (unitless; higher = more attention).
    """
    import torch

    L, H, _ = calibrated.shape
    out = torch.zeros(L, H, len(spans), dtype=torch.float32)
    for i, (s, e) in enumerate(spans):
        c = calibrated[:, :, s:e].float()
        if c.shape[-1] == 0:
            continue
        if n_std is not None and c.shape[-1] > 1:
            std = c.std(dim=-1, keepdim=True)
            keep = (c > c.mean(dim=-1, keepdim=True) - n_std * std) | (std == 0)
            c = c * keep
        out[:, :, i] = c.sum(-1)
    return out


def qrscore(per_head, gold: Sequence[bool]):
    """``sum_{d in gold} s_h(d)`` for one query: ``(L, H)`` from ``(L, H, N)`` scores."""
    import torch

    mask = torch.tensor(gold, dtype=per_head.dtype)
    return (per_head * mask).sum(-1)


def ndcg_at_k(per_head, gains: Sequence[float], k: int = 10):
    """nDCG@k of ranking the ``N`` documents by each head's scores: ``(L, H)``.

    Args:
        per_head: ``(L, H, N)`` scores.
        gains: Relevance grade of each document (0 = not relevant).
    """
    import torch

    g = torch.tensor(gains, dtype=torch.float32)
    order = torch.argsort(per_head, dim=-1, descending=True)[..., :k]
    disc = 1.0 / torch.log2(torch.arange(2, order.shape[-1] + 2, dtype=torch.float32))
    dcg = ((2 ** g[order] - 1) * disc).sum(-1)
    ideal = torch.sort(g, descending=True).values[:k]
    idcg = float(((2 ** ideal - 1) * disc[: ideal.shape[0]]).sum())
    return dcg / idcg if idcg > 0 else torch.zeros_like(dcg)


@dataclass(frozen=True)
class HeadSet:
    """A selected set of query-focused heads for one model, with how it was found.

    Attributes:
        model: Model identity (name, sha256) the heads were detected on.
        heads: Selected ``(layer, head)`` pairs, best first.
        method: ``"qrscore"`` or ``"ndcg"``.
        scores: Every head's detection score, ``scores[layer][head]``.
        detection: Dataset, split, number of queries and candidates, seed.
        weights: Optional learned weights ``weights[layer][head]`` over per-head scores
            (``--heads learned``), with ``weights_info`` describing the fit.
    """

    model: Mapping[str, Any]
    heads: tuple[tuple[int, int], ...]
    method: str
    scores: tuple[tuple[float, ...], ...]
    detection: Mapping[str, Any] = field(default_factory=dict)
    weights: tuple[tuple[float, ...], ...] | None = None
    weights_info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def deepest_layer(self) -> int:
        return max(l for l, _ in self.heads)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["format"] = HEADSET_FORMAT
        d["heads"] = [list(h) for h in self.heads]
        return d

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> HeadSet:
        """Raises NotFoundError (missing) or ValidationError (malformed)."""
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise NotFoundError(f"head set {path} does not exist; create one with `heedrank lab heads detect`") from None
        except ValueError as exc:
            raise ValidationError(f"head set {path} is not valid JSON: {exc}") from exc
        try:
            return cls(
                model=d["model"],
                heads=tuple((int(l), int(h)) for l, h in d["heads"]),
                method=d["method"],
                scores=tuple(tuple(float(x) for x in row) for row in d["scores"]),
                detection=d.get("detection", {}),
                weights=None if d.get("weights") is None else tuple(tuple(float(x) for x in r) for r in d["weights"]),
                weights_info=d.get("weights_info", {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValidationError(f"head set {path} is malformed ({exc}); re-run `heedrank lab heads detect`") from exc


def select_heads(scores, k: int) -> list[tuple[int, int]]:
    """The ``k`` best ``(layer, head)`` pairs of an ``(L, H)`` score table (ties: lower layer, head)."""
    L, H = len(scores), len(scores[0])
    flat = [(float(scores[l][h]), l, h) for l in range(L) for h in range(H) if not math.isnan(float(scores[l][h]))]
    flat.sort(key=lambda x: (-x[0], x[1], x[2]))
    return [(l, h) for _, l, h in flat[:k]]


def packaged_headset_path(model_name: str) -> Path:
    return DATA_DIR / f"{model_name}.heads.json"


def resolve_heads(spec: Any, identity: Mapping[str, Any]) -> tuple[list[tuple[int, int]] | None, Any]:
    """Resolve a ``heads`` option to ``(heads, weights)``.

    Args:
        spec: ``None``/``"all"`` (every head), ``"qr"`` (the head set of this model: packaged,
            else installed in the user card folder by recipes/heads), ``"learned"`` (the packaged set's learned weights), a path to a head-set
            JSON, or a list of ``[layer, head]`` pairs.
        identity: The loaded model's identity (``name``, ``sha256``).

    Returns:
        ``(None, None)`` for all heads; ``(heads, None)`` for a selection; ``(heads, W)``
        with ``W`` an ``(L, H)`` nested tuple of weights for ``"learned"`` (heads = those
        with non-zero weight).

    Raises:
        NotFoundError: no packaged head set for this model.
        ValidationError: a malformed spec, or a head set detected on another model.
    """
    if spec is None or spec == "all":
        return None, None
    if isinstance(spec, (list, tuple)):
        try:
            return sorted({(int(l), int(h)) for l, h in spec}), None
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"heads must be 'all', 'qr', 'learned', a path or [[layer, head], ...]: {exc}") from exc
    if not isinstance(spec, str):
        raise ValidationError(f"heads must be 'all', 'qr', 'learned', a path or [[layer, head], ...], got {spec!r}")
    if spec in ("qr", "learned"):
        name = model_card_name(identity)  # the packaged name, or a local folder's name + hash
        path = packaged_headset_path(name)
        if not path.exists():  # one installed by recipes/heads for a model that ships none
            path = user_card_dir() / path.name
        if not path.exists():
            raise NotFoundError(
                f"no packaged head set for model {identity.get('name')!r}; detect one with "
                "`heedrank lab heads detect ... --out heads.json` and pass heads=PATH"
            )
    else:
        path = Path(spec)
    hs = HeadSet.load(path)
    if hs.model.get("sha256") and identity.get("sha256") and hs.model["sha256"] != identity["sha256"]:
        raise ValidationError(
            f"head set {path} was detected on model {hs.model.get('name')!r} ({hs.model['sha256'][:12]}), "
            f"not on the loaded {identity.get('name')!r} ({identity['sha256'][:12]}); detect heads for this model"
        )
    if spec == "learned":
        if hs.weights is None:
            raise NotFoundError(f"head set {path} has no learned weights; fit them with `heedrank lab heads fit`")
        heads = [(l, h) for l, row in enumerate(hs.weights) for h, w in enumerate(row) if w != 0.0]
        return heads, hs.weights
    return sorted(hs.heads), None
