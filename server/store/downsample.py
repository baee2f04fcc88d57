"""Min/max-preserving downsampling: no spike disappears at any zoom.

Each bucket keeps the points holding its minimum and its maximum (in step order), and the
first point of each non-finite kind (NaN, +Inf, -Inf) in it: NaN and Inf are signals, but a
run that logs NaN for its last million steps must not send a million points.
"""

from __future__ import annotations

import numpy as np

__all__ = ["minmax_downsample"]


def minmax_downsample(
    steps: np.ndarray, values: np.ndarray, max_points: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return at most about ``max_points`` (steps, values), keeping each bucket's extremes."""
    n = len(values)
    if n <= max_points or max_points < 4:
        return steps, values
    buckets = max_points // 2
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    finite = np.isfinite(values)
    lo = np.where(finite, values, np.inf)
    hi = np.where(finite, values, -np.inf)
    keep = np.zeros(n, dtype=bool)
    starts = edges[:-1]
    # reduceat gives each bucket's extreme; the first index attaining it is the kept point.
    bmin = np.minimum.reduceat(lo, starts)
    bmax = np.maximum.reduceat(hi, starts)
    bucket_of = np.repeat(np.arange(buckets), np.diff(edges))
    is_min = lo == bmin[bucket_of]
    is_max = hi == bmax[bucket_of]
    for mask in (is_min, is_max):
        idx = np.flatnonzero(mask)
        first = np.unique(bucket_of[idx], return_index=True)[1]
        keep[idx[first]] = True
    for mask in (np.isnan(values), values == np.inf, values == -np.inf):
        idx = np.flatnonzero(mask)
        if len(idx):
            keep[idx[np.unique(bucket_of[idx], return_index=True)[1]]] = True
    return steps[keep], values[keep]
