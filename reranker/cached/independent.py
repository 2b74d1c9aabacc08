"""List-independent scoring of cached BlockRank: a probability of relevance per (query, document).

Source: the attention reading of ICR (Chen et al., ICLR 2025, section 3: query attention
calibrated by a content-free query) and BlockRank's block structure (Gupta et al. 2025,
arXiv 2510.05396, sections 3-4), read before the softmax that makes them list-relative
(docs/design/algorithms.md, "List-independent scoring").

The query block and the content-free ``N/A`` block run against block 0 only (one merged pass,
:func:`heedrank.reranker.blockforward.merged_query_pass`): their hidden states never see a
candidate. At each layer ``l`` of ``0..l*`` and query head ``h``, a row ``r`` of either block has
raw logits ``z_rj = q_r . k_j / sqrt(d)`` (times the model's attention scaling) to every key
``j``; for a candidate ``d`` read from its stored keys,

    f_r(d) = LSE_{j in d} z_rj - LSE_{j in block 0} z_rj,

the log-odds of the attention the document would take if it stood beside block 0 alone. Rows
are averaged per group (:data:`GROUPS`: the template before the query text, the query's (or
``N/A``'s) text, the template after it, the last row; and the max over the query's text rows),
giving ``F(d)``, float32 ``(L, H, G)``. The score is a fitted affine map,

    s(d) = bias + sum_{l,h,g} W[l, h, g] F(d)[l, h, g]   (log-odds of P(relevant)),

so ``P(relevant) = sigmoid(s(d))`` depends on the query and the document alone: the same
whether the document is sent alone or among any others (to float32 rounding; oracle test
``tests/reranker/test_architectures.py::test_independent_features_do_not_depend_on_the_list``).
``W`` and ``bias`` come from the weights card's
``independent`` entry, fitted by logistic regression on training lists
(:mod:`heedrank.lab.train.independent_fit`), with fixed feature statistics, never the list's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from heedrank.errors import ValidationError

GROUPS = ("prefix", "q_text", "q_suffix", "q_last", "na_text", "na_suffix", "na_last", "q_text_max")
"""Row groups of the features' last axis: ``prefix`` the template rows before the query text
(the same in both blocks: query-independent), ``q_text`` / ``na_text`` the query's / ``N/A``'s
own tokens, ``q_suffix`` / ``na_suffix`` the template rows after them, ``q_last`` / ``na_last``
the last row, ``q_text_max`` the max of ``f_r`` over the query's text rows; each a mean of
``f_r`` over its rows otherwise."""


@dataclass(frozen=True)
class IndependentWeights:
    """The weights card's ``independent`` entry, as read (:meth:`from_card`).

    Attributes:
        layers: Layers read, ``0..layers - 1`` (``l* + 1``).
        heads: Query heads per layer.
        weights: float64 ``(layers, heads, len(GROUPS))`` as nested tuples, per unit of feature
            (the training statistics are folded in).
        bias: Log-odds intercept.
    """

    layers: int
    heads: int
    weights: tuple[float, ...]
    bias: float

    @classmethod
    def from_card(cls, data: Mapping[str, Any]) -> IndependentWeights:
        """The scorer's weights of a parsed card (its ``independent`` entry:
        :func:`heedrank.reranker.cards.independent_entry`).

        Raises:
            ValidationError: a missing or garbled entry, or other groups than :data:`GROUPS`.
        """
        from heedrank.reranker.cards import independent_entry

        entry = independent_entry(data)
        if entry is None:
            raise ValidationError("the weights card has no 'independent' entry: refit it with "
                                  "`heedrank lab fit-independent` (recipes/default) or use scoring='learned'")
        return cls.of(entry)

    @classmethod
    def of(cls, entry: Any) -> IndependentWeights:
        """The weights of a card's :class:`heedrank.reranker.cards.IndependentEntry`.

        Raises:
            ValidationError: other groups than :data:`GROUPS` (fitted by another version: refit it).
        """
        if tuple(entry.groups) != GROUPS:
            raise ValidationError(f"the card's independent groups {list(entry.groups)} are not {list(GROUPS)}: "
                                  "it was fitted by another version; refit it")
        return cls(entry.layers, entry.heads, entry.weights, entry.bias)

    def tensor(self) -> Any:
        """float64 ``(layers, heads, len(GROUPS))``."""
        import torch

        return torch.tensor(self.weights, dtype=torch.float64).reshape(self.layers, self.heads, len(GROUPS))


def _row_groups(query_ids: Sequence[int], calib_ids: Sequence[int], members: Sequence[Sequence[int]]
                ) -> list[list[int]]:
    """The merged pass's rows of each group of :data:`GROUPS` but the last (the max)."""
    q, c = list(query_ids), list(calib_ids)
    P = 0
    while P < min(len(q), len(c)) and q[P] == c[P]:
        P += 1
    S = 0
    while S < min(len(q), len(c)) - P and q[-1 - S] == c[-1 - S]:
        S += 1
    mq, mc = list(members[0]), list(members[1])
    return [mq[:P], mq[P: len(q) - S], mq[len(q) - S:], mq[-1:], mc[P: len(c) - S], mc[len(c) - S:], mc[-1:]]


