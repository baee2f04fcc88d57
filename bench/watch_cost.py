"""What the hooks' spike watch costs a training job, on the recorded runs.

The watch (``logitwatch.hooks._stepwatch``) reads every finished step's loss and gradient
norm and asks for a sample of the next step when one spikes (at most ``BURST`` within
``REARM`` steps), and a CPU job flushes the history at once after every step it flags
(``logitwatch.hooks._frames._flush_between``). A sample costs a full measurement of the
step; a flush a scalars-only frame. This script feeds every recorded run's steps, up to its
divergence (what comes after is a dead run's), through the same code and prints, per label,
the samples asked for and the flushes sent per 1,000 steps, the runs with any, and the
watch's own Python time per step on this machine. No engine, no replay: the figures are
the watch's alone.

    python bench/watch_cost.py --split read81 --jobs 2     # every run through fresh81
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from bench_alerts import sets_of
from scenario_frames import read_header, read_run

from logitwatch.hooks._stepwatch import StepWatch
from logitwatch.wire import decode_float

SCENARIOS = Path(__file__).resolve().parent / "scenarios"


def _num(v: Any) -> float | None:
    return None if v is None else decode_float(v)


def one(path: str) -> dict[str, Any]:
    """One run's label, steps fed (up to its divergence), samples asked, steps flagged and
    the watch's time."""
    header, frames = read_run(path)
    stop = header.get("divergence_step")
    series = [(f["step"], _num(f["scalars"].get("loss")), _num(f["scalars"].get("grad.norm")))
              for f in frames if stop is None or f["step"] < stop]
    watch, asked, flagged = StepWatch(), 0, 0
    t0 = time.perf_counter()
    for step, loss, norm in series:
        asked += watch.step(step, loss, norm)
        flagged += watch.flagged
    return {"label": header["label"], "steps": len(series), "asked": asked,
            "flagged": flagged, "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", default="read81",
                   help="a recorded set or a read split (bench_alerts.py --split)")
    p.add_argument("--jobs", type=int, default=2, help="parallel processes (default 2)")
    p.add_argument("--scenarios", type=Path, default=SCENARIOS)
    a = p.parse_args(argv)
    splits = set(sets_of(a.split))
    files = [str(f) for f in sorted(a.scenarios.glob("*.jsonl.gz"))
             if read_header(f).get("split") in splits]
    if not files:
        p.error(f"no runs of --split {a.split} in {a.scenarios}: run record_scenarios.py")
    tot: Counter[tuple[str, str]] = Counter()
    with ProcessPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futures = [pool.submit(one, f) for f in files]
        for i, fut in enumerate(as_completed(futures), 1):
            r = fut.result()
            for key in ("steps", "asked", "flagged", "seconds"):
                tot[r["label"], key] += r[key]
            tot[r["label"], "runs"] += 1
            tot[r["label"], "runs asked"] += r["asked"] > 0
            tot[r["label"], "runs flagged"] += r["flagged"] > 0
            if i % 250 == 0 or i == len(files):
                print(f"[{i}/{len(files)}] runs read", file=sys.stderr, flush=True)
    print(f"{'label':10s} {'runs':>6s} {'steps':>10s} {'samples/1k':>11s} {'runs':>6s} "
          f"{'flushes/1k':>11s} {'runs':>6s} {'us/step':>8s}")
    for label in sorted({lab for lab, _ in tot}):
        steps = tot[label, "steps"] or 1
        print(f"{label:10s} {tot[label, 'runs']:6d} {tot[label, 'steps']:10d} "
              f"{1000 * tot[label, 'asked'] / steps:11.3f} {tot[label, 'runs asked']:6d} "
              f"{1000 * tot[label, 'flagged'] / steps:11.3f} {tot[label, 'runs flagged']:6d} "
              f"{1e6 * tot[label, 'seconds'] / steps:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
