"""An offline screen of a candidate signal for the garbage class: the max attention logit
(over every head) collapsing under a fraction of its own recent level, as it does when an
update wipes the attention weights, read on the steps a job sampling one step in ``k``
samples (the hooks' schedule: ``scenario_frames.schedule``, a loss or gradient spike
sampling the next step at once).

Per run and interval: the first sampled step from step 100 on whose max logit is under
``--frac`` x the median of the sampled maxima over the ``--window`` steps before it (a
level of at least 1, so a run whose logits never grew is not judged). It prints, per label
and interval, the runs flagged (diverging: at or before their divergence, or after), and the
same for the runs with injected bad batches under unclipped momentum SGD (the garbage
class: wrecked or shrugged off), with the healthy ones split by whether the flag lands in
the garbage or the 20 steps after it. A screen, not a rule: a flag is no page, and a rule
built on it would have to be replayed.

    python bench/screen_logit_collapse.py --split read63 --jobs 2
    python bench/screen_logit_collapse.py --split read63 --frac 0.25 --json /tmp/collapse.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_alerts import sets_of  # noqa: E402
from peer_detectors import _num  # noqa: E402
from scenario_frames import schedule  # noqa: E402

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
FROM = 100  # no judgement before this step (the logits are still finding their level)


def first_collapse(maxima: dict[int, float], steps: list[int], frac: float, window: int,
                   k: int, floor: float = 1.0, lag: int = 0) -> int | None:
    """The first of ``steps`` (sampled, from :data:`FROM` on) whose max logit is under
    ``frac`` x the median of the sampled maxima over the ``window`` (+ ``k``) steps that end
    ``lag`` steps before it, that level at least ``floor``; None if none."""
    seen = [s for s in steps if s in maxima]
    for i, s in enumerate(seen):
        if s < FROM:
            continue
        prev = [maxima[t] for t in seen[:i] if s - lag - window - k <= t < s - lag]
        if len(prev) < 2:
            continue
        level = statistics.median(prev)
        if level >= floor and maxima[s] < frac * level:
            return s
    return None


def screen(path: Path, frac: float, window: int, intervals: tuple[int, ...],
           floor: float = 1.0, lag: int = 0) -> dict[str, Any]:
    """One run's label, divergence, garbage stretch (unclipped momentum SGD only) and first
    collapse per interval."""
    with gzip.open(path, "rt") as f:
        h = json.loads(f.readline())
        frames = [d for d in map(json.loads, f) if "step" in d]
    maxima: dict[int, float] = {}
    for fr in frames:
        m = (fr.get("heads") or {}).get("attn.logit_max")
        if m:
            vals = [_num(x) for row in m for x in row]
            if vals and all(math.isfinite(v) for v in vals):
                maxima[fr["step"]] = max(vals)
    spec = h["spec"]
    bad = spec.get("bad_data") or []
    garbage = ([bad[0][0], bad[-1][1]] if bad and spec.get("optimizer") == "sgd"
               and spec.get("max_norm") is None else None)
    return {"name": h["scenario"], "label": h["label"], "divergence": h["divergence_step"],
            "garbage": garbage,
            "first": {str(k): first_collapse(maxima, schedule(frames, k), frac, window, k,
                                               floor, lag)
                      for k in intervals}}


def _screen(args: tuple[Path, float, int, tuple[int, ...], float, int]) -> dict[str, Any]:
    return screen(*args)


def tally(rows: list[dict[str, Any]], k: int) -> tuple[Counter[str], Counter[str]]:
    """Per label at interval ``k``: every run, and the garbage class alone."""
    every: Counter[str] = Counter()
    garbage: Counter[str] = Counter()
    for r in rows:
        s = r["first"][str(k)]
        if s is None:
            key = f"{r['label']} not flagged"
        elif r["label"] == "diverging" and r["divergence"] is not None:
            key = "diverging flagged " + ("by divergence" if s <= r["divergence"] else "after")
        else:
            key = f"{r['label']} flagged"
        every[key] += 1
        if r["garbage"] is not None:
            a, b = r["garbage"]
            if s is not None and r["label"] != "diverging":
                key += " (in the garbage or 20 steps after)" if a <= s <= b + 20 else \
                    " (elsewhere)"
            garbage[key] += 1
    return every, garbage


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="read63", help="the recorded sets (as bench_alerts.py)")
    ap.add_argument("--frac", type=float, default=0.5,
                    help="a collapse: the max logit under this share of its level")
    ap.add_argument("--window", type=int, default=100, help="steps of the level (median)")
    ap.add_argument("--floor", type=float, default=1.0,
                    help="judge only where the level is at least this (logit units)")
    ap.add_argument("--lag", type=int, default=0,
                    help="the level's window ends this many steps before the sample")
    ap.add_argument("--intervals", default="1,10,50", help="sampling intervals")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", help="write every run's row here")
    a = ap.parse_args(argv)
    import scenario_sets as rs

    sets = set(sets_of(a.split))
    paths = [SCENARIOS / f"{s.name}.jsonl.gz" for s in rs.ALL if rs.SPLITS.get(s.name) in sets]
    paths = [p for p in paths if p.exists()]
    if not paths:
        print(f"no recorded runs in split {a.split!r}", file=sys.stderr)
        return 1
    intervals = tuple(int(x) for x in a.intervals.split(","))
    print(f"screening {len(paths)} runs of {a.split} at intervals {a.intervals} ...",
          file=sys.stderr)
    work = [(p, a.frac, a.window, intervals, a.floor, a.lag) for p in paths]
    with ProcessPoolExecutor(a.jobs) as ex:
        rows = list(ex.map(_screen, work, chunksize=16))
    for k in intervals:
        every, garbage = tally(rows, k)
        print(f"\n== interval {k}: max logit under {a.frac:g}x its {a.window}-step level ==")
        for key, n in sorted(every.items()):
            print(f"  {key:48s} {n:5d}")
        print("  the garbage class (bad batches under unclipped momentum SGD):")
        for key, n in sorted(garbage.items()):
            print(f"    {key:70s} {n:5d}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
