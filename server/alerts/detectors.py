"""How each rule kind judges one sample of one cell.

Everything here is pure: no clock, no I/O, no database. A *detector* (one per rule kind)
looks at one series cell (a scalar, one layer/head of a per-head metric, or the max over
all heads) one sample at a time, with a small :class:`~.series.Memory` of that cell's past,
and returns a :class:`~.tracks.Verdict` (breach or not, plus evidence) or ``None`` when it
cannot judge yet (no data, too little history). The memory and its windows (in steps) live
in :mod:`.series`, the lifecycle (:class:`~.tracks.Track`) in :mod:`.tracks`. The kinds that
judge a run's per-step scalars (spikes, loss jumps, level rises, the LR, the clip rate) live in
:mod:`.scalar_kinds`, the ``departure`` kind (a series leaving its own recent range) in
:mod:`.departure`, the ``collapse`` kind (the attention wiped) in :mod:`.collapse`; this
module keeps the other attention and logit kinds and registers every kind in :data:`KINDS`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING, Any

from logitwatch.server.alerts.collapse import COLLAPSE_KEEP, collapse

# re-exported: the engine, the screens and the rule spec import them from here
from logitwatch.server.alerts.departure import departure, departure_limit  # noqa: F401
from logitwatch.server.alerts.scalar_kinds import (
    LR_JUMP_READS,
    above_peak,
    clip_rate,
    level_rise,
    loss_jump,
    lr_jump,
    spike,
)
from logitwatch.server.alerts.series import (  # noqa: F401
    EARLY_MAX,
    RECENT_MAX,
    SCALAR_KEEP,
    Memory,
    diff_noise,
    first_window,
    kendall_tau,
    mad,
    step_median,
    theil_sen,
    window,
)
from logitwatch.server.alerts.tracks import (  # noqa: F401
    FIRED_KEEP,
    FrameView,
    State,
    Track,
    Transition,
    Verdict,
)

if TYPE_CHECKING:
    from logitwatch.server.alerts.spec import RuleSpec

__all__ = ["DETECTORS", "KINDS", "FrameView", "Kind", "Memory", "State", "Track", "Transition",
           "Verdict", "kendall_tau", "mad", "theil_sen", "window"]

FP16_MAX = 65504.0

# -- detectors ----------------------------------------------------------------------------------

Detect = Callable[["RuleSpec", Memory, int, float, FrameView, tuple[int | None, int | None]],
                  "Verdict | None"]


@dataclass(frozen=True)
class Kind:
    """A rule kind: its detector, parameter defaults, whether breaching samples are kept
    out of the cell's memory (so a climb cannot become its own baseline), and its default
    hold in steps (``RuleSpec.keep_firing_for``): how long its condition must stay clear
    before a firing alert resolves. ``keep``: how many of a run-level cell's newest samples
    its detector reads (``Memory.recent``; None: :data:`SCALAR_KEEP`, for the kinds that read
    windows). A kind that judges each value alone (or keeps what it needs in
    ``Memory.extra``) keeps one, not a thousand copies of a series another rule keeps.
    ``every_frame``: judged on every sampled frame's own per-head matrix (a rule over the
    max or min of all heads: one value a frame), not on the fold the engine judges other
    per-head rules on at most once every ``head_every`` steps, whose max would hide a fall."""

    detect: Detect
    defaults: Mapping[str, Any]
    hold_breaches: bool = False
    keep_firing_for: int = 100
    keep: int | None = None
    every_frame: bool = False


def _threshold(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
               cell: tuple[int | None, int | None]) -> Verdict | None:
    if not math.isfinite(v):
        return None
    limit = float(r.param("value"))
    breach = v < limit if r.param("op") == "<" else v > limit
    return Verdict(breach, v, {"value": v, "limit": limit, "op": r.param("op")}, limit=limit)


def _nonfinite(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
               cell: tuple[int | None, int | None]) -> Verdict | None:
    return Verdict(not math.isfinite(v), v, {"value": str(v)})


def _early_base(r: RuleSpec, m: Memory) -> float | None:
    first = first_window(m, int(r.param("first_steps")), int(r.param("min_samples")))
    return median(first) if first else None


def _baseline(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
              cell: tuple[int | None, int | None]) -> Verdict | None:
    base = _early_base(r, m)
    if base is None:
        return None
    if not math.isfinite(v):
        return Verdict(True, v, {"value": str(v), "baseline": base}, baseline=base)
    if r.param("below"):
        limit = base * float(r.param("factor"))
        breach = v < limit
    else:
        limit = max(float(r.param("floor")), base * float(r.param("factor")))
        breach = v > limit
    return Verdict(breach, v, {"value": v, "baseline": base, "limit": limit,
                               "ratio": v / base if base else None},
                   baseline=base, limit=limit)


def _entropy_collapse(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
                      cell: tuple[int | None, int | None]) -> Verdict | None:
    base = _early_base(r, m)
    if base is None or not math.isfinite(v):
        return None
    limit = base * float(r.param("fraction"))
    return Verdict(v < limit, v, {"value": v, "baseline": base, "limit": limit},
                   baseline=base, limit=limit)


def _log_series(r: RuleSpec, m: Memory, step: int, v: float
                ) -> tuple[list[float], list[float]]:
    """The positive samples of the last ``window`` steps, this one included (at least the
    newest ``min_samples``), as (steps, log values)."""
    past = window(m, step, 0, int(r.param("window")), int(r.param("min_samples")) - 1)
    pts = [(s, x) for s, x in [*past, (step, v)] if x > 0]
    return [float(s) for s, _ in pts], [math.log(x) for _, x in pts]


def _trend(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
           cell: tuple[int | None, int | None]) -> Verdict | None:
    if not math.isfinite(v):
        return None
    xs, ys = _log_series(r, m, step, v)
    if len(xs) < int(r.param("min_samples")):
        return None
    slope = theil_sen(xs, ys)
    tau = kendall_tau(ys)
    growth = math.exp(slope * (xs[-1] - xs[0]))
    breach = (tau >= float(r.param("min_tau")) and growth >= float(r.param("min_ratio"))
              and v >= float(r.param("floor")))
    doubling = math.log(2) / slope if slope > 0 else None
    return Verdict(breach, v, {"value": v, "slope_log_per_step": slope, "kendall_tau": tau,
                               "growth_over_window": growth, "window_from_step": int(xs[0]),
                               "doubling_steps": doubling},
                   left_step=int(xs[0]) if breach else None)


def _forecast(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
              cell: tuple[int | None, int | None]) -> Verdict | None:
    critical = float(r.param("critical"))
    known = fv.get(str(r.param("critical_metric"))) if r.param("critical_metric") else None
    if known is not None and math.isfinite(known) and known > 0:
        critical = known  # the job said where its attention overflows (its dtype's max)
    if not math.isfinite(v) or v >= critical:  # past it already: no history needed
        return Verdict(True, v, {"value": _num(v), "critical": critical, "eta_steps": 0,
                                 "crosses_at_step": step}, limit=critical)
    xs, ys = _log_series(r, m, step, v)
    if len(xs) < int(r.param("min_samples")):
        return None
    slope = theil_sen(xs, ys)
    # the level the trend line reaches now (robust to the newest sample's noise)
    level = median(y - slope * x for x, y in zip(xs, ys, strict=True)) + slope * step
    if v >= critical:
        eta: float | None = 0.0
    elif slope <= 0:
        eta = None
    else:
        eta = max(0.0, (math.log(critical) - max(level, math.log(max(v, 1e-30)))) / slope)
    horizon = float(r.param("horizon"))
    span = xs[-1] - xs[0]
    # a straight line in log space is trusted at most as far ahead as it was observed
    # (``trust`` x the span of its window): a crossing further out is no forecast
    trust = r.param("trust")
    trusted = eta is not None and (trust is None or eta <= float(trust) * span)
    breach = eta is not None and trusted and eta <= horizon and v >= float(r.param("floor"))
    return Verdict(breach, v, {"value": v, "critical": critical,
                               "eta_steps": None if eta is None else round(eta),
                               "crosses_at_step": None if eta is None else round(step + eta),
                               "slope_log_per_step": slope, "horizon": horizon,
                               "observed_steps": span},
                   limit=critical, left_step=int(xs[0]) if breach else None)


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


def _head_logit(fv: FrameView, metric: str, own: str, layer: int | None,
                head: int | None) -> float | None:
    """The max attention logit a projection head feeds: the query head's own, or for a key
    head shared by a group of query heads (GQA; ``own`` has fewer heads per layer than
    ``metric``) the largest of its group's."""
    if layer is None or head is None:
        return None
    try:
        row = [float(x) for x in fv.heads[metric][layer]]
        n_own = len(fv.heads[own][layer])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if n_own <= 0 or head >= n_own or len(row) % n_own:
        return None
    group = len(row) // n_own
    return max(row[head * group:(head + 1) * group])


