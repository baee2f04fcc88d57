"""An offline mirror of the loss-ramp rules (``loss_clip_ramp``, ``loss_grad_ramp``) on every
step of the recorded runs, to sweep the "LR still climbing" factor (``rising_factor``)
without replaying the engine.

At each step of a run's header (every step's loss, gradient norm, clip flag and LR, as
recorded): the loss's 20-step median at least ``max(0.3, 2 x its step-to-step noise over 100
steps)`` above the lowest it settled to (from step 50), the LR over its value 50 steps
before in ``(factor, 4]``, and the gradient clipped on half the last 20 steps (60 % before
round forty-four, 75 % before round thirty-nine) or its 50-step median 2.5x the lowest it
settled to (from step 100): the defaults of ``server/alerts/default_scalar_rules.py``. Per
factor it prints the healthy and degraded runs that would fire, the diverging runs fired by
their divergence, and those lost against the default 1.05; ``--rates`` sweeps the clip rate
instead (at the default factor and bound, past the bound while the LR rose on each of its
last 5 steps, as the rules' ``ramp_steps``), against round forty-three's 60 %. The mirror
ignores the rules' interplay with the others (a page by another rule first): a change it
suggests must then be replayed (``bench_alerts.py --rules``).

    python bench/mirror_ramps.py --split read50               # the tuning data
    python bench/mirror_ramps.py --split read50 --factors 1.05,1.08 --show
    python bench/mirror_ramps.py --split read59 --rates 0.75,0.6,0.45 --show
    python bench/mirror_ramps.py --split read68 --rates 0.6,0.5,0.45,0.4,0.3 --show
    python bench/mirror_ramps.py --split read68 --rates 0.5 --near 0.3 --candidates runs.txt
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics as st
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from bench_alerts import sets_of
from numpy.lib.stride_tricks import sliding_window_view

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
DEFAULT = 1.05
MAX = 4.0  # the rules' rising_max
#: the share of the last 20 steps clipped (``loss_clip_ramp``'s ``also_rate``), and what it
#: was until round forty-four (``--rates`` compares against it; 0.75 until round thirty-nine)
RATE, RATE_BEFORE = 0.5, 0.6
#: the span (steps) of "still climbing now" (``--climbing``): the LR over its value then
SHORT = 10
#: ``--monotone``: "still climbing" is the LR up on each of the last this many steps
MONOTONE = 5


def _fin(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _noise(v: list[float]) -> float:
    """The robust standard deviation from successive differences (``series.diff_noise``)."""
    d = [b - a for a, b in zip(v, v[1:], strict=False)]
    m = st.median(d)
    return st.median([abs(x - m) for x in d]) * 1.4826 / math.sqrt(2)


def _floats(xs: list[Any]) -> np.ndarray:
    """A header's series as floats, NaN for what is not a finite number ("NaN", None)."""
    return np.array([float(x) if _fin(x) else np.nan for x in xs], dtype=np.float64)


def _ffill(x: np.ndarray) -> np.ndarray:
    """NaNs replaced by the last finite value before them (NaN before the first)."""
    idx = np.where(np.isfinite(x), np.arange(len(x)), 0)
    np.maximum.accumulate(idx, out=idx)
    return x[idx]  # before the first finite value: x[0], NaN


Entry = tuple[int, float, float, bool, float, bool]


def fires(path: Path) -> tuple[str, str, int | None, str, list[Entry]]:
    """(name, label, divergence step, split, [(step, LR ratio, LR ratio over the last
    :data:`SHORT` steps, LR up on each of the last :data:`MONOTONE` steps, share of the last
    20 steps clipped, gradient level 2.5x up)] where the loss's level holds with the LR up
    (ratio over 1) and the gradient was clipped or is up; the rules' ``rising_max`` and clip
    rate are applied by the caller (:func:`holds`)."""
    with gzip.open(path, "rt") as f:
        h = json.loads(f.readline())
    # vectorised (numpy sliding windows): the per-step loop with statistics.median read
    # the suite at ~500 steps a second
    loss, grad = _floats(h["losses"]), _floats(h["grad_norms"])
    clip, lr = _floats(h["clipped"]), _floats(h["lrs"])
    bad = np.flatnonzero(~np.isfinite(loss))
    n = int(bad[0]) if len(bad) else len(loss)
    out: list[Entry] = []
    if n <= 50:
        return h["scenario"], h["label"], h.get("divergence_step"), h["split"], out
    level = np.full(n, np.nan)
    level[19:] = np.median(sliding_window_view(loss[:n], 20), axis=1)
    low = np.full(n, np.inf)
    low[50:] = np.minimum.accumulate(level[50:])
    glev = np.full(n, np.nan)
    if n > 100:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a window of NaNs only
            # window i is grad[i:i + 50]: step t's (t - 49 .. t) is window t - 49
            glev[100:] = np.nanmedian(sliding_window_view(grad[:n], 50), axis=1)[51:]
    glev = _ffill(glev)
    glow = np.full(n, np.inf)
    if n > 100:
        g = np.where(np.isfinite(glev[100:]), glev[100:], np.inf)
        glow[100:] = np.minimum.accumulate(g)
    for t in np.flatnonzero(level >= low + 0.3):
        t = int(t)
        if t < 50:
            continue
        margin = max(0.3, 2 * _noise([float(x) for x in loss[max(0, t - 99):t + 1]]))
        if level[t] < low[t] + margin or not _fin(lr[t]) or not _fin(lr[t - 50]) \
                or lr[t - 50] <= 0:
            continue
        ratio = float(lr[t] / lr[t - 50])
        short = float(lr[t] / lr[t - SHORT]) if _fin(lr[t - SHORT]) and lr[t - SHORT] > 0 \
            else 1.0
        rate = np.count_nonzero(np.nan_to_num(clip[t - 19:t + 1]) != 0) / 20
        grad_up = bool(t >= 100 and 0 < glow[t] < math.inf and np.isfinite(glev[t])
                       and glev[t] / glow[t] >= 2.5)
        if ratio > 1.0 and (rate > 0 or grad_up):
            mono = all(_fin(lr[t - i]) and _fin(lr[t - i - 1]) and lr[t - i] > lr[t - i - 1]
                       for i in range(MONOTONE))
            out.append((t, ratio, short, mono, float(rate), grad_up))
    return h["scenario"], h["label"], h.get("divergence_step"), h["split"], out


