"""The recorded scenarios' labels, measured on every step's loss, never by a detector under
test (the rules: ``record_scenarios.py``'s docstring and docs/ALERTS.md, *Labels*).

``diverging`` (a final excursion that never recovers, dated at its first step), ``degraded``
(no such excursion, but the run ends a quarter nat above its best) or ``healthy``; a
scenario's injected bad batches are cut out of the loss stream first (:func:`own_means`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

DIVERGENCE_WINDOW = 10
DIVERGENCE_JUMP = 1.0  # nats above the lowest earlier 10-step mean
RECOVERY = 0.5  # back within this many nats of that best: the excursion recovered
DEGRADED_WINDOW = 100
DEGRADED_NATS = 0.25
STOP_NONFINITE = 10  # stop after this many non-finite losses in a row
STOP_DIVERGED = 100  # stop this many steps after a divergence that has not recovered


def window_means(losses: list[float], window: int = DIVERGENCE_WINDOW) -> list[float]:
    """The mean of the ``window`` losses ending at each step: NaN before the first full
    window and wherever the window holds a non-finite loss."""
    out = [math.nan] * len(losses)
    total, bad = 0.0, 0
    for i, x in enumerate(losses):
        if math.isfinite(x):
            total += x
        else:
            bad += 1
        if i >= window:
            old = losses[i - window]
            if math.isfinite(old):
                total -= old
            else:
                bad -= 1
        if i + 1 >= window and bad == 0:
            out[i] = total / window
    return out


def excursions(losses: list[float], ignore: Collection[int] = ()
               ) -> tuple[int | None, list[list[int]]]:
    """``(divergence_step, bumps)`` (the rules: ``record_scenarios.py``): the first step of
    the final excursion that never recovers (None: none), and every excursion that
    recovered, as ``[start, end]`` (end: the first step whose 10-step mean is back within
    :data:`RECOVERY` nat of the best before the start).

    ``ignore``: steps whose batches were not the run's data (a scenario's injected bad
    batches). They are cut out of the loss stream before the 10-step means are taken
    (:func:`own_means`): a garbage batch's loss measures the garbage, not the model, so it
    neither sets the best (zero-byte batches are trivially predictable, and a best taken
    there made the clean data that followed look like a divergence) nor opens or closes an
    excursion (random tokens cost 10-14 nats on any model). A non-finite loss opens one
    wherever it is."""
    means = own_means(losses, ignore)
    best = math.inf
    bumps: list[list[int]] = []
    i, n = 0, len(losses)
    while i < n:
        m = means[i]
        if not math.isfinite(losses[i]) or (math.isfinite(m) and m > best + DIVERGENCE_JUMP):
            limit = best + RECOVERY
            end = next((j for j in range(i + 1, n) if means[j] <= limit), None)
            if end is None:
                return i, bumps
            bumps.append([i, end])
            best = min([best, *(v for v in means[i:end + 1] if math.isfinite(v))])
            i = end + 1
            continue
        if math.isfinite(m):
            best = min(best, m)
        i += 1
    return None, bumps


def own_means(losses: list[float], ignore: Collection[int] = (),
              window: int = DIVERGENCE_WINDOW) -> list[float]:
    """Per step, the mean of the run's own last ``window`` losses: the loss stream with the
    steps of ``ignore`` cut out, averaged as :func:`window_means` does; NaN at a step of
    ``ignore`` (it has no mean of its own), before the first full window and wherever the
    window holds a non-finite loss. With nothing to ignore: :func:`window_means`."""
    if not ignore:
        return window_means(losses, window)
    own = [i for i in range(len(losses)) if i not in ignore]
    out = [math.nan] * len(losses)
    for i, m in zip(own, window_means([losses[i] for i in own], window), strict=True):
        out[i] = m
    return out


def injected_steps(spec: Any) -> set[int]:
    """The steps of a spec (a RunSpec or its dict) that trained on injected bad batches."""
    bad = spec.get("bad_data", ()) if isinstance(spec, dict) else spec.bad_data
    return {s for start, end, _ in bad for s in range(int(start), int(end))}


def divergence_step(losses: list[float], ignore: Collection[int] = ()) -> int | None:
    """The first step of the final excursion that never recovers, or None."""
    return excursions(losses, ignore)[0]


def regression(losses: list[float], window: int = DEGRADED_WINDOW,
               ignore: Collection[int] = ()) -> float:
    """How far (nats) the mean of the run's own last ``window`` losses is above the lowest
    such mean of the run, the steps of ``ignore`` cut out first (:func:`own_means`: a
    garbage stretch inside the last window does not lift the run's final level); 0.0 for a
    run with fewer own losses than ``window`` or with a non-finite loss."""
    if not all(math.isfinite(x) for x in losses):
        return 0.0
    means = [m for m in own_means(losses, ignore, window) if math.isfinite(m)]
    return means[-1] - min(means) if means else 0.0


def label(losses: list[float], ignore: Collection[int] = ()) -> str:
    """``diverging``, ``degraded`` or ``healthy`` (the rules: ``record_scenarios.py``)."""
    if divergence_step(losses, ignore) is not None:
        return "diverging"
    return "degraded" if regression(losses, ignore=ignore) >= DEGRADED_NATS else "healthy"


def stop_reason(losses: list[float], ignore: Collection[int] = ()) -> str | None:
    """Why training should stop after these losses (None: go on)."""
    n = len(losses)
    if n >= STOP_NONFINITE and not any(math.isfinite(x) for x in losses[-STOP_NONFINITE:]):
        return "nonfinite"
    if n % 10 == 0:  # the check walks the run: every 10 steps is soon enough
        div = divergence_step(losses, ignore)
        if div is not None and n - 1 - div >= STOP_DIVERGED:
            return "diverged"
    return None