def _ratio(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
           cell: tuple[int | None, int | None]) -> Verdict | None:
    """A weight norm falling while its bias norm rises (QK-clip's bias refuge).

    Over ``window`` steps the weight norm falls by ``min_change`` and the bias norm rises by
    ``min_rise`` (None: ``min_change`` too), the bias is a material part of the projection
    (its norm at least ``share`` of the weight's: the bias term's share of q = W x + b for
    unit-RMS inputs), and, where the frame carries the head's max attention logit
    (``logit``), the logit is at least ``logit_floor`` and did not fall with the weight: the
    logit's magnitude moved into the bias path. A head whose weights shrink because training
    shrinks them (weight decay, an early transient) loses its logit with them; a bias that
    is a rounding error of the projection carries nothing.
    """
    other_name = str(r.param("other"))
    other = fv.get(other_name, *cell)
    if other is None or not math.isfinite(v) or not math.isfinite(other):
        return None
    logit_name = r.param("logit")
    logit = _head_logit(fv, str(logit_name), r.metric, *cell) if logit_name else None
    if logit is not None and not math.isfinite(logit):
        logit = None
    hist: deque[tuple[int, float, float, float | None]] = m.extra.setdefault(
        "pairs", deque(maxlen=RECENT_MAX))
    hist.append((step, v, other, logit))
    span = int(r.param("window"))
    then = [p for p in hist if p[0] <= step - span]
    if not then:
        return None
    _, w0, b0, l0 = then[-1]
    if w0 <= 0 or b0 <= 0:
        return None
    w_change = v / w0 - 1
    b_change = other / b0 - 1
    c = float(r.param("min_change"))
    rise = r.param("min_rise")
    rise = c if rise is None else float(rise)
    share = other / v if v > 0 else math.inf
    breach = w_change <= -c and b_change >= rise and share >= float(r.param("share"))
    how: dict[str, Any] = {"weight_norm": v, "bias_norm": other, "weight_change": w_change,
                           "bias_change": b_change, "bias_share": share,
                           "other": other_name, "since_step": then[-1][0]}
    if logit_name and logit is not None:
        held = l0 is None or logit >= (1 - c) * l0
        breach = breach and logit >= float(r.param("logit_floor")) and held
        how.update({"logit": logit, "logit_then": l0})
    return Verdict(breach, v, how)


