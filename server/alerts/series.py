"""What the alert engine remembers of one series cell, and the robust statistics over it.

A cell is a scalar, one layer/head of a per-head metric, or the max over all heads.
:class:`Memory` keeps its recent finite samples and its first ones as (step, value);
:func:`window` takes the samples of a span of **steps**, widened to the newest
``min_samples`` when the span holds fewer (a wide sampling interval), so a rule means the
same whether the job sends every step or one in 40. The statistics are medians, MADs and
rank statistics: a few outliers do not move them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from statistics import median
from typing import Any

__all__ = ["EARLY_MAX", "RECENT_MAX", "SCALAR_KEEP", "Memory", "Samples", "between",
           "diff_noise", "first_window", "kendall_tau", "last_at_or_before", "mad",
           "step_median", "theil_sen", "window"]

#: Samples a scalar cell keeps: every step of the longest default window (and twice a
#: clip-rate window), when the job sends every step's scalars.
SCALAR_KEEP = 1024
#: Samples a per-head cell keeps (the engine judges per-head statistics at most once every
#: few steps, so 64 samples cover several hundred steps).
RECENT_MAX = 64
EARLY_MAX = 32  # the first finite samples every cell keeps (its early baseline)


class Samples(deque):  # type: ignore[type-arg]
    """A bounded deque of ``(step, value)`` samples, oldest first, that knows whether its
    steps are in order (never falling from one sample to the next).

    They are, but for a job resumed from an earlier checkpoint, whose steps start again
    below the ones kept. In order, the span of steps a rule reads is found by bisection and
    copied from the newest end (:func:`between`, :func:`window`): a rule reads its last few
    hundred steps, without scanning all :data:`SCALAR_KEEP` kept, on every step.
    Out of order, the reads fall back to a whole scan (the same answer) until the samples
    that fell are out of the deque again (``maxlen`` appends later at most).
    """

    __slots__ = ("_mixed",)

    def __init__(self, iterable: Any = (), maxlen: int | None = None) -> None:
        super().__init__((), maxlen)
        self._mixed = 0  # appends left before every pair out of order has been dropped
        for p in iterable:
            self.append(p)

    def append(self, p: tuple[int, float]) -> None:  # type: ignore[override]
        if self._mixed > 0:
            self._mixed -= 1
        if self and p[0] < self[-1][0]:
            # the pair (last, p) is out of the deque within maxlen appends (a pop only
            # drops samples); unbounded, it stays: out of order for good
            self._mixed = self.maxlen if self.maxlen is not None else -1
        super().append(p)

    def extend(self, ps: Any) -> None:  # type: ignore[override]
        for p in ps:
            self.append(p)

    def __iadd__(self, ps: Any) -> Samples:  # type: ignore[override]
        self.extend(ps)
        return self

    def _unsure(self) -> None:
        """After a change that may put steps out of order where :meth:`append` does not
        look: whole scans from now on (bounded: until maxlen appends have pushed it out)."""
        self._mixed = self.maxlen if self.maxlen is not None else -1

    def appendleft(self, p: tuple[int, float]) -> None:  # type: ignore[override]
        self._unsure()
        super().appendleft(p)

    def extendleft(self, ps: Any) -> None:  # type: ignore[override]
        self._unsure()
        super().extendleft(ps)

    def insert(self, i: int, p: tuple[int, float]) -> None:  # type: ignore[override]
        self._unsure()
        super().insert(i, p)

    def rotate(self, n: int = 1) -> None:
        self._unsure()
        super().rotate(n)

    def reverse(self) -> None:
        self._unsure()
        super().reverse()

    def __setitem__(self, i: Any, p: Any) -> None:
        self._unsure()
        super().__setitem__(i, p)

    @property
    def in_order(self) -> bool:
        """Whether the steps never fall from one sample to the next."""
        return self._mixed == 0


def between(seen: deque[tuple[int, float]], lo: float, hi: float = math.inf
            ) -> list[tuple[int, float]]:
    """The samples with ``lo <= step < hi``, oldest first: ``[p for p in seen if lo <=
    p[0] < hi]``, read from the newest end when ``seen`` is :class:`Samples` in order."""
    if not (isinstance(seen, Samples) and seen.in_order):
        return [p for p in seen if lo <= p[0] < hi]
    return _slice(seen, _index(seen, lo), _index(seen, hi))


def _step(p: tuple[int, float]) -> int:
    return p[0]


def _index(seen: Samples, step: float) -> int:
    """Where the first sample at ``step`` or after is in ``seen`` (in order): a bisection
    (a deque finds an item by walking its 64-item blocks from the nearer end: a few hops
    at 1,024 samples)."""
    if step == math.inf:
        return len(seen)
    return bisect_left(seen, step, key=_step)


def _slice(seen: Samples, i: int, j: int) -> list[tuple[int, float]]:
    """``seen[i:j]``, counted off from the newest end (where a rule's window lies)."""
    if j <= i:
        return []
    n = len(seen)
    out = list(islice(reversed(seen), n - j, n - i))
    out.reverse()
    return out


def last_at_or_before(seen: deque[tuple[int, float]], step: float
                      ) -> tuple[int, float] | None:
    """The newest sample (in the deque's order) at or before ``step``, or None."""
    if isinstance(seen, Samples) and seen.in_order:
        for p in reversed(seen):
            if p[0] <= step:
                return p
        return None
    before = [p for p in seen if p[0] <= step]
    return before[-1] if before else None


@dataclass(slots=True)
class Memory:
    """What a detector remembers about one cell: recent finite samples and the first ones,
    as (step, value)."""

    recent: deque[tuple[int, float]] = field(
        default_factory=lambda: Samples(maxlen=SCALAR_KEEP))
    early: list[tuple[int, float]] = field(default_factory=list)
    last: tuple[int, float] | None = None
    seen: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def keeping(cls, keep: int | None) -> Memory:
        """The memory of a run-level cell whose rule reads its newest ``keep`` samples
        (None: :data:`SCALAR_KEEP`)."""
        return cls(recent=Samples(maxlen=SCALAR_KEEP if keep is None else keep))

    @classmethod
    def per_head(cls) -> Memory:
        """The memory of one layer/head cell (as many samples as the engine's arrays)."""
        return cls(recent=Samples(maxlen=RECENT_MAX))

    def push(self, step: int, value: float, keep_early: int = EARLY_MAX,
             pair: tuple[int, float] | None = None) -> None:
        """Keep the sample ``(step, value)``; ``pair`` is that tuple already made (one
        shared by every rule that keeps the same sample: ``FrameView.pair``)."""
        p = (step, value) if pair is None else pair
        self.seen += 1
        self.last = p
        if math.isfinite(value):
            self.recent.append(p)
            if len(self.early) < keep_early:
                self.early.append(p)

    @property
    def first_step(self) -> int | None:
        """Step of the cell's first finite sample."""
        return self.early[0][0] if self.early else None


def window(m: Memory, step: int, lag: int, span: int, min_samples: int) -> list[tuple[int, float]]:
    """The samples of the ``span`` steps before ``step - lag`` (steps ``s`` with
    ``step - lag - span <= s < step - lag``), oldest first; when they are fewer than
    ``min_samples``, the newest ``min_samples`` samples before ``step - lag`` instead."""
    end = step - lag
    if isinstance(m.recent, Samples) and m.recent.in_order:
        # the same samples, found by bisection and read from the newest end
        j = _index(m.recent, end)
        i = _index(m.recent, end - span)
        if j - i < min_samples:  # fewer in the span: the newest min_samples before end
            i = max(0, j - min_samples)
        return _slice(m.recent, i, j)
    eligible = [p for p in m.recent if p[0] < end]
    inside = [p for p in eligible if p[0] >= end - span]
    if len(inside) >= min_samples:
        return inside
    return eligible[-min_samples:] if min_samples > 0 else inside


def first_window(m: Memory, span: int, min_samples: int) -> list[float]:
    """The cell's first samples: those within ``span`` steps of its first one, or its
    first ``min_samples`` when they are fewer; [] while it has fewer than that."""
    if len(m.early) < min_samples:
        return []
    start = m.early[0][0]
    inside = [x for s, x in m.early if s < start + span]
    return inside if len(inside) >= min_samples else [x for _, x in m.early[:min_samples]]


def theil_sen(xs: list[float], ys: list[float]) -> float:
    """Median of pairwise slopes (robust to a few outliers)."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i])
              for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    return median(slopes) if slopes else 0.0


def kendall_tau(ys: list[float]) -> float:
    """Mann-Kendall score normalised to [-1, 1]: +1 when every sample exceeds all before it."""
    n = len(ys)
    if n < 2:
        return 0.0
    s = sum((ys[j] > ys[i]) - (ys[j] < ys[i]) for i in range(n) for j in range(i + 1, n))
    return s / (n * (n - 1) / 2)


def step_median(points: list[tuple[int, float]], end: int) -> float:
    """The median of ``(step, value)`` samples (oldest first), each weighted by the steps it
    stands for: up to the next sample's step (the last: up to ``end``). At one sample a
    step every weight is 1 (the plain median); at a wide interval a burst of samples close
    together (the hooks sample the steps after a loss spike at once) counts for the few
    steps it covers, not for as many samples as it holds."""
    if not points:
        raise ValueError("step_median of no samples")
    weights = [max(1, (points[i + 1][0] if i + 1 < len(points) else end) - s)
               for i, (s, _) in enumerate(points)]
    order = sorted(range(len(points)), key=lambda i: points[i][1])
    half, acc = sum(weights) / 2.0, 0.0
    for j, i in enumerate(order):
        acc += weights[i]
        if acc > half:
            return points[i][1]
        if acc == half:  # an even split: the mean of the two middle values
            return (points[i][1] + points[order[j + 1]][1]) / 2.0
    return points[order[-1]][1]


def mad(values: list[float], center: float) -> float:
    return median([abs(v - center) for v in values])


def diff_noise(values: list[float]) -> float:
    """The robust standard deviation of one value of a series from its successive
    differences (their MAD x 1.4826 / sqrt 2): a slow drift or a trend hardly moves it, as
    it moves the spread of the values themselves. Needs two values or more."""
    diffs = [b - a for a, b in zip(values, values[1:], strict=False)]
    return mad(diffs, median(diffs)) * 1.4826 / math.sqrt(2.0)
