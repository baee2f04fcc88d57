"""An offline screen of every recorded run's log Z falling under its own range, to choose the
runs a downward log Z rule (``final_logz_fall``) must be replayed on, without replaying the
engine on all of them.

Per run, from every step's ``final.logz`` in its frames, at each step from 350 on (up to its
divergence for a diverging run): the baseline is the median of the 200 steps ending 50 steps
back (the rule's ``window`` and ``lag``), and the fall is how far under it the median of the
last 100 steps (the rule's ``smooth``) and of the last 20 (its fast path's ``climb_window``)
are. It prints, per label, the runs whose largest 100-step fall reaches each threshold, the
healthy and degraded runs that fall furthest, and (``--names``) the runs that come 0.7 nat
under on the 100-step level or 1.3 on the 20-step one: the ones to replay with
``bench_alerts.py --names``. The screen ignores the rule's other conditions (the noise added
to the margin, the fall running away, the loss not falling): a run it does not name cannot
reach the rule's margins, a run it names must still be replayed.

    python bench/screen_logz.py --split read54
    python bench/screen_logz.py --split read54 --names > /tmp/runs.txt
"""

from __future__ import annotations

import argparse
import gzip
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from bench_alerts import sets_of

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
WINDOW, LAG, SMOOTH, SHORT, FROM = 200, 50, 100, 20, 350
THRESHOLDS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)


def falls(path: Path) -> dict[str, Any]:
    """A run's name, label, split and its largest falls under the baseline (100- and
    20-step levels), and the first step each threshold is reached on the 100-step one."""
    with gzip.open(path, "rt") as f:
        h = json.loads(f.readline())
        z: dict[int, float] = {}
        for line in f:
            d = json.loads(line)
            v = (d.get("scalars") or {}).get("final.logz")
            if v is not None and d.get("end") is None:
                z[int(d["step"])] = float(v)
    out = {"name": h["scenario"], "label": h["label"], "split": h["split"],
           "down": 0.0, "down20": 0.0, "first": {}}
    if not z:
        return out
    n = max(z) + 1
    lz = np.full(n, np.nan)
    for s, v in z.items():
        lz[s] = v
    end = h.get("divergence_step") or n - 1
    for t in range(FROM, min(end, n - 1) + 1):
        base = lz[t - LAG - WINDOW:t - LAG]
        level, short = lz[t - SMOOTH + 1:t + 1], lz[t - SHORT + 1:t + 1]
        if np.isfinite(base).sum() < 20 or np.isfinite(level).sum() < 20:
            continue
        b = float(np.nanmedian(base))
        down = b - float(np.nanmedian(level))
        out["down"] = max(out["down"], down)
        if np.isfinite(short).sum() >= SHORT // 2:
            out["down20"] = max(out["down20"], b - float(np.nanmedian(short)))
        for x in THRESHOLDS:
            if down >= x and x not in out["first"]:
                out["first"][x] = t
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="read54",
                    help="readN (every set through freshN) or one set (default read54)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--names", action="store_true",
                    help="print only the names of the runs to replay (0.7 nat under on the "
                    "100-step level, or 1.3 on the 20-step one)")
    a = ap.parse_args(argv)
    sets = set(sets_of(a.split))
    with ProcessPoolExecutor(a.jobs) as ex:
        runs = [r for r in ex.map(falls, sorted(SCENARIOS.glob("*.jsonl.gz")), chunksize=16)
                if r["split"] in sets]
    if a.names:
        print(" ".join(r["name"] for r in runs if r["down"] >= 0.7 or r["down20"] >= 1.3))
        return 0
    print(f"{len(runs)} runs of {a.split}: runs whose 100-step level comes this far under "
          "its baseline")
    print(f"{'nat':>5} " + " ".join(f"{lab:>10}" for lab in ("diverging", "degraded",
                                                              "healthy")))
    for x in THRESHOLDS:
        counts = [sum(1 for r in runs if r["label"] == lab and x in r["first"])
                  for lab in ("diverging", "degraded", "healthy")]
        print(f"{x:5.2f} " + " ".join(f"{c:>10}" for c in counts))
    calm = sorted((r for r in runs if r["label"] != "diverging"), key=lambda r: -r["down"])
    print("healthy and degraded runs that fall furthest (100-step, 20-step level, nat):")
    for r in calm[:8]:
        print(f"  {r['name']:36s} {r['label']:9s} {r['down']:5.2f} {r['down20']:5.2f}")
    picked = sum(1 for r in runs if r["down"] >= 0.7 or r["down20"] >= 1.3)
    print(f"{picked} runs to replay (--names)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