def query_states(lm: Any, prompt: Any, kv: Sequence[tuple[Any, Any]], layers: Sequence[int], *, detach: bool = True
                 ) -> tuple[dict[int, Any], list[list[int]]]:
    """The query and ``N/A`` blocks' query states against block 0 only.

    Args:
        lm: :class:`heedrank.reranker.lm.LoadedLM` (with the query adapter when one is loaded).
        prompt: :class:`heedrank.reranker.blockforward.BlockPrompt`.
        kv: Per layer ``(keys, values)`` whose first ``L0`` positions are block 0's (a query's
            context; only those are read), ``(1, kv_heads, >= L0, head_dim)``.
        layers: Layers to read, ascending; the pass stops after the last.
        detach: Keep the states out of the autograd graph (``False``: a query adapter trained
            through this score, :func:`heedrank.lab.train.query_adapter.independent_scores`).

    Returns:
        ``({layer: (heads, R, head_dim) float32 scaled query states}, row groups)``.
    """
    from heedrank.reranker.attention import AttentionCapture
    from heedrank.reranker.blockforward import merged_query_pass

    L0 = len(prompt.instruction_ids)
    kv0 = [(k[:, :, :L0], v[:, :, :L0]) for k, v in kv[: max(layers) + 1]]
    cap = AttentionCapture(layers=set(layers), mode="query", stop_after=max(layers), detach=detach)
    rows = merged_query_pass(lm, prompt, kv0, cap, [prompt.query_ids, prompt.calib_ids], fast=False)
    return {l: cap.out[l][0] for l in layers}, _row_groups(prompt.query_ids, prompt.calib_ids, rows.members)


def _padded_index(lengths: Sequence[int], device: Any = None) -> tuple[Any, Any]:
    """``(index, valid)``: ``(N, T)`` positions of each document's tokens among the candidates'
    concatenated tokens, and which are real (``T`` the longest), on ``device``."""
    import torch

    n = torch.tensor(list(lengths), device=device)
    T = int(n.max())
    starts = torch.cumsum(n, 0) - n
    ar = torch.arange(T, device=device)
    valid = ar[None, :] < n[:, None]
    return (starts[:, None] + ar[None, :]).clamp(max=int(n.sum()) - 1), valid


