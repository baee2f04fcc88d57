"""Per-rank detail on demand for jobs that reduce before sending (``hooks/_reduce.py``).

A frame that speaks for a data-parallel group carries ``attn.logit_max_rank``: the rank
that held each head's max. While an alert is open on a head of such a run, the ingest
answer's ``control["detail_ranks"]`` names the ranks that held the alerting heads' max
(and the rank of any open alert raised on a rank's own frames), so those ranks send their
own frames until the alert resolves.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from logitwatch.wire import RANK_OF_MAX

__all__ = ["MAX_DETAIL_RANKS", "detail_ranks"]

#: At most this many ranks are asked at once (the hooks honour as many).
MAX_DETAIL_RANKS = 8


def detail_ranks(frames: Iterable[Any], alerts: Sequence[Any]) -> list[int]:
    """The ranks whose own frames the open ``alerts`` want, from the batch's ``frames``
    (the newest ``attn.logit_max_rank`` of each run); at most :data:`MAX_DETAIL_RANKS`,
    smallest first. Empty when no run of the batch reduces its ranks."""
    latest: dict[str, tuple[int, Any]] = {}
    for f in frames:
        m = (getattr(f, "heads", None) or {}).get(RANK_OF_MAX)
        if m is not None and (f.run not in latest or f.step >= latest[f.run][0]):
            latest[f.run] = (f.step, m)
    if not latest:
        return []
    out: set[int] = set()
    for a in alerts:
        if a.run not in latest:
            continue
        if a.rank:
            out.add(int(a.rank))
        if a.layer is None:
            continue
        matrix = np.asarray(latest[a.run][1], dtype=np.float64)
        for head in (a.heads or ([a.head] if a.head is not None else [])):
            if 0 <= a.layer < matrix.shape[0] and 0 <= head < matrix.shape[1]:
                r = float(matrix[a.layer, head])
                if math.isfinite(r) and r >= 0:
                    out.add(int(r))
    return sorted(out)[:MAX_DETAIL_RANKS]
