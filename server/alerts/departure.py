"""The ``departure`` rule kind: a series leaving its own recent range.

A sample departs when it (or, with ``smooth``, the median level of its last steps) is over
``factor`` x or ``margin`` above the median of a lagged window of the series' own past
(:func:`departure_limit`). Around that core: ``noise_z`` widens the limit by the noise of
the gap between the two medians; ``climb`` / ``slow_margin`` count a departure only while
the series is still climbing or once it is far out; ``fast_margin`` and its companions take
a ramp that runs away before the smoothed level arrives (the fast path, fed every step).
With ``below`` (and ``margin``) the rule judges the series falling out of its range: the
engine gives it the series mirrored (``-x``, :func:`mirrored`) and turns the verdict back
into the series' own values (:func:`unmirrored`), so every parameter reads as for a rise; a
non-finite value, which has no direction, it leaves to the upward rule and the
``nonfinite`` kind (one log Z overflow pages once, not twice).
Pure, as every detector (:mod:`.detectors`, which registers this kind).
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median
from typing import TYPE_CHECKING, Any

import numpy as np

from logitwatch.server.alerts.series import Memory, between, diff_noise, step_median, window
from logitwatch.server.alerts.tracks import FrameView, Verdict

if TYPE_CHECKING:
    from logitwatch.server.alerts.spec import RuleSpec

__all__ = ["departure", "departure_limit", "mirrored", "unmirrored"]


def departure(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
               cell: tuple[int | None, int | None]) -> Verdict | None:
    fast = _fast_series(r, m, step, v, fv)  # every call, before any return
    lag = int(r.param("lag"))
    past = window(m, step, lag, int(r.param("window")), int(r.param("min_samples")))
    first = m.first_step
    if (len(past) < int(r.param("min_samples")) or first is None
            or first > step - lag - int(r.param("min_history"))):
        return None
    weighted = bool(r.param("step_weighted"))
    base = step_median(past, step - lag) if weighted else median(x for _, x in past)
    limit = float(departure_limit(r, base))
    if not math.isfinite(v):
        m.extra.pop("fast_run", None)
        if r.param("below"):  # no direction: the upward rule and the nonfinite kind's
            return None
        return Verdict(True, v, {"value": str(v), "baseline": base, "limit": limit},
                       baseline=base, limit=limit)
    smooth = r.param("smooth")
    held_from = sample_breach = raw = None
    if smooth:  # judge the level (median of the last `smooth` steps), not one sample
        pts = [*window(m, step, 0, int(smooth), 2), (step, v)]
        raw, v = v, step_median(pts, step + 1) if weighted else median(x for _, x in pts)
        z = float(r.param("noise_z"))
        if z > 0:  # the level must clear the limit by the noise of the two medians' gap
            limit += z * _gap_noise(past, pts)
        sample_breach = raw > limit
        if v > limit and sample_breach:
            held_from = _breaching_since(m, step, limit)
    breach = v > limit
    running = None
    if fast is not None:
        if breach:
            m.extra.pop("fast_run", None)
        else:
            running = _running_away(r, m, fast, step, base, limit)
        if running is not None:  # the short level, a ramp under way (raw >= it > limit)
            v, breach, sample_breach = running[0], True, True
            held_from = _breaching_since(m, step, limit)
    if r.param("margin") is not None:
        how: dict[str, Any] = {"above_baseline": v - base}
    else:
        how = {"ratio": v / base if base else None}
    if running is not None:
        how["running_away"], how["climbed"] = True, running[1]
    elif breach and r.param("climb") is not None:
        breach, how["climbed"] = _still_climbing(r, m, step, v if raw is None else raw,
                                                 v - limit)
    return Verdict(breach, v, {"value": v, "baseline": base, "limit": limit, **how},
                   baseline=base, limit=limit, held_from=held_from,
                   sample_breach=sample_breach)


def _fast_series(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView
                 ) -> deque[tuple[int, float]] | None:
    """With ``fast_margin`` (and ``smooth`` and ``margin``): the samples of the rule's own
    series over the last ``climb_span + climb_window`` steps, kept in ``m.extra`` (breaching
    samples too, which the baseline's memory leaves out), and the ``fast_not_falling``
    series' beside it, both fed on every call; the own series, or None without the
    parameter. A job resumed from an earlier checkpoint replaces the steps it sends again."""
    if r.param("fast_margin") is None or not r.param("smooth") or r.param("margin") is None:
        return None
    keep = int(r.param("climb_span")) + int(r.param("climb_window")) + 1  # one per step
    own: deque[tuple[int, float]] = m.extra.setdefault("fast_own", deque(maxlen=keep))
    _keep(own, step, v, fv)
    guard = r.param("fast_not_falling")
    if guard:
        x = fv.get(str(guard))
        _keep(m.extra.setdefault("fast_guard", deque(maxlen=keep)), step,
              math.nan if x is None else x, fv)
    return own


def _keep(seen: deque[tuple[int, float]], step: int, x: float, fv: FrameView) -> None:
    """Append a finite ``x`` at ``step`` (the frame's shared tuple), dropping what ``seen``
    holds from ``step`` on (the steps a resumed job sends again)."""
    if not math.isfinite(x):
        return
    while seen and seen[-1][0] >= step:
        seen.pop()
    seen.append(fv.pair(step, x))


def _short_level(seen: deque[tuple[int, float]], end: int, w: int) -> float | None:
    """The median of ``seen``'s samples in the ``w`` steps up to ``end``; None with fewer
    than half of them (a job that sends no per-step history)."""
    pts = [x for s_, x in seen if end - w < s_ <= end]
    return median(pts) if len(pts) >= max(3, w // 2) else None


def _running_away(r: RuleSpec, m: Memory, own: deque[tuple[int, float]], step: int,
                  base: float, limit: float) -> tuple[float, float] | None:
    """With ``fast_margin``: the series' short level (median of its last ``climb_window``
    steps) and its rise over ``climb_span`` steps, when the series is running away, else
    None. It is when that level is over the limit and ``fast_margin`` or more over the
    baseline, it rose ``fast_climb`` or more in each half of the last ``climb_span`` steps,
    the newest sample is at or above it, and (with ``fast_not_falling``) the other series'
    short level did not fall more than ``fast_tolerance`` over those steps, all of it for
    ``fast_for`` steps in a row. A smoothed level lags a steady climb by half its ``smooth``
    steps. A stretch of garbage batches, which the long median is there for, lifts the
    series at once and holds it: its short level straddles the jump for a step or two, not
    ``fast_for`` in a row. Log Z also climbs when the model grows confident because it is
    right (a stretch of one repeated token: the loss falls to 0); a head running away grows
    overconfident and its loss does not improve. Unread (None) where any short level has
    fewer than half its steps' samples (no per-step history)."""
    span, w = int(r.param("climb_span")), int(r.param("climb_window"))
    half = span // 2
    level, middle, first = (_short_level(own, end, w) for end in (step, step - half,
                                                                  step - span))
    rise = float(r.param("fast_climb") or 0.0)
    ok = (own[-1][0] == step and level is not None and middle is not None
          and first is not None and level > limit
          and level - base >= float(r.param("fast_margin")) and own[-1][1] >= level
          and level - middle >= rise and middle - first >= rise and _not_falling(r, m, step))
    if not ok or level is None or first is None:
        # a run of qualifying steps ends (the smoothed level's breach ends it too)
        m.extra.pop("fast_run", None)
        return None
    since = m.extra.setdefault("fast_run", step)
    if step - since + 1 < int(r.param("fast_for")):
        return None
    return level, level - first


def _not_falling(r: RuleSpec, m: Memory, step: int) -> bool:
    """With ``fast_not_falling: <scalar>`` (the loss): whether that series' short level did
    not fall more than ``fast_tolerance`` (in its own units: nats for the loss) over the last
    ``climb_span`` steps; True without the parameter, False while it cannot be read (the
    fast path then waits for the smoothed level, as without ``fast_margin``)."""
    if not r.param("fast_not_falling"):
        return True
    seen = m.extra.get("fast_guard")
    w, span = int(r.param("climb_window")), int(r.param("climb_span"))
    now = _short_level(seen, step, w) if seen else None
    then = _short_level(seen, step - span, w) if seen else None
    if now is None or then is None:
        return False
    return now - then >= -float(r.param("fast_tolerance") or 0.0)


def _still_climbing(r: RuleSpec, m: Memory, step: int, raw: float, over: float
                    ) -> tuple[bool, float | None]:
    """With ``climb``: whether a departure ``over`` its limit counts. It does while the
    series' short level (median of its last ``climb_window`` steps) rose at least ``climb``
    over the last ``climb_span`` steps (a drift running away), or once it is past the limit
    by ``slow_margin - margin`` (the level ``slow_margin`` over the baseline, plus what
    ``noise_z`` adds): a slow drift must go further, since a healthy run's log Z can creep a
    nat over a few hundred steps and stop. The baseline follows a departure that does not
    count, so a steady drift counts from about ``slow_margin / (lag + window/2 -
    smooth/2)`` per step (from ``margin / ...`` without ``climb``). Where either short level
    has fewer than half its steps' samples (a job that sends no per-step history) the rise
    cannot be read and the departure counts, as without ``climb``. Returns that, and the
    rise (None when unread)."""
    span, w = int(r.param("climb_span")), int(r.param("climb_window"))
    need = max(3, w // 2)
    now = [x for _, x in between(m.recent, step - w + 1, step)] + [raw]
    then = [x for _, x in between(m.recent, step - span - w + 1, step - span + 1)]
    if len(now) < need or len(then) < need:
        return True, None
    climbed = median(now) - median(then)
    slow = r.param("slow_margin")
    far = slow is not None and over >= float(slow) - float(r.param("margin") or 0.0)
    return climbed >= float(r.param("climb")) or far, climbed


def _gap_noise(base: list[tuple[int, float]], level: list[tuple[int, float]]) -> float:
    """The standard error of (level median - baseline median) for samples with the
    per-sample noise of this series: sigma x sqrt(1/n_base + 1/n_level), sigma from the
    MAD of successive differences (a slow drift hardly moves it). With one sample a step
    it is a few hundredths of sigma; at one sample in 50 steps (5 baseline samples, 2 in
    the level) most of sigma: fewer samples, a wider gap before the same departure
    counts."""
    xs = [x for _, x in sorted({*base, *level})]
    if len(xs) < 4:
        return 0.0
    return diff_noise(xs) * math.sqrt(1.0 / len(base) + 1.0 / len(level))


def _breaching_since(m: Memory, step: int, limit: float) -> int:
    """The first step of the newest run of samples above ``limit`` (the one at ``step``
    breaches; the samples before it are in ``m.recent``)."""
    since = step
    for s, x in reversed(m.recent):
        if s >= step:
            continue
        if not x > limit:
            break
        since = s
    return since


def departure_limit(r: RuleSpec, base: Any) -> Any:
    """A departure's limit from its baseline (a float or an array of them): ``factor`` x
    the baseline, or with ``margin`` set the baseline + ``margin`` (for a series that is
    already a logarithm, such as log Z, where a fixed distance is a fixed ratio of the
    underlying quantity); at least ``floor`` (none: null), at most ``ceiling``."""
    margin = r.param("margin")
    floor = r.param("floor")
    if margin is not None:
        limit = base + float(margin)
    else:
        limit = float(r.param("factor")) * base
    if floor is not None:
        limit = np.maximum(float(floor), limit)
    if r.param("ceiling") is not None:
        limit = np.minimum(limit, float(r.param("ceiling")))
    return limit


def mirrored(r: RuleSpec) -> bool:
    """Whether ``r`` is a departure judged downwards (``below``): the engine gives it, and
    keeps in its memory, the series mirrored (``-x``)."""
    return r.kind == "departure" and bool(r.param("below"))


def unmirrored(v: Verdict) -> Verdict:
    """A verdict of a mirrored departure in the series' own values: value, baseline and
    limit negated back; the evidence's distance under the baseline as ``below_baseline``
    and its level's fall as ``fell`` (both positive, as they were judged). A mirrored rule
    judges finite values only (:func:`departure`), so every number here is a float."""
    ev = dict(v.evidence)
    for k in ("value", "baseline", "limit"):
        if k in ev:
            ev[k] = -ev[k]
    if "above_baseline" in ev:
        ev["below_baseline"] = ev.pop("above_baseline")
    if "climbed" in ev:
        ev["fell"] = ev.pop("climbed")
    return Verdict(v.breach, -v.value, ev,
                   baseline=None if v.baseline is None else -v.baseline,
                   limit=None if v.limit is None else -v.limit, left_step=v.left_step,
                   held_from=v.held_from, sample_breach=v.sample_breach)
