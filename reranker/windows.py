"""Ranking more candidates than one full-attention prompt holds: windows aligned on anchors.

ICR reads every candidate in ONE prompt; past the model's context (SmolLM2: 8,192
positions, about 48 candidates of 160 tokens) the prompt cannot run. Rather than refuse a
request, the candidates are split into windows that each fit, every window is scored on
its own, and the windows' scores are made comparable **(our choice)**:

- Every window carries the same *anchor* candidates: the first-stage top ``a`` (default 1),
  placed first in candidate order (with ICR's ``reverse``, nearest the query, the same
  place in every window). The other candidates are split, in first-stage order, into
  contiguous chunks of near-equal size, one chunk per window.
- Window 0 is the reference. The scores of window ``w`` are shifted by
  ``delta_w = mean_{anchors a} (s_0(a) - s_w(a))`` so that the anchors score the same in
  every window; each candidate keeps its (shifted) score from the one window it is in.

A shift (not a rescale) keeps the scores' unit (attention mass) and cannot flip signs;
per-window standardisation was rejected because the windows are not alike (window 0
holds the first-stage best). The alignment is approximate: attention mass is shared
among the candidates of a window, so windows of very different size or quality still
differ in scale. Rankers report what ran in the result's warnings and
``details["windows"]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from heedrank.errors import ContextOverflowError


@dataclass(frozen=True)
class WindowPlan:
    """How candidates are split into windows.

    Attributes:
        anchors: Candidate indices carried by every window (first-stage top ones).
        windows: Per window, the candidate indices it holds: the anchors first, then its
            own chunk, in first-stage order.
    """

    anchors: tuple[int, ...]
    windows: tuple[tuple[int, ...], ...]

    def own(self, w: int) -> tuple[int, ...]:
        """Candidates that window ``w`` scores for the final ranking (anchors: window 0 only)."""
        return self.windows[w] if w == 0 else self.windows[w][len(self.anchors):]


def plan_windows(costs: Sequence[int], fixed: int, limit: int, anchors: int = 1) -> WindowPlan:
    """Split candidates into windows of at most ``limit`` positions.

    Args:
        costs: Positions each candidate takes in a prompt (content, marker, separator),
            in first-stage order.
        fixed: Positions of the prompt without any candidate (instruction, query span).
        limit: Positions one window may use.
        anchors: Candidates carried by every window; lowered (down to 0, no alignment)
            when a window cannot hold them plus the longest other candidate.

    Returns:
        The plan; a single window holding everything when it all fits.

    Raises:
        ContextOverflowError: one candidate alone does not fit (lower max_doc_tokens or
            the query budget); ``max_candidates=0``.
    """
    n = len(costs)
    if n == 0:
        return WindowPlan((), ((),))
    if fixed + sum(costs) <= limit:
        return WindowPlan((), (tuple(range(n)),))
    if fixed + max(costs) > limit:
        raise ContextOverflowError(
            f"a window of {limit} positions cannot hold even one candidate ({fixed} fixed + {max(costs)} positions); "
            "lower max_doc_tokens or the query length",
            max_candidates=0,
        )
    a = min(max(anchors, 0), n - 1)
    while a > 0 and fixed + sum(costs[:a]) + max(costs[a:]) > limit:
        a -= 1
    base = fixed + sum(costs[:a])
    rest = list(range(a, n))
    greedy: list[list[int]] = [[]]
    used = base
    for i in rest:
        if greedy[-1] and used + costs[i] > limit:
            greedy.append([])
            used = base
        greedy[-1].append(i)
        used += costs[i]
    k = len(greedy)
    # Same number of windows, near-equal counts (the last window of a greedy split is often tiny).
    size, extra = divmod(len(rest), k)
    balanced, pos = [], 0
    for w in range(k):
        m = size + (1 if w < extra else 0)
        balanced.append(rest[pos : pos + m])
        pos += m
    chunks = balanced if all(base + sum(costs[i] for i in c) <= limit for c in balanced) else greedy
    head = tuple(range(a))
    return WindowPlan(head, tuple(head + tuple(c) for c in chunks))


def align_to_anchors(plan: WindowPlan, window_scores: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Scores of every candidate on window 0's scale.

    Args:
        plan: The window plan.
        window_scores: Per window, one score per candidate of ``plan.windows[w]``, in
            that order.

    Returns:
        ``(scores, shifts)``: one score per candidate (candidate order) and the shift
        ``delta_w`` added to each window's scores (0.0 for window 0 and without anchors).
    """
    n = sum(len(plan.own(w)) for w in range(len(plan.windows)))
    a = len(plan.anchors)
    final = [0.0] * n
    shifts = []
    ref = list(window_scores[0][:a])
    for w, (idx, scores) in enumerate(zip(plan.windows, window_scores)):
        shift = sum(r - s for r, s in zip(ref, scores[:a])) / a if a and w else 0.0
        shifts.append(shift)
        for i, s in zip(idx, scores):
            if w == 0 or i not in plan.anchors:
                final[i] = float(s) + shift
    return final, shifts
