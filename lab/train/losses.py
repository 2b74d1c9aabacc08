"""The ranking losses the lab trains with, one home each (torch tensors, differentiable in the
scores; torch is imported by the caller's process, not at this module's import).

- :func:`weighted_listwise_loss`: ``-log sum_i w_i softmax(s)_i``, the listwise objective with
  gains ``w`` (ListNet-style with a multi-positive target; Cao et al., ICML 2007);
- :func:`listwise_loss`: the same with gains ``2^grade - 1`` and a temperature (the query adapter);
- :func:`pairwise_loss`: RankNet (Burges et al., ICML 2005), pairs weighted by their grade gap;
- :func:`group_contrastive_loss`: QRHead's group contrastive loss over min-max scaled scores
  (docs/design/algorithms.md section 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def weighted_listwise_loss(scores: Any, gains: Any) -> Any:
    """``logsumexp(s) - logsumexp(s + log w)``: minus the log of the softmax mass the gains'
    candidates take, each weighted by its gain.

    Args:
        scores: ``(N,)`` float tensor (already divided by any temperature).
        gains: ``(N,)`` non-negative tensor of ``scores``' dtype, at least one positive.

    Returns:
        0-d tensor.
    """
    import torch

    return torch.logsumexp(scores, 0) - torch.logsumexp(scores + torch.log(gains.clamp_min(1e-30)), 0)


def listwise_loss(scores: Any, grades: Sequence[int], tau: float) -> Any:
    """:func:`weighted_listwise_loss` of ``scores / tau`` with gains ``2^grade - 1`` (every
    positive counted; the query adapter's objective)."""
    import torch

    g = torch.tensor([float(x) for x in grades], dtype=torch.float64)
    w = torch.where(g > 0, 2.0 ** g - 1.0, torch.zeros_like(g))
    return weighted_listwise_loss(scores / tau, w)


def pairwise_loss(scores: Any, grades: Sequence[int], tau: float) -> Any:
    """RankNet: the mean over candidate pairs ``(i, j)`` with ``grade_i > grade_j`` of
    ``log(1 + exp(-(s_i - s_j) / tau))``, each pair weighted ``grade_i - grade_j``. ``scores``:
    ``(N,)`` float tensor; a list without two grades gives 0 (no gradient)."""
    import torch

    g = torch.tensor([float(x) for x in grades], dtype=scores.dtype)
    gap = g[:, None] - g[None, :]
    w = gap.clamp_min(0.0)
    if float(w.sum()) == 0.0:
        return scores.sum() * 0.0
    diff = (scores[:, None] - scores[None, :]) / tau
    return (torch.nn.functional.softplus(-diff) * w).sum() / w.sum()


def group_contrastive_loss(scores: Any, gold: Any) -> Any:
    """``-mean_{p in G} log(e^{s_p} / (e^{s_p} + sum_{n not in G} e^{s_n}))`` after min-max
    scaling the query's scores to [0, 8] (docs/design/algorithms.md section 2).

    Args:
        scores: ``(N,)`` float tensor, one score per candidate.
        gold: ``(N,)`` bool tensor, the relevant candidates (at least one).

    Returns:
        0-d float tensor (differentiable in ``scores``).
    """
    import torch

    lo, hi = scores.min(), scores.max()
    s = 8.0 * (scores - lo) / (hi - lo + 1e-9)
    neg = torch.logsumexp(s[~gold], dim=0) if (~gold).any() else torch.tensor(float("-inf"))
    pos = s[gold]
    return -(pos - torch.logaddexp(pos, neg)).mean()
