"""An offline screen of every recorded run's gradient norm climbing (``grad_norm_climb``'s
three conditions), to choose its thresholds and the runs it must be replayed on, without
replaying the engine on all of them.

Per run, from every step's gradient norm in its header (what a job sends, whatever its
sampling interval): the level is the median of the last 20 steps, the lowest is the lowest
100-step median from step 200 on (a level of 0, a stretch of all-zero batches, sets none),
and at each step from 260 on the run's *closeness* is the least of three ratios, each 1 where
its condition just holds: the level over ``factor`` x the lowest, the level over
``climb_factor`` x the level 30 steps before, and that one over ``climb_factor`` x the level
30 steps before it. A run is *met* on the first step its closeness reaches 1 (up to its
divergence for a diverging run). It prints, per label, how many runs are met, the healthy and
degraded runs that come closest, and (``--names``) the runs to replay with ``bench_alerts.py
--names``: every healthy or degraded one that comes within 0.45 and every diverging one met.

    python bench/screen_grad_climb.py --split read55
    python bench/screen_grad_climb.py --split read55 --factor 8 --climb 2
    python bench/screen_grad_climb.py --split read55 --names > /tmp/runs.txt
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from bench_alerts import sets_of

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
WINDOW, LOW_WINDOW, SPAN, FROM = 20, 100, 30, 200


def _medians(x: np.ndarray, w: int) -> np.ndarray:
    """The median of the ``w`` values ending at each step (NaN before the first ``w``)."""
    out = np.full(len(x), np.nan)
    if len(x) >= w:
        out[w - 1:] = np.nanmedian(np.lib.stride_tricks.sliding_window_view(x, w), axis=1)
    return out


def closeness(path: Path, factor: float = 10.0, climb: float = 2.5) -> dict[str, Any]:
    """A run's name, label, split, divergence, its largest closeness (and the step), and
    the first step it is met (None: never, or only after its divergence)."""
    with gzip.open(path, "rt") as f:
        h = json.loads(f.readline())
    g = np.array([x if isinstance(x, (int, float)) and math.isfinite(x) else np.nan
                  for x in h.get("grad_norms") or []], float)
    out = {"name": h["scenario"], "label": h["label"], "split": h["split"],
           "divergence": h.get("divergence_step"), "best": 0.0, "best_step": None,
           "met": None}
    if len(g) <= FROM + 2 * SPAN:
        return out
    level, settled = _medians(g, WINDOW), _medians(g, LOW_WINDOW)
    settled[:FROM] = np.nan
    settled[~(settled > 0)] = np.nan
    low = np.fmin.accumulate(np.where(np.isfinite(settled), settled, np.inf))
    end = min(len(g) - 1, out["divergence"] if out["divergence"] is not None else len(g))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.arange(FROM + 2 * SPAN, end + 1)
        parts = np.stack([level[t] / (factor * low[t]),
                          level[t] / (climb * level[t - SPAN]),
                          level[t - SPAN] / (climb * level[t - 2 * SPAN])])
    score = np.where(np.isfinite(parts).all(axis=0), parts.min(axis=0), 0.0)
    if len(score):
        i = int(np.argmax(score))
        out["best"], out["best_step"] = round(float(score[i]), 3), int(t[i])
        hit = np.nonzero(score >= 1.0)[0]
        out["met"] = int(t[hit[0]]) if len(hit) else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="read55",
                    help="readN (every set through freshN) or one set (default read55)")
    ap.add_argument("--factor", type=float, default=10.0,
                    help="the level over the lowest settled level (default 10)")
    ap.add_argument("--climb", type=float, default=2.5,
                    help="the level's rise over each of two 30-step spans (default 2.5)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--names", action="store_true",
                    help="print only the names of the runs to replay")
    a = ap.parse_args(argv)
    sets = set(sets_of(a.split))
    paths = sorted(SCENARIOS.glob("*.jsonl.gz"))
    with ProcessPoolExecutor(a.jobs) as ex:
        runs = [r for r in ex.map(partial(closeness, factor=a.factor, climb=a.climb), paths,
                                  chunksize=16) if r["split"] in sets]
    calm = sorted((r for r in runs if r["label"] != "diverging"), key=lambda r: -r["best"])
    if a.names:
        print(" ".join(r["name"] for r in runs if r["met"] is not None
                       or (r["label"] != "diverging" and r["best"] >= 0.45)))
        return 0
    print(f"{len(runs)} runs of {a.split}: level >= {a.factor:g}x the lowest settled, and "
          f"{a.climb:g}x over each of two {SPAN}-step spans")
    for lab in ("diverging", "degraded", "healthy"):
        of = [r for r in runs if r["label"] == lab]
        met = [r for r in of if r["met"] is not None]
        leads = [r["divergence"] - r["met"] for r in met if r["divergence"] is not None]
        lead = f", lead median {int(np.median(leads))}" if leads else ""
        print(f"  {lab:9s} {len(met):4d} of {len(of):4d} met{lead}")
    print("healthy and degraded runs that come closest (closeness, step):")
    for r in calm[:8]:
        print(f"  {r['name']:36s} {r['label']:9s} {r['best']:5.2f} {r['best_step']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
