"""The engine's fast path for per-head rules: every cell's memory as arrays, and screens.

A per-head rule judges layers x heads cells every sample. :class:`CellMemory` holds exactly
what each cell's :class:`~.detectors.Memory` would hold, as numpy arrays; a *screen*
(:data:`SCREENS`, one per rule kind that has one) judges all cells of a sample at once and
clears the ones surely calm. Every other cell goes through the kind's own detector, so the
decisions are the per-cell ones (checked by replaying scenarios through both paths).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from logitwatch.server.alerts.detectors import EARLY_MAX, RECENT_MAX, Memory, departure_limit

if TYPE_CHECKING:
    from logitwatch.server.alerts.spec import RuleSpec

__all__ = ["SCREENS", "CellMemory"]


class CellMemory:
    """The :class:`~.detectors.Memory` of every cell of one per-head metric (layers x heads),
    as arrays.

    It holds exactly what :meth:`Memory.push` would hold for each cell of
    :meth:`Memory.per_head` (the newest ``RECENT_MAX`` finite samples in ring buffers, the
    first ``EARLY_MAX`` finite ones with their steps, the count seen, the last sample);
    :meth:`memory` rebuilds one cell's :class:`Memory` for its detector.
    """

    def __init__(self, shape: tuple[int, int]) -> None:
        layers, heads = shape
        self.shape = shape
        self.vals = np.zeros((RECENT_MAX, layers, heads))
        self.steps = np.zeros((RECENT_MAX, layers, heads), dtype=np.int64)
        self.pos = np.zeros(shape, dtype=np.int64)  # each cell's next ring slot
        self.count = np.zeros(shape, dtype=np.int64)  # len(Memory.recent)
        self.early = np.zeros((EARLY_MAX, layers, heads))
        self.early_steps = np.zeros((EARLY_MAX, layers, heads), dtype=np.int64)
        self.early_n = np.zeros(shape, dtype=np.int64)
        self.seen = 0  # every cell sees every sample of its metric
        self.last_step = 0
        self.last_val = np.full(shape, math.nan)
        self._li, self._hi = np.indices(shape)

    def recent_idx(self, k: int, skip: int = 0) -> np.ndarray:
        """Ring slots of each cell's ``k`` newest samples before its ``skip`` newest, oldest
        first, shape (k, layers, heads); slots beyond a short history hold stale values."""
        back = np.arange(k - 1 + skip, skip - 1, -1)[:, None, None]
        return (self.pos[None] - 1 - back) % RECENT_MAX

    def take(self, arr: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """``arr`` (ring-buffer shaped) at the slots ``idx`` of :meth:`recent_idx`."""
        return arr[idx, self._li, self._hi]

    def ordered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every ring slot, oldest first: (values, steps, holds a sample), each (K, L, H)."""
        idx = self.recent_idx(RECENT_MAX)
        valid = np.arange(RECENT_MAX)[:, None, None] >= (RECENT_MAX - self.count)[None]
        return self.take(self.vals, idx), self.take(self.steps, idx), valid

    def push(self, step: int, v: np.ndarray, keep: np.ndarray) -> None:
        """Record one sample of every cell, as :meth:`Memory.push` does for the cells in
        ``keep`` (the others: counted and remembered as last, kept out of the history)."""
        self.seen += 1
        self.last_step = step
        self.last_val = v.copy()
        li, hi = np.nonzero(keep & np.isfinite(v))
        if not li.size:
            return
        p = self.pos[li, hi]
        self.vals[p, li, hi] = v[li, hi]
        self.steps[p, li, hi] = step
        self.pos[li, hi] = (p + 1) % RECENT_MAX
        self.count[li, hi] = np.minimum(self.count[li, hi] + 1, RECENT_MAX)
        e = self.early_n[li, hi] < EARLY_MAX
        le, he = li[e], hi[e]
        self.early[self.early_n[le, he], le, he] = v[le, he]
        self.early_steps[self.early_n[le, he], le, he] = step
        self.early_n[le, he] += 1

    def memory(self, layer: int, head: int) -> Memory:
        """One cell's :class:`Memory`, as the per-cell path would hold it."""
        m = Memory.per_head()
        n, p = int(self.count[layer, head]), int(self.pos[layer, head])
        for j in range(p - n, p):
            q = j % RECENT_MAX
            m.recent.append((int(self.steps[q, layer, head]), float(self.vals[q, layer, head])))
        k = int(self.early_n[layer, head])
        m.early = list(zip(self.early_steps[:k, layer, head].tolist(),
                           self.early[:k, layer, head].tolist(), strict=True))
        m.seen = self.seen
        if self.seen:
            m.last = (self.last_step, float(self.last_val[layer, head]))
        return m


Screen = Callable[["RuleSpec", CellMemory, int, np.ndarray], tuple[np.ndarray, np.ndarray]]

_REL = 1e-9  # screens keep every cell within this of its limit for the exact detector