def holds(e: Entry, rate: float = RATE) -> bool:
    """Whether the gradient condition holds on entry ``e``: clipped on ``rate`` of the last
    20 steps or more (``loss_clip_ramp``), or its level 2.5x up (``loss_grad_ramp``)."""
    return e[4] >= rate or e[5]


def ramping(e: Entry) -> bool:
    """Whether the LR condition holds on entry ``e`` as the rules have it: over
    :data:`DEFAULT` x its value 50 steps before, and under the bound (:data:`MAX`) or up on
    each of the last :data:`MONOTONE` steps (``ramp_steps``)."""
    return DEFAULT < e[1] and (e[1] <= MAX or e[3])


def first_at(out: list[Entry], rate: float = RATE) -> int | None:
    """The first step the rules' whole condition holds, at clip rate ``rate`` (None: never)."""
    return next((e[0] for e in out if ramping(e) and holds(e, rate)), None)


def top_rate(out: list[Entry]) -> float | None:
    """The highest clip rate on a step where the rest of the condition holds (None: never)."""
    return max((e[4] for e in out if ramping(e)), default=None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="read50",
                    help="readN (every set through freshN) or one set (default read50)")
    ap.add_argument("--factors", default="1.05,1.06,1.07,1.08,1.10,1.15")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--maxima", default=None,
                    help="sweep the LR ratio's upper bound (rising_max) instead, at factor "
                    "1.05: e.g. 4,10,30,inf (the default bound: 4)")
    ap.add_argument("--climbing", type=float, default=None,
                    help="with --maxima: past the bound, fire only while the LR is still "
                    f"climbing: over this factor above its value {SHORT} steps before")
    ap.add_argument("--monotone", action="store_true",
                    help="with --maxima: past the bound, fire only while the LR rose on each "
                    f"of the last {MONOTONE} steps (a ramp going on, not a step taken)")
    ap.add_argument("--rates", default=None,
                    help="sweep the clip rate (loss_clip_ramp's also_rate) instead, at the "
                    f"default factor and bound: e.g. 0.75,0.6,0.45 (default {RATE})")
    ap.add_argument("--show", action="store_true", help="name the runs gained and lost")
    ap.add_argument("--candidates", type=Path, default=None,
                    help="with --rates: write the runs to replay through the engine here, "
                    "one a line: those where a swept rate moves the first step the condition "
                    "holds, and the healthy and degraded runs that come to --near")
    ap.add_argument("--near", type=float, default=None,
                    help="with --candidates: the clip rate a healthy or degraded run must "
                    "reach where the rest holds to be a candidate (default: the lowest swept)")
    a = ap.parse_args(argv)
    sets = set(sets_of(a.split))
    files = sorted(SCENARIOS.glob("*.jsonl.gz"))
    with ProcessPoolExecutor(a.jobs) as ex:
        runs = [r for r in ex.map(fires, files, chunksize=16) if r[3] in sets]
    print(f"{len(runs)} runs of {a.split}")
    if a.rates:
        rates = [float(x) for x in a.rates.split(",")]
        if a.candidates is not None:
            names = candidates(runs, rates, min(rates) if a.near is None else a.near)
            a.candidates.write_text("".join(f"{n}\n" for n in names))
            print(f"{len(names)} candidates written to {a.candidates}")
        return _sweep_rates(runs, rates, a.show)
    if a.maxima:
        return _sweep_maxima(runs, [float(x) for x in a.maxima.split(",")], a.show,
                             a.climbing, a.monotone)
    runs = [(n, lab, d, sp, [(e[0], e[1]) for e in out if e[1] <= MAX and holds(e)])
            for n, lab, d, sp, out in runs]
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


