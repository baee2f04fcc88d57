"""An offline mirror of the loss-ramp rules (``loss_clip_ramp``, ``loss_grad_ramp``) on every
step of the recorded runs, to sweep the "LR still climbing" factor (``rising_factor``)
without replaying the engine.

At each step of a run's header (every step's loss, gradient norm, clip flag and LR, as
recorded): the loss's 20-step median at least ``max(0.3, 2 x its step-to-step noise over
100 steps)`` above the lowest it settled to (from step 50), the LR over its value 50 steps
before in ``(factor, 4]``, and the gradient clipped on 75 % of the last 20 steps or its
50-step median 2.5x the lowest it settled to (from step 100): the defaults of
``server/alerts/defaults.py``. Per factor it prints the healthy and degraded runs that
would fire, the diverging runs fired by their divergence, and those lost against the
default 1.05. The mirror ignores the rules' interplay with the others (a page by another
rule first): a change it suggests must then be replayed (``bench_alerts.py --rules``).

    python bench/mirror_ramps.py --split read50               # the tuning data
    python bench/mirror_ramps.py --split read50 --factors 1.05,1.08 --show
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics as st
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench_alerts import READ_THROUGH, SETS

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
DEFAULT = 1.05


def _fin(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _noise(v: list[float]) -> float:
    """The robust standard deviation from successive differences (``series.diff_noise``)."""
    d = [b - a for a, b in zip(v, v[1:], strict=False)]
    m = st.median(d)
    return st.median([abs(x - m) for x in d]) * 1.4826 / math.sqrt(2)


def fires(path: Path) -> tuple[str, str, int | None, str, list[tuple[int, float]]]:
    """(name, label, divergence step, split, [(step, LR ratio)] where the level and the
    clip or gradient condition hold with the LR ratio in (1, 4])."""
    with gzip.open(path, "rt") as f:
        h = json.loads(f.readline())
    loss, grad, clip, lr = h["losses"], h["grad_norms"], h["clipped"], h["lrs"]
    low = glow = math.inf
    glev = 0.0
    out = []
    for t in range(len(loss)):
        if not _fin(loss[t]):
            break
        if t < 19:
            continue
        level = st.median([x for x in loss[t - 19:t + 1] if _fin(x)])
        if t >= 100:
            gs = [x for x in grad[t - 49:t + 1] if _fin(x)]
            if gs:
                glev = st.median(gs)
                glow = min(glow, glev)
        if t < 50:
            continue
        low = min(low, level)
        if level < low + 0.3:
            continue
        margin = max(0.3, 2 * _noise([x for x in loss[max(0, t - 99):t + 1] if _fin(x)]))
        if level < low + margin or not _fin(lr[t]) or not _fin(lr[t - 50]) or lr[t - 50] <= 0:
            continue
        ratio = lr[t] / lr[t - 50]
        clipped = sum(1 for x in clip[t - 19:t + 1] if x) / 20 >= 0.75
        grad_up = t >= 100 and 0 < glow < math.inf and glev / glow >= 2.5
        if 1.0 < ratio <= 4.0 and (clipped or grad_up):
            out.append((t, ratio))
    return h["scenario"], h["label"], h.get("divergence_step"), h["split"], out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="read50",
                    help="readN (every set through freshN) or one set (default read50)")
    ap.add_argument("--factors", default="1.05,1.06,1.07,1.08,1.10,1.15")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--show", action="store_true", help="name the runs gained and lost")
    a = ap.parse_args(argv)
    if a.split in READ_THROUGH:
        sets = set(SETS[:SETS.index(READ_THROUGH[a.split]) + 1])
    else:
        sets = {a.split}
    files = sorted(SCENARIOS.glob("*.jsonl.gz"))
    with ProcessPoolExecutor(a.jobs) as ex:
        runs = [r for r in ex.map(fires, files, chunksize=16) if r[3] in sets]
    print(f"{len(runs)} runs of {a.split}")
    print(f"{'factor':>7} {'healthy':>8} {'degraded':>9} {'div caught':>11} {'lost':>5}")
    for factor in (float(x) for x in a.factors.split(",")):
        healthy, degraded, caught, lost = [], 0, 0, []
        for name, label, div, _, out in runs:
            first = next((t for t, r in out if r > factor), None)
            base = next((t for t, r in out if r > DEFAULT), None)
            if label == "healthy" and first is not None:
                healthy.append(f"{name}@{first}")
            degraded += label == "degraded" and first is not None
            if label == "diverging" and div is not None:
                caught += first is not None and first <= div
                if base is not None and base <= div and (first is None or first > div):
                    lost.append(f"{name}@{base}/{div}")
        print(f"{factor:7.2f} {len(healthy):8d} {degraded:9d} {caught:11d} {len(lost):5d}")
        if a.show:
            print("   healthy:", ", ".join(healthy) or "-")
            print("   lost:", ", ".join(lost) or "-")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