def _first_loss(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
                cell: tuple[int | None, int | None]) -> Verdict | None:
    if m.seen > 0:
        return Verdict(False, v) if m.extra.get("judged") else None
    m.extra["judged"] = True
    vocab = r.param("vocab")
    tol = float(r.param("tolerance"))
    if not math.isfinite(v):
        return Verdict(True, v, {"value": str(v)})
    expected = math.log(float(vocab)) if vocab else None
    if expected is not None:
        breach = abs(v - expected) > tol
    else:
        breach = v > math.log(262144) + tol
    return Verdict(breach, v, {"value": v, "expected": expected, "tolerance": tol})


def _no_data(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
             cell: tuple[int | None, int | None]) -> Verdict | None:
    return None  # judged by the engine's clock (AlertEngine.check_stale)


#: Default holds (``keep_firing_for``, steps): 0 for a user's plain threshold and the
#: one-shot kinds (as Prometheus), and for the run-level divergence kinds (``nonfinite``,
#: ``loss_jump``: they inhibit the per-head alerts while they fire, so they must not outlive
#: their condition; a diverged run keeps breaching anyway); 200 for trend and forecast,
#: whose window statistics wander around their limit while a climb goes on; 100 for the
#: others. Every window, lag, history and ``first_steps`` is in steps; ``min_samples`` is
#: what a window's statistic needs at any interval.
KINDS: dict[str, Kind] = {
    "threshold": Kind(_threshold, {"op": ">", "value": 0.0}, keep_firing_for=0, keep=1),
    "nonfinite": Kind(_nonfinite, {}, keep_firing_for=0, keep=1),
    "baseline": Kind(_baseline, {"first_steps": 100, "min_samples": 5, "factor": 4.0,
                                 "floor": 0.0, "below": False}),
    "departure": Kind(departure, {"factor": 4.0, "floor": 30.0, "window": 200, "lag": 50,
                                   "min_history": 50, "min_samples": 5, "ceiling": None,
                                   "margin": None, "smooth": 0, "step_weighted": False,
                                   "noise_z": 0.0, "capped_metric": None, "climb": None,
                                   "climb_span": 50, "climb_window": 20,
                                   "slow_margin": None, "fast_margin": None,
                                   "fast_climb": 0.75, "fast_not_falling": None,
                                   "fast_tolerance": 0.1, "fast_for": 5, "below": False},
                      hold_breaches=True),
    "trend": Kind(_trend, {"window": 70, "min_samples": 6, "min_tau": 0.7, "min_ratio": 1.5,
                           "floor": 0.0},
                  keep_firing_for=200),
    "forecast": Kind(_forecast, {"critical": FP16_MAX, "window": 90, "min_samples": 5,
                                 "horizon": 500.0, "trust": None, "floor": 0.0,
                                 "critical_metric": "attn.dtype_max",
                                 "capped_metric": "attn.capped_logit_max"},
                     keep_firing_for=200),
    "spike": Kind(spike, {"window": 200, "z": 6.0, "min_jump": 0.0, "min_samples": 5,
                           "min_history": 0, "min_scale": 1e-6, "only_unclipped": False,
                           "center_window": None, "noise": "level"}, hold_breaches=True),
    "loss_jump": Kind(loss_jump, {"window": 200, "z": 6.0, "min_jump": 0.5,
                                   "min_samples": 5, "min_history": 0, "min_scale": 0.02,
                                   "only_unclipped": False, "center_window": None,
                                   "noise": "level", "precursor_steps": 0,
                                   "precursor_wake": 0, "aftershock_adaptive": True,
                                   "aftershock_loss": 0.0},
                      hold_breaches=True, keep_firing_for=0),
    "level_rise": Kind(level_rise, {"window": 100, "min_samples": 5, "min_history": 200,
                                     "factor": 5.0, "margin": None, "floor": 0.0,
                                     "while_rising": None, "rising_span": 50,
                                     "rising_factor": 1.05, "rising_max": None,
                                     "ramp_steps": None, "also_metric": None, "also_factor": 2.0,
                                     "also_window": 50, "also_min_history": 100,
                                     "also_rate": None, "noise_margin": None,
                                     "noise_window": 100, "low_window": 0,
                                     "climb_factor": None, "climb_span": 30, "climbs": 2}),
    "above_peak": Kind(above_peak, {"factor": 10.0, "settle": 100}, keep=1),
    "lr_jump": Kind(lr_jump, {"factor": 2.0, "vs_schedule": 5.0}, keep=LR_JUMP_READS),
    "entropy_collapse": Kind(_entropy_collapse, {"first_steps": 100, "min_samples": 5,
                                                 "fraction": 0.25}),
    "clip_rate": Kind(clip_rate, {"window": 100, "min_samples": 3, "rate": 0.9,
                                   "rise": 0.5}),
    "ratio": Kind(_ratio, {"other": "qk.q_bias_norm", "window": 100, "min_change": 0.2,
                           "min_rise": None, "share": 0.0, "logit": None,
                           "logit_floor": 0.0}),
    "first_loss": Kind(_first_loss, {"vocab": None, "tolerance": 1.5}, keep_firing_for=0,
                       keep=1),
    "no_data": Kind(_no_data, {"seconds": 600.0}, keep_firing_for=0),
    "collapse": Kind(collapse, {"fraction": 0.5, "window": 100, "lag": 20, "min_samples": 3,
                                "min_history": 100, "floor": 0.05, "loss_metric": "loss",
                                "loss_up": 1.0, "loss_up_max": None, "plain_only": False},
                     hold_breaches=True, keep=COLLAPSE_KEEP, every_frame=True),
}
DETECTORS = {k: v.detect for k, v in KINDS.items()}