def _sweep_maxima(runs: list[Any], maxima: list[float], show: bool,
                  climbing: float | None, monotone: bool = False) -> int:
    """Per upper bound on the LR ratio (``rising_max``; the factor at its default): the
    healthy and degraded runs that would fire, the diverging runs fired by their
    divergence, and against the default bound the diverging runs gained, fired earlier, and
    lost. ``climbing``: past the bound, a step counts while the LR is over ``climbing`` x
    its value :data:`SHORT` steps before (a ramp still going, not a step taken)."""
    print(f"{'max':>6} {'healthy':>8} {'degraded':>9} {'div caught':>11} {'gained':>7} "
          f"{'earlier':>8} {'lost':>5}")

    def first(out: list[Entry], top: float) -> int | None:
        return next((t for t, r, short, mono, *_ in out if DEFAULT < r and (
            r <= top or (climbing is not None and short > climbing)
            or (monotone and mono))), None)

    def pick(out: list[Entry], top: float) -> tuple[int | None, int | None]:
        out = [e for e in out if holds(e)]
        return first(out, top), next((t for t, r, *_ in out if DEFAULT < r <= MAX), None)
    for top in maxima:
        t = _tally(runs, lambda out, top=top: pick(out, top))
        print(f"{top:6g} {len(t['healthy']):8d} {len(t['degraded']):9d} {t['caught']:11d} "
              f"{len(t['gained']):7d} {len(t['earlier']):8d} {len(t['lost']):5d}")
        if show:
            for k in ("healthy", "gained", "earlier"):
                print(f"   {k}:", ", ".join(t[k]) or "-")
    return 0


def _tally(runs: list[Any], pick: Any) -> dict[str, Any]:
    """Against a baseline, over ``runs``: ``pick(out)`` gives a run's first step under the
    setting swept and under the baseline (None: never). The healthy runs that fire (marked
    ``(new)`` where the baseline does not), the degraded ones, the diverging runs fired by
    their divergence (``caught``), and those gained, fired earlier and lost."""
    t: dict[str, Any] = {"healthy": [], "degraded": [], "caught": 0, "gained": [],
                         "earlier": [], "lost": []}
    for name, label, div, _, out in runs:
        got, base = pick(out)
        if label == "healthy" and got is not None:
            t["healthy"].append(f"{name}@{got}" + ("" if base is not None else " (new)"))
        if label == "degraded" and got is not None:
            t["degraded"].append(name)
        if label == "diverging" and div is not None:
            now, before = got is not None and got <= div, base is not None and base <= div
            t["caught"] += now
            if now and not before:
                t["gained"].append(f"{name}@{got}/{div}")
            elif now and before and got < base:
                t["earlier"].append(f"{name}@{got}<{base}/{div}")
            elif before and not now:
                t["lost"].append(name)
    return t


def candidates(runs: list[Any], rates: list[float], near: float) -> list[str]:
    """The runs a clip-rate change must be replayed on: those where one of ``rates`` moves
    the first step the condition holds against :data:`RATE_BEFORE`, and the healthy and
    degraded runs whose clip rate reaches ``near`` where the rest of it holds."""
    names = []
    for name, label, _, _, entries in runs:
        before = first_at(entries, RATE_BEFORE)
        moved = any(first_at(entries, r) != before for r in rates)
        top = top_rate(entries)
        if moved or (label != "diverging" and top is not None and top >= near):
            names.append(name)
    return names


def _sweep_rates(runs: list[Any], rates: list[float], show: bool) -> int:
    """Per clip rate (``loss_clip_ramp``'s ``also_rate``; the LR factor and bound at the
    rules' defaults): the healthy and degraded runs that would fire, the diverging runs
    fired by their divergence, and against :data:`RATE_BEFORE` the diverging runs gained,
    fired earlier, and lost; then the healthy runs that come nearest (the highest clip rate
    each reaches on a step where the rest holds), of those that do not fire at
    :data:`RATE_BEFORE` already."""
    print(f"{'rate':>6} {'healthy':>8} {'degraded':>9} {'div caught':>11} {'gained':>7} "
          f"{'earlier':>8} {'lost':>5}")
    for rate in rates:
        t = _tally(runs, lambda out, rate=rate: (first_at(out, rate),
                                                 first_at(out, RATE_BEFORE)))
        print(f"{rate:6g} {len(t['healthy']):8d} {len(t['degraded']):9d} {t['caught']:11d} "
              f"{len(t['gained']):7d} {len(t['earlier']):8d} {len(t['lost']):5d}")
        if show:
            for k in ("healthy", "gained"):
                print(f"   {k}:", ", ".join(t[k]) or "-")
    near = sorted(((r, name) for name, label, _, _, out in runs
                   if label == "healthy" and first_at(out, RATE_BEFORE) is None
                   and (r := top_rate(out)) is not None), reverse=True)[:5]
    print("nearest healthy (clip rate where the rest holds):",
          ", ".join(f"{n} {r:g}" for r, n in near) or "-")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
