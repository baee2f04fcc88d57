"""Detectors of a run's scalars (one value per step): spikes and loss jumps against a robust
recent range, a level rising above the lowest it settled to, the learning rate's jumps and
peak, and the clip rate. Pure, as every detector (:mod:`.detectors` registers them as rule
kinds): no clock, no I/O, a cell's :class:`~.series.Memory` and the frame in hand.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median
from typing import TYPE_CHECKING, Any

from logitwatch.server.alerts.series import (
    SCALAR_KEEP,
    Memory,
    Samples,
    between,
    diff_noise,
    last_at_or_before,
    mad,
    window,
)
from logitwatch.server.alerts.tracks import FrameView, Verdict

if TYPE_CHECKING:
    from logitwatch.server.alerts.spec import RuleSpec


def _center_and_scale(r: RuleSpec, vals: list[float]) -> tuple[float, float]:
    """The robust center and scale a ``spike`` (or ``loss_jump``) judges a value against.

    By default the median and MAD of the window's values. With ``center_window: n`` the
    center is the median of the newest ``n`` values only, and with ``noise: diff`` the scale
    is the MAD of successive differences (divided by sqrt 2): a series still falling (a loss
    early in training) has a wide spread of values but small step-to-step noise, and a
    window's median taken while it falls sits above where it is now, so a jump out of its
    current level would hide behind its own descent."""
    n = r.param("center_window")
    med = median(vals[-int(n):]) if n else median(vals)
    if r.param("noise") == "diff" and len(vals) >= 3:
        noise = diff_noise(vals)
    else:
        noise = mad(vals, median(vals)) * 1.4826
    return med, max(noise, float(r.param("min_scale")))


def spike(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
           cell: tuple[int | None, int | None]) -> Verdict | None:
    """The value's robust z against its recent range (:func:`_center_and_scale`); no verdict
    before the series has ``min_history`` steps behind it (its first sample included), as
    :func:`~.departure.departure`: a recent range of a few warm-up steps is no range."""
    history = int(r.param("min_history"))
    if history and (m.first_step is None or m.first_step > step - history):
        return None
    past = window(m, step, 0, int(r.param("window")), int(r.param("min_samples")))
    if len(past) < int(r.param("min_samples")):
        return None
    vals = [x for _, x in past]
    med, spread = _center_and_scale(r, vals)
    if not math.isfinite(v):
        return Verdict(True, v, {"value": str(v), "median": med, "mad": spread},
                       baseline=med)
    z = (v - med) / spread
    # the absolute jump is taken over the higher of the two centers: after a stretch of
    # trivially easy batches (zero bytes: loss near 0) the newest values sit far below the
    # run's level, and a return to that level is no jump
    level = max(med, median(vals)) if r.param("center_window") else med
    breach = z > float(r.param("z")) and v - level > float(r.param("min_jump"))
    if breach and r.param("only_unclipped") and _clip_bounded(fv, v):
        breach = False
    ev: dict[str, Any] = {"value": v, "median": med, "robust_z": z, "scale": spread}
    if level != med:
        ev["level"] = level  # the window's median, above the newest values' (see above)
    return Verdict(breach, v, ev, baseline=med, limit=med + float(r.param("z")) * spread)


def _clip_bounded(fv: FrameView, g: float) -> bool:
    """Whether clipping bounded the update of this frame's step, whose gradient norm is
    ``g``: the step was clipped, or ``g`` is just under the job's own clip threshold (a norm
    it allows, bounded by the same threshold as a clipped step; a threshold 10x above the
    norm, e.g. 1e9 for "no clipping", bounds nothing)."""
    if (fv.get("grad.clipped") or 0.0) >= 0.5:
        return True
    bound = fv.get("grad.max_norm")
    return bound is not None and math.isfinite(bound) and bound / 10 <= g <= bound


#: steps after one bad batch that its kick may still move the loss and the gradient: a loss
#: jump within this many steps of the last continues a run of jumps
_AFTERSHOCK = 2


def loss_jump(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
               cell: tuple[int | None, int | None]) -> Verdict | None:
    """A :func:`spike` of the loss, its breach carrying what the page policy weighs: the
    gradient's ``precursor`` (its highest in the ``precursor_steps`` steps before, over its
    calm median; 0 when the breach stays under an earlier jump of its run, or of the last
    ``precursor_wake`` steps), its ``aftershock`` (on a step just after a run of jumps
    began, the loss still ``aftershock_loss`` nats over its median; not under an ``adaptive``
    optimizer unless ``aftershock_adaptive``), its ``climb`` (nats over the earlier jumps
    of its run, and an earlier, higher one in its wake; only on a run's later steps), whether the
    step went ``unclipped``, and the ``causes`` seen (an LR change, a gradient jump)."""
    if not math.isfinite(v):
        return None  # a non-finite loss is the nonfinite rule's
    out = spike(r, m, step, v, fv, cell)
    lr, prev_lr = fv.get("lr"), m.extra.get("lr")
    g = fv.get("grad.norm")
    grads: deque[tuple[int, float]] = m.extra.setdefault("grads", Samples(maxlen=SCALAR_KEEP))
    span = int(r.param("window"))
    recent_g = [x for _, x in between(grads, step - span)]
    gmed = median(recent_g) if recent_g else None
    if lr is not None and math.isfinite(lr):
        m.extra["lr"] = lr
    kind = fv.get("optim.adaptive")  # sent with the sampled frames, not each step's history
    if kind is not None:
        m.extra["adaptive"] = kind == 1.0
    pre = int(r.param("precursor_steps"))
    # every step's gradient norm, the jumping steps' too (``grads`` keeps the calm ones)
    every: deque[tuple[int, float]] = m.extra.setdefault("every_grad", deque(maxlen=pre + 1))
    if g is not None and math.isfinite(g) and pre:
        every.append(fv.pair(step, g))
    if out is None or not out.breach:
        if g is not None and math.isfinite(g):
            grads.append(fv.pair(step, g))
        return out
    ev = dict(out.evidence)
    # a run of jumps: each jump within _AFTERSHOCK steps of the last continues it
    last = m.extra.get("jump_at")
    start = (m.extra["jump_from"] if last is not None and step - last <= _AFTERSHOCK
             else step)
    top = m.extra.get("jump_top", -math.inf) if start < step else -math.inf
    m.extra.update(jump_at=step, jump_from=start, jump_top=max(top, v))
    # the wake of an earlier, higher jump (round thirteen): within ``precursor_wake`` steps
    # of it the new high is judged against it too. A garbage batch's kick leaves the
    # gradient 2-5x up while the weights heal, and the loss jumps again, far under the kick
    wake = int(r.param("precursor_wake"))
    if wake:
        wakes: deque[tuple[int, float]] = m.extra.setdefault("wake",
                                                             deque(maxlen=SCALAR_KEEP))
        while wakes and wakes[0][0] < step - wake:
            wakes.popleft()
        top = max([top, *(x for s, x in wakes if s < start)])
        wakes.append(fv.pair(step, v))
    if start < step and math.isfinite(top):
        # how far this jump climbs over the run's earlier jumps (and a higher one in its
        # wake): a blow-up is still up on its next steps and climbs past them, a garbage
        # stretch's loss wanders under its first kick
        ev["climb"] = v - top
    if pre and gmed:
        # the gradient at its highest in the steps before this jump, over its calm median:
        # an instability building up shows there, a garbage batch comes out of the blue.
        # The run's first step and the _AFTERSHOCK steps after it are left out: one bad
        # batch's kick and aftershock must not be its own precursor, while a loss that
        # stays out of range longer and jumps again may be, when it climbs to a new high
        # for the run (a garbage stretch's loss wanders below its first kick, its gradient
        # up with it; a blow-up climbs past it)
        before = [x for s, x in every
                  if step - pre <= s < step and not start <= s <= start + _AFTERSHOCK]
        if before:
            ev["precursor"] = max(before) / gmed if v > top else 0.0
        # the update just before this jump (round twenty): its gradient over the calm median
        went = [x for s, x in every if s == step - 1]
        if went:
            ev["went_in"] = went[0] / gmed
    adaptive = bool(m.extra.get("adaptive", False))
    if adaptive:
        ev["adaptive"] = True
    still = v - out.baseline if out.baseline is not None else math.inf
    if gmed and start < step <= start + _AFTERSHOCK and g is not None and math.isfinite(g) \
            and (bool(r.param("aftershock_adaptive")) or not adaptive) \
            and still >= float(r.param("aftershock_loss")):
        # the loss still out of range on the batches after the kick, and the gradient on
        # them over its calm median: a bad batch the run shrugs off leaves a modest one; an
        # update that damaged the weights leaves the next clean batch's gradient far up.
        # Unless ``aftershock_adaptive``, not under an adaptive optimizer (the job's
        # ``optim.adaptive``, round fourteen): its step is normalised by the gradient's
        # running RMS, so a kick's update is bounded, and its garbage batches heal. With
        # ``aftershock_loss``, only while this batch's loss is still that many nats over its
        # median (round fifteen): a batch the weights read as well as before costs a
        # fraction of the kick, one they no longer fit keeps most of it
        ev["aftershock"] = g / gmed
        ev["aftershock_loss"] = still
    if g is not None and math.isfinite(g):
        ev["unclipped"] = not _clip_bounded(fv, g)  # this step's update went in unbounded
    causes: list[str] = []
    # logs of each (a negative LR, or a ratio that underflows to 0, made log() raise)
    if (lr is not None and prev_lr is not None and lr > 0 and prev_lr > 0
            and abs(math.log(lr) - math.log(prev_lr)) > math.log(1.5)):
        causes.append(f"the learning rate changed from {prev_lr:.3g} to {lr:.3g}")
    if g is not None and gmed and (not math.isfinite(g) or g > 5 * gmed):
        causes.append(f"the gradient norm jumped to {g:.3g} (median {gmed:.3g})")
    ev["causes"] = causes
    return Verdict(True, v, ev, out.baseline, out.limit)


def level_rise(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
                cell: tuple[int | None, int | None]) -> Verdict | None:
    """The series' level (median of its last ``window`` steps) against the lowest level it
    has settled to (lowest since ``min_history`` steps into the series)."""
    if not math.isfinite(v):
        return None
    n = int(r.param("min_samples"))
    pts = [*window(m, step, 0, int(r.param("window")), n - 1), (step, v)]
    first = m.first_step
    if len(pts) < n or first is None:
        return None
    level = median(x for _, x in pts)
    rising = _still_rising(r, m, step, fv)
    also = _also_level(r, m, step, fv)  # (both track their series from the first frame)
    if step - first < int(r.param("min_history")):
        return None  # early training: not settled yet
    settled = _low_level(r, m, step, v, level)
    if settled <= 0 and r.param("margin") is None:
        # a level of nothing (a stretch of all-zero batches: no gradient at all) is no
        # lowest a rise can be a multiple of: every later level would be "x inf"
        settled = math.inf
    low = min(m.extra.get("low", math.inf), settled)
    if not math.isfinite(low):
        return None
    m.extra["low"] = low
    if r.param("margin") is not None:
        margin = float(r.param("margin"))
        how: dict[str, Any] = {"above_lowest": level - low}
        if r.param("noise_margin") is not None and level >= low + margin:
            # only where it can matter: a median of 100 differences, not on every step
            noise = _step_noise(m, step, v, int(r.param("noise_window")))
            if noise is not None:
                k = float(r.param("noise_margin"))
                margin = max(margin, k * noise)
                how |= {"noise": noise, "noise_margin": k, "margin": margin}
        limit = low + margin
    else:
        limit = low * float(r.param("factor"))
        how = {"ratio": level / low if low > 0 else None}
    limit = max(limit, float(r.param("floor")))
    if rising is not None:
        how["while_rising"] = r.param("while_rising")
        how[f"{r.param('while_rising')}_ratio"] = rising
    top = r.param("rising_max")  # a climb, not a jump: an LR stepped x10 has lr_jump
    ramping = (rising is not None and top is not None and rising > float(top)
               and r.param("ramp_steps") is not None
               and _ramping(m, step, int(r.param("ramp_steps"))))
    if ramping:
        how["ramping"] = True
    breach = level >= limit and (rising is None or (
        rising > float(r.param("rising_factor"))
        and (top is None or rising <= float(top) or ramping)))
    if r.param("climb_factor") is not None and breach:
        climb = _climb(r, m, step, level)
        how["climb"] = climb
        breach = climb is not None and min(climb) >= float(r.param("climb_factor"))
    if also is not None:
        rate = r.param("also_rate")
        how[f"{r.param('also_metric')}_{'rate' if rate is not None else 'ratio'}"] = also
        breach = breach and also >= float(rate if rate is not None else r.param("also_factor"))
    return Verdict(breach, level,
                   {"level": level, "lowest_level": low, "limit": limit, "value": v,
                    "window": int(r.param("window")), **how},
                   baseline=low, limit=limit)


def _low_level(r: RuleSpec, m: Memory, step: int, v: float, level: float) -> float:
    """The level a new lowest is judged from: the rule's own ``level``, or with ``low_window:
    n`` (n > 0) the median of the series' last n steps: a short window reads a rise quickly,
    a long one settles the lowest it is a multiple of, which a few dozen steps of small
    values (a stretch of bad batches) do not pull down."""
    span = int(r.param("low_window"))
    if span <= 0:
        return level
    pts = [x for _, x in window(m, step, 0, span, int(r.param("min_samples")) - 1)]
    return median([*pts, v])


def _climb(r: RuleSpec, m: Memory, step: int, level: float) -> list[float] | None:
    """With ``climb_factor``: the level's rise over each of its last ``climbs`` spans of
    ``climb_span`` steps, newest first (the level now over the level ``climb_span`` steps
    before, that one over the level ``climb_span`` steps before it, ...); None while one of
    those earlier levels is unknown or not above 0. A level still climbing, span after span,
    is a growth feeding itself; one that jumped and holds (a stretch of bad batches) rose
    in one span only."""
    span, w = int(r.param("climb_span")), int(r.param("window"))
    n = int(r.param("min_samples"))
    levels = [level]
    for k in range(1, int(r.param("climbs")) + 1):
        pts = window(m, step + 1, k * span, w, n)  # the w steps up to step - k * span
        if len(pts) < n:
            return None
        levels.append(median(x for _, x in pts))
    if min(levels[1:]) <= 0:
        return None
    return [a / b for a, b in zip(levels, levels[1:], strict=False)]


def _step_noise(m: Memory, step: int, v: float, span: int) -> float | None:
    """The series' step-to-step noise (:func:`~.series.diff_noise`) over its last ``span``
    steps, or its newest 10 samples when those steps hold fewer (a job sending no per-step
    history, sampled every few dozen steps); None with fewer than 10 values. A loss's batch
    noise: about 0.2 nat on a 4,096-token vocabulary, a tenth of one on bytes."""
    vals = [x for _, x in window(m, step, 0, span, NOISE_SAMPLES - 1) if math.isfinite(x)]
    vals.append(v)
    return diff_noise(vals) if len(vals) >= NOISE_SAMPLES else None


#: the fewest values a step-to-step noise is read from (``noise_margin``)
NOISE_SAMPLES = 10


def _other_series(m: Memory, key: str, fv: FrameView, name: str, step: int
                  ) -> deque[tuple[int, float]]:
    """The ``(step, value)`` samples of another scalar ``name`` a rule reads beside its own
    series, kept in ``m.extra[key]``, with this frame's value (when finite) appended."""
    seen: deque[tuple[int, float]] = m.extra.setdefault(key, Samples(maxlen=SCALAR_KEEP))
    x = fv.get(name)
    if x is not None and math.isfinite(x) and (not seen or step > seen[-1][0]):
        seen.append(fv.pair(step, x))
    return seen


def _also_level(r: RuleSpec, m: Memory, step: int, fv: FrameView) -> float | None:
    """With ``also_metric: <scalar>`` (e.g. ``grad.norm``): that scalar's level (median of
    its last ``also_window`` steps) over the lowest level it settled to (from
    ``also_min_history`` steps into it), for a rise that must be corroborated by another
    series' rise; 0.0 while unknown (or this frame does not carry it); None without the
    parameter. With ``also_rate``, that scalar's mean over its last ``also_window`` steps
    instead (a rate of a 0/1 flag, compared with ``also_rate``)."""
    name = r.param("also_metric")
    if not name:
        return None
    seen = _other_series(m, "also", fv, str(name), step)
    span = int(r.param("also_window"))
    if r.param("also_rate") is not None:
        # ``also_rate``: the mean over the last ``also_window`` steps of a 0/1 series
        # (``grad.clipped``: the share of those steps that were clipped), once it spans them
        if not seen or seen[-1][0] != step or step - seen[0][0] < span - 1:
            return 0.0
        inside = [v for _, v in between(seen, step - span + 1)]
        return sum(inside) / len(inside)
    if not seen or seen[-1][0] != step or step - seen[0][0] < int(r.param("also_min_history")):
        return 0.0
    level = median(v for _, v in between(seen, step - span + 1))
    low = min(m.extra.get("also_low", math.inf), level)
    m.extra["also_low"] = low
    return level / low if low > 0 else 0.0


def _still_rising(r: RuleSpec, m: Memory, step: int, fv: FrameView) -> float | None:
    """With ``while_rising: <scalar>`` (e.g. ``lr``): that scalar now over its value
    ``rising_span`` steps ago (0.0 while unknown); None without the parameter."""
    name = r.param("while_rising")
    if not name:
        return None
    seen = _other_series(m, "rising", fv, str(name), step)
    span = int(r.param("rising_span"))
    if name == "lr" and _backing_off(m, fv, step, span):
        return 0.0

    before = last_at_or_before(seen, step - span)
    if before is None or not seen or seen[-1][0] != step or before[1] <= 0:
        return 0.0
    return seen[-1][1] / before[1]


def _ramping(m: Memory, step: int, n: int) -> bool:
    """Whether the ``while_rising`` scalar (the LR) rose on each of its last ``n`` steps
    (samples, for a job that sends no per-step history): a ramp still going on, not a step
    taken and held, which a climb past ``rising_max`` over ``rising_span`` cannot tell."""
    seen = m.extra.get("rising")
    if not seen or len(seen) < n + 1 or seen[-1][0] != step:
        return False
    last = [seen[i] for i in range(-(n + 1), 0)]
    return all(b[1] > a[1] for a, b in zip(last, last[1:], strict=False))


#: the scalar a job's LR backoff fuse sends: the multiplier on the schedule's LR (1: none)
BACKOFF = "fuse.lr_backoff.multiplier"


def _backing_off(m: Memory, fv: FrameView, step: int, span: int) -> bool:
    """Whether the LR's climb over the last ``span`` steps may be the job's LR backoff fuse
    bringing the LR back to its schedule, not the schedule climbing: a frame said the
    multiplier was below 1 within ``span`` steps. Such a climb is no warm-up, and a loss
    still up from whatever triggered the backoff would read as one ramping too far (and
    page, and trigger the backoff again). Steps between sampled frames (every step's
    scalars) carry no multiplier: the last sampled frame's word holds."""
    x = fv.get(BACKOFF)
    if x is not None and math.isfinite(x) and x < 1.0:
        m.extra["backoff_step"] = step
    last = m.extra.get("backoff_step")
    return last is not None and 0 <= step - last <= span


def above_peak(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
                cell: tuple[int | None, int | None]) -> Verdict | None:
    """The value against the peak the series settled at: the highest value before it went
    ``settle`` steps without a new high (a learning rate after its warm-up)."""
    if not math.isfinite(v):
        return None
    ex = m.extra
    if "high" not in ex or v > ex["high"]:
        ex["high"], ex["high_step"] = v, step
    elif step - ex["high_step"] >= int(r.param("settle")) and "settled" not in ex:
        ex["settled"], ex["settled_step"] = ex["high"], step
    peak = ex.get("settled")
    if peak is None or peak <= 0:
        return None  # still rising (a warm-up): nothing settled to compare with
    limit = float(r.param("factor")) * peak
    return Verdict(v > limit, v, {"value": v, "settled_peak": peak, "limit": limit,
                                  "ratio": v / peak, "settled_at_step": ex["settled_step"]},
                   baseline=peak, limit=limit)


#: the newest samples :func:`lr_jump` reads (its kind keeps no more)
LR_JUMP_READS = 4


def lr_jump(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
             cell: tuple[int | None, int | None]) -> Verdict | None:
    past = [m.recent[i][1] for i in range(-min(LR_JUMP_READS, len(m.recent)), 0)]
    if len(past) < 3 or not math.isfinite(v):
        return None  # three samples first: a warm-up's start is a ramp, not a jump
    prev = past[-1]
    if prev <= 0 or v <= 0:
        return None
    ratio = v / prev
    f = float(r.param("factor"))
    steps = median(abs(b - a) for a, b in zip(past, past[1:], strict=False))
    abrupt = abs(v - prev) > float(r.param("vs_schedule")) * max(steps, 1e-12)
    return Verdict((ratio > f or ratio < 1 / f) and abrupt, v,
                   {"value": v, "previous": prev, "previous_step": m.recent[-1][0],
                    "ratio": ratio, "schedule_step": steps}, baseline=prev)


def clip_rate(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
               cell: tuple[int | None, int | None]) -> Verdict | None:
    w = int(r.param("window"))
    n = int(r.param("min_samples"))
    tail = [(step, v)] if math.isfinite(v) else []  # this frame's, after the memory's
    now = [x for s, x in [*between(m.recent, step - w + 1), *tail] if s > step - w]
    before = [x for s, x in [*between(m.recent, step - 2 * w + 1, step - w + 1), *tail]
              if step - 2 * w < s <= step - w]
    first = m.first_step
    if len(now) < n or len(before) < n or first is None or first > step - 2 * w + 1:
        return None
    rate, prev = sum(now) / len(now), sum(before) / len(before)
    breach = rate >= float(r.param("rate")) and rate - prev >= float(r.param("rise"))
    return Verdict(breach, rate, {"clip_rate": rate, "previous_rate": prev, "window": w})