def masked_median(x: np.ndarray, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Median over axis 0 of the values ``sel`` picks (``statistics.median``'s rule: the
    mean of the two middle values of an even count), and how many it picked."""
    n = sel.sum(axis=0)
    s = np.sort(np.where(sel, x, np.inf), axis=0)
    lo = np.maximum(n - 1, 0) // 2
    hi = np.maximum(n // 2, 0)
    lo_v = np.take_along_axis(s, lo[None], axis=0)[0]
    hi_v = np.take_along_axis(s, np.minimum(hi, s.shape[0] - 1)[None], axis=0)[0]
    with np.errstate(invalid="ignore"):
        return np.where(n > 0, (lo_v + hi_v) / 2, np.nan), n


def window_select(cm: CellMemory, step: int, lag: int, span: int, min_samples: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What :func:`~.detectors.window` picks for every cell: (values, picked, steps), each
    (K, L, H), oldest first."""
    vals, steps, valid = cm.ordered()
    end = step - lag
    eligible = valid & (steps < end)
    inside = eligible & (steps >= end - span)
    # the newest min_samples eligible samples: count the eligible ones from the newest back
    newer = np.cumsum(eligible[::-1], axis=0)[::-1]
    newest = eligible & (newer <= min_samples)
    enough = (inside.sum(axis=0) >= min_samples)[None]
    return vals, np.where(enough, inside, newest), steps


def _all_cells(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(v.shape, dtype=bool), np.ones(v.shape, dtype=bool)


def _screen_departure(r: RuleSpec, cm: CellMemory, step: int,
                      v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lag, span = int(r.param("lag")), int(r.param("window"))
    min_n, min_hist = int(r.param("min_samples")), int(r.param("min_history"))
    vals, sel, _ = window_select(cm, step, lag, span, min_n)
    base, n = masked_median(vals, sel)
    judged = ((n >= min_n) & (cm.early_n > 0)
              & (cm.early_steps[0] <= step - lag - min_hist))
    limit = departure_limit(r, base)
    calm = v < limit - _REL * (np.abs(limit) + 1.0)  # False for NaN and inf
    return judged, judged & ~calm


def _screen_trend(r: RuleSpec, cm: CellMemory, step: int,
                  v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    min_n = int(r.param("min_samples"))
    _, sel, _ = window_select(cm, step, 0, int(r.param("window")), min_n - 1)
    n = sel.sum(axis=0)
    k = int(n.max()) if n.size else 0
    if k < 1 or k + 1 < min_n:
        return np.zeros(v.shape, dtype=bool), np.zeros(v.shape, dtype=bool)
    # the cells whose window holds k samples (the newest k: no lag) are judged here; any
    # other cell (a shorter history, non-finite samples kept out) by its detector
    w = k + 1
    idx = cm.recent_idx(k)
    ys = np.concatenate([cm.take(cm.vals, idx), v[None]])
    xs = np.concatenate([cm.take(cm.steps, idx), np.full((1, *v.shape), step)]).astype(float)
    regular = (n == k) & np.isfinite(v)
    positive = (ys > 0).all(axis=0)
    judged = regular & positive
    i, j = np.triu_indices(w, 1)
    d = ys[j] - ys[i]
    # Kendall's S on the values bounds the one on their logs from above (log may merge two
    # values a few ulps apart into a tie, never reorder them)
    s_up = (d > 0).sum(axis=0) - ((d < 0) & (-d > 1e-12 * np.abs(ys[i]))).sum(axis=0)
    tau_up = s_up / (w * (w - 1) / 2)
    logs = np.log(np.where(ys > 0, ys, 1.0))
    dx = xs[j] - xs[i]
    ties = (dx == 0).any(axis=0)
    slope = masked_median((logs[j] - logs[i]) / np.where(dx == 0, 1.0, dx),
                          np.ones(dx.shape, dtype=bool))[0]
    growth = np.exp(slope * (xs[-1] - xs[0]))
    maybe = ((tau_up >= float(r.param("min_tau")) - 1e-12)
             & (growth >= float(r.param("min_ratio")) * (1 - 1e-6))
             & (v >= float(r.param("floor"))))
    odd = ~regular | ~positive
    return judged, (judged & (ties | maybe)) | (odd & np.isfinite(v) & (n + 1 >= min_n))


def _screen_entropy_collapse(r: RuleSpec, cm: CellMemory, step: int,
                             v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    min_n = int(r.param("min_samples"))
    if min_n > EARLY_MAX:
        return _all_cells(v)
    k = np.arange(EARLY_MAX)[:, None, None]
    have = k < cm.early_n[None]
    inside = have & (cm.early_steps < cm.early_steps[0][None] + int(r.param("first_steps")))
    first = have & (k < min_n)
    sel = np.where((inside.sum(axis=0) >= min_n)[None], inside, first)
    base, _ = masked_median(cm.early, sel)
    judged = (cm.early_n >= min_n) & np.isfinite(v)
    limit = base * float(r.param("fraction"))
    calm = v >= limit + _REL * (np.abs(limit) + 1.0)
    return judged, judged & ~calm


#: Whole-matrix screens, per rule kind: ``(judged, candidates)`` over all cells of a
#: per-head metric. ``judged``: the cells whose detector returns a verdict (exact outside
#: the candidates). Outside ``candidates`` the detector's verdict is surely no breach (or
#: none), so a cell at rest there needs no detector call: the screens over-include (a
#: relative margin for rounding), and the exact detector decides every candidate.
SCREENS: dict[str, Screen] = {
    "departure": _screen_departure,
    "trend": _screen_trend,
    "entropy_collapse": _screen_entropy_collapse,
}