def _logits(q: Any, keys: Any) -> Any:
    """``(H, R, K)`` logits of scaled query states ``(H, R, d)`` against ``(kv_heads, K, d)``
    keys (grouped-query attention: head ``h`` reads kv head ``h // (H / kv_heads)``)."""
    import torch

    H, R, d = q.shape
    g = keys.shape[0]
    return torch.matmul(q.reshape(g, (H // g) * R, d), keys.float().transpose(-1, -2)).reshape(H, R, -1)


def _used_rows(groups: Sequence[Sequence[int]], used: Sequence[int]) -> list[int]:
    """The merged pass's rows that the groups ``used`` read (the max group reads the query's text)."""
    rows: set[int] = set()
    for g in used:
        rows |= set(groups[1] if g == len(GROUPS) - 1 else groups[g])
    return sorted(rows)


def document_features(states: Mapping[int, Any], groups: Sequence[Sequence[int]], kv: Sequence[tuple[Any, Any]],
                      L0: int, lengths: Sequence[int], used: Sequence[int] | None = None) -> Any:
    """``F(d)`` of every candidate (module docstring).

    Args:
        states, groups: :func:`query_states` output.
        kv: Per layer ``(keys, values)`` of block 0 then the candidates' tokens, concatenated in
            order without padding, ``(1, kv_heads, >= L0 + sum(lengths), head_dim)``.
        L0: Block 0's length.
        lengths: Tokens per candidate block.
        used: Indices of :data:`GROUPS` to compute (``None``: all); the others are 0. Only their
            rows' logits are computed (a card that reads the query's text reads a tenth of the rows).

    Returns:
        float32 ``(N, len(states), heads, len(GROUPS))``.
    """
    import torch

    layers = sorted(states)
    D = sum(lengths)
    device = states[layers[0]].device
    index, valid = _padded_index(lengths, device)
    H = states[layers[0]].shape[0]
    used = list(range(len(GROUPS))) if used is None else list(used)
    rows = _used_rows(groups, used)
    at = {r: i for i, r in enumerate(rows)}
    local = [[at[r] for r in members if r in at] for members in groups]
    out = torch.zeros(len(lengths), len(layers), H, len(GROUPS), device=device)
    if not rows:
        return out.cpu()
    for i, l in enumerate(layers):
        z = _logits(states[l][:, rows], kv[l][0][0, :, : L0 + D])
        f = torch.logsumexp(z[:, :, L0:][:, :, index].masked_fill(~valid, float("-inf")), dim=-1)
        f = f - torch.logsumexp(z[:, :, :L0], dim=-1)[:, :, None]  # (H, rows, N)
        for g in used:
            members = local[1] if g == len(GROUPS) - 1 else local[g]
            if not members:
                continue
            out[:, i, :, g] = (f[:, members].amax(1) if g == len(GROUPS) - 1 else f[:, members].mean(1)).T
    return out.cpu()


def token_shares(states: Mapping[int, Any], groups: Sequence[Sequence[int]], kv: Sequence[tuple[Any, Any]], L0: int,
                 lengths: Sequence[int], weights: Any) -> Any:
    """Each candidate token's share of its document's score, float64 ``(D,)``: the score's
    gradient with respect to the token's logits, summed (``dLSE/dz_j`` is the token's softmax
    weight within its document), so a document's shares sum to the sum of ``W`` over its mean groups
    (the max group is left out)."""
    import torch

    layers = sorted(states)
    D = sum(lengths)
    device = states[layers[0]].device
    index, valid = _padded_index(lengths, device)
    out = torch.zeros(D, dtype=torch.float64, device=device)
    for i, l in enumerate(layers):
        z = _logits(states[l], kv[l][0][0, :, : L0 + D])[:, :, L0:]
        p = torch.softmax(z[:, :, index].masked_fill(~valid, float("-inf")), dim=-1)  # (H, R, N, T)
        w = torch.zeros(p.shape[1], p.shape[0], dtype=torch.float64, device=device)  # (R, H): each row's weight
        for g, members in enumerate(groups):
            if members:
                w[members] += weights[i, :, g][None, :].to(device) / len(members)
        # the max group (q_text_max) is left out: its gradient is one row's, a share of the others
        share = torch.einsum("rh,hrnt->nt", w.to(p.dtype), p).double()
        out += share[valid]
    return out.cpu()


@dataclass(frozen=True)
class IndependentScorer:
    """``scoring='independent'``: log-odds of P(relevant) per candidate (module docstring).

    Attributes:
        weights: The card's :class:`IndependentWeights`.
    """

    weights: IndependentWeights

    def score(self, qp: Any) -> Any:
        """Scores of the query pass's candidates (:class:`heedrank.reranker.cached.scorers.QueryPass`):
        log-odds, list-independent; ``seconds["query"]`` times the pass and the reading."""
        import time

        import torch

        from heedrank.reranker.cached.scorers import Scored

        prompt = qp.prompt
        L0, lengths = len(prompt.instruction_ids), prompt.doc_lengths
        layers = list(range(self.weights.layers))
        t0 = time.perf_counter()
        with torch.inference_mode():
            w = self.weights.tensor()
            used = [g for g in range(len(GROUPS)) if bool(w[:, :, g].abs().sum() > 0)]
            states, groups = query_states(qp.lm, prompt, qp.kv, layers)
            feats = document_features(states, groups, qp.kv, L0, lengths, used).double()
            scores = (torch.einsum("nlhg,lhg->n", feats, w) + self.weights.bias).tolist()
            tokens = partial(token_shares, states, groups, qp.kv, L0, lengths, w)
        return Scored(scores, tokens, {"query": time.perf_counter() - t0})
