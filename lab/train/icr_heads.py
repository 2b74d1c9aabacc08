"""Query-focused heads of ICR, the training side: detecting the heads and fitting per-head
weights from attention dumps (:func:`heedrank.lab.head_study.dump_attention`; docs/design/algorithms.md
section 2).

:func:`detect_heads` scores every (layer, head) on a dump of a train split (QRScore, or the
nDCG@10 of the head alone) and keeps the ``top_k``; :func:`fit_head_weights` learns a weight
per head with the group contrastive loss (:func:`heedrank.lab.train.losses.group_contrastive_loss`), early-stopped on
held-out queries. Both write :class:`heedrank.reranker.heads.HeadSet` files that ICR serves
(``heads=qr`` / ``heads=learned``).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heedrank.errors import ValidationError
from heedrank.eval.report import load_dump
from heedrank.lab.train.losses import group_contrastive_loss

if TYPE_CHECKING:
    from heedrank.reranker.heads import HeadSet


def detect_heads(dump_dir: str | Path, *, method: str = "qrscore", top_k: int = 16, mask_std: float | None = 2.0
                 ) -> HeadSet:
    """Detect query-focused heads from a dump (docs/design/algorithms.md section 2): each head's score
    (``method="qrscore"``: QRScore of its per-document scores against the relevant set;
    ``"ndcg"``: nDCG@10 of the head alone) averaged over the queries with a relevant candidate.

    Returns:
        :class:`heedrank.reranker.heads.HeadSet` with every head's score (``(L, H)`` nested
        tuples) and the ``top_k`` selected.

    Raises:
        ValidationError: an unknown ``method``, or a dump without queries.
    """

    from heedrank.reranker.heads import HeadSet, ndcg_at_k, per_head_document_scores, qrscore, select_heads

    if method not in ("qrscore", "ndcg"):
        raise ValidationError(f"method must be 'qrscore' or 'ndcg', got {method!r}")
    meta, items = load_dump(dump_dir)
    if not items:
        raise ValidationError(f"dump {dump_dir} holds no query")
    total: Any = None  # (L, H) float tensor, summed over the queries
    used = 0
    for it in items:
        if not any(g > 0 for g in it["labels"]):
            continue
        ph = per_head_document_scores(it["calibrated"].float(), it["spans"], mask_std)
        s = qrscore(ph, [g > 0 for g in it["labels"]]) if method == "qrscore" else ndcg_at_k(ph, it["labels"])
        total = s if total is None else total + s
        used += 1
    if total is None:
        raise ValidationError(f"dump {dump_dir} holds no query with a relevant document: no head can be scored")
    scores = (total / used).tolist()
    heads = select_heads(scores, top_k)
    return HeadSet(
        model=meta["reranker"]["model"], heads=tuple(heads), method=method,
        scores=tuple(tuple(round(x, 6) for x in row) for row in scores),
        detection={**{k: meta.get(k) for k in ("dataset", "split", "first_stage", "candidates", "seed", "shuffle")},
                   "queries": used, "top_k": top_k, "mask_std": mask_std},
    )


def fit_head_weights(
    dump_dir: str | Path, headset_path: str | Path, *, max_layer: int | None = None, epochs: int = 200,
    lr: float = 0.05, l2: float = 1e-3, holdout: float = 0.25, seed: int = 0, mask_std: float | None = 2.0,
    support: str = "qr", nonneg: bool = True,
) -> HeadSet:
    """Fit weights over per-head document scores with the group contrastive loss and save
    them into the head set (``weights``, ``weights_info``).

    ``support="qr"`` (default) re-weights the selected QR heads only (one weight each, the
    rest stay 0); ``support="all"`` gives every head in layers ``<= max_layer`` (default:
    the head set's deepest layer, so the forward pass can still stop early) a weight; with
    a few hundred heads and ~100 training queries that overfits (measured: NFCorpus test
    nDCG@10 23.3 against 32.1 for the plain QR-head sum). ``nonneg`` keeps weights >= 0 (a
    head votes for the documents it attends to, or abstains). A seeded ``holdout`` fraction
    of the dump's queries picks the epoch with the lowest held-out loss. Per-head scores are
    normalised by their mean magnitude; weights start from the QR-head sum and ``l2`` pulls
    them toward it.

    Raises:
        ValidationError: fewer than 4 usable queries, or an unknown ``support``.

    Returns:
        The updated :class:`heedrank.reranker.heads.HeadSet` (also saved to ``headset_path``).
    """
    import torch

    from heedrank.reranker.heads import HeadSet, per_head_document_scores

    if support not in ("qr", "all"):
        raise ValidationError(f"support must be 'qr' or 'all', got {support!r}")
    hs = HeadSet.load(headset_path)
    _, items = load_dump(dump_dir)
    max_layer = hs.deepest_layer if max_layer is None else max_layer
    data = []
    for it in items:
        gold = torch.tensor([g > 0 for g in it["labels"]])
        if gold.all() or not gold.any():
            continue
        ph = per_head_document_scores(it["calibrated"].float(), it["spans"], mask_std)[: max_layer + 1]
        data.append((ph, gold))
    if len(data) < 4:
        raise ValidationError("too few queries with both relevant and non-relevant candidates to fit weights")
    rng = random.Random(seed)
    idx = list(range(len(data)))
    rng.shuffle(idx)
    n_hold = max(1, int(len(idx) * holdout))
    hold, train = [data[i] for i in idx[:n_hold]], [data[i] for i in idx[n_hold:]]
    L, H = data[0][0].shape[:2]
    scale = torch.stack([ph.abs().mean(-1) for ph, _ in train]).mean(0) + 1e-9  # (L, H)
    init = torch.zeros(L, H)
    for l, h in hs.heads:
        if l <= max_layer:
            init[l, h] = 1.0
    # Per-head scores are normalised by their mean magnitude, so that the weights ``v`` are
    # on one scale (Adam steps of ``lr`` move every head alike); the saved weights are v / scale.
    train = [(ph / scale[..., None], g) for ph, g in train]
    hold = [(ph / scale[..., None], g) for ph, g in hold]
    free = (init > 0) if support == "qr" else torch.ones(L, H, dtype=torch.bool)
    free[max_layer + 1:] = False
    v = init[free].clone().requires_grad_(True)  # start from the (normalised) QR-head sum
    opt = torch.optim.Adam([v], lr=lr)

    def full_weights(vals):
        w = torch.zeros(L, H)
        w[free] = vals
        return w

    def loss_of(batch):
        w = full_weights(v)
        return torch.stack([group_contrastive_loss((ph * w[..., None]).sum((0, 1)), g) for ph, g in batch]).mean()

    with torch.no_grad():
        h0 = float(loss_of(hold))
    best = (h0, full_weights(v.detach()), -1)
    history = []
    for epoch in range(epochs):
        opt.zero_grad()
        loss = loss_of(train) + l2 * ((v - init[free]) ** 2).sum()
        loss.backward()
        opt.step()
        with torch.no_grad():
            if nonneg:
                v.clamp_(min=0.0)
            hl = float(loss_of(hold))
        history.append((float(loss.detach()), hl))
        if hl < best[0]:
            best = (hl, full_weights(v.detach()), epoch)
    weights = (best[1] / scale).tolist()
    full = [[0.0] * H for _ in range(len(hs.scores))]
    for l in range(L):
        full[l] = [round(x, 6) for x in weights[l]]
    info = {
        "dump": str(dump_dir), "queries_train": len(train), "queries_holdout": len(hold), "max_layer": max_layer,
        "epochs": epochs, "best_epoch": best[2], "lr": lr, "l2": l2, "support": support, "nonneg": nonneg,
        "weighted_heads": int(free.sum()), "holdout_loss": best[0], "initial_holdout_loss": h0, "loss": "group contrastive, min-max [0, 8]",
    }
    out = replace(hs, weights=tuple(tuple(r) for r in full), weights_info=info)
    out.save(headset_path)
    return out
