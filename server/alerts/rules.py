"""Alert rules: what a rule says (:mod:`.spec`), how each kind judges one sample
(:mod:`.detectors`), and the whole-matrix fast path (:mod:`.screens`); this module gathers them.

Everything here is pure: no clock, no I/O, no database. A *detector* (one per rule kind)
looks at one series cell (a scalar, or one layer/head of a per-head metric, or the max over
all heads) one sample at a time, with a small :class:`Memory` of that cell's past, and
returns a :class:`Verdict` (breach or not, plus evidence) or ``None`` when it cannot judge
yet (no data, too little history). The lifecycle (pending, firing, resolved) is
:class:`Track`; the engine owns the keys, the database and notifications.

Rule kinds (``RuleSpec.kind``) and their ``params``. Every window, lag, history and
``first_steps`` is in **steps**; a window that holds fewer than ``min_samples`` samples (a
wide sampling interval) takes the newest ``min_samples`` instead:

``threshold``      value ``op`` (``>``/``<``) ``value``.
``nonfinite``      the value is NaN or infinite.
``baseline``       value above ``factor`` x the median of the run's first samples (those of its
                   first ``first_steps`` steps: its own early baseline), and above ``floor``;
                   ``below: true`` inverts.
``departure``      value above ``factor`` x the median of its recent window (the ``window``
                   steps before the newest ``lag`` steps, so a steady climb cannot drag its own
                   baseline along), and above ``floor``, once the series has ``min_history``
                   steps before the lag: the series leaves its recent range. ``margin``: the
                   median + ``margin`` instead (a series that is already a logarithm). An
                   optional ``ceiling`` alarms above it whatever the baseline. ``smooth``
                   (steps): judge the median of the last ``smooth`` steps' samples (at least
                   3) instead of the newest one, for a noisy series; its ``for_steps``
                   count from the first of the newest raw samples above the limit.
                   ``noise_z`` (with ``smooth``): the level must clear the limit by that
                   many standard errors of the gap between the level and the baseline
                   (per-sample noise from successive differences; large at a wide
                   sampling interval, where both medians hold few samples).
                   ``climb`` (with ``margin``): a departure counts while the series' short
                   level (median of its last ``climb_window`` steps) rose at least ``climb``
                   over the last ``climb_span`` steps (a drift running away), or once the
                   level is ``slow_margin`` (instead of ``margin``) over the baseline, plus
                   what ``noise_z`` adds (a slow drift must go further); ``slow_margin:
                   null``: only a climbing departure counts. Read on the per-step series: a
                   job without per-step history (fewer than half the steps sampled) is judged
                   as without ``climb``. ``fast_margin`` (with ``smooth`` and ``margin``:
                   added to the baseline, as ``margin``): a ramp is judged on its short
                   level (median of the last ``climb_window`` steps) instead, once that is
                   over the limit and ``fast_margin`` over the baseline, rose ``fast_climb``
                   in each half of the last ``climb_span`` steps and the newest sample is on
                   or over it, for ``fast_for`` steps in a row (a long median lags a steady
                   climb by half its steps; a held jump passes for a step or two);
                   ``fast_not_falling: <scalar>`` (the loss): and that series' short level
                   did not fall more than ``fast_tolerance`` (its units) over ``climb_span``
                   steps (log Z also climbs when the model grows confident because it is
                   right). Unread, so judged as without it, without per-step history (of
                   the guard's series too). ``below: true`` (with ``margin``): the series
                   falling out of its range, judged on -x (every parameter reads as for a
                   rise: ``margin`` under the baseline, ``climb`` a fall); ``floor: null``
                   sets no floor (a mirrored limit would need one under any baseline); a
                   non-finite value is left to the upward rule and the ``nonfinite`` kind.
``trend``          robust slope: Theil-Sen slope of log(value) over the last ``window`` steps
                   with a Mann-Kendall score of at least ``min_tau``, and growth over the window
                   of at least ``min_ratio``; p99 8 -> 12 -> 18 is such a trend.
``forecast``       extrapolates the Theil-Sen trend of log(value) over the last ``window``
                   steps and fires when the series will cross ``critical`` (default 65504, the
                   float16 maximum; a scalar named ``critical_metric``, ``attn.dtype_max``, in
                   the frame wins when a job sends it) within ``horizon`` steps, and (with
                   ``trust``) no further ahead than ``trust`` x the steps it observed; the
                   evidence says in how many steps. Where the frame carries
                   ``capped_metric`` (``attn.capped_logit_max``: a soft-capped attention) the
                   forecast reads it, what the softmax actually receives.
``spike``          robust z-score against the median/MAD of the last ``window`` steps above
                   ``z``, and the value above ``min_jump`` + median (absolute units);
                   ``only_unclipped``: not on a step whose gradient was clipped, nor on one
                   just under the job's clip threshold (``grad.max_norm``, when the job sends
                   it: within 10x below it). ``center_window: n``: z is taken from the
                   median of the newest ``n`` samples (and ``min_jump`` above the higher of
                   that and the window's median); ``noise: diff``: the scale is the MAD of
                   successive differences over sqrt 2 (step-to-step noise, blind to a trend
                   such as a loss still falling early in training). ``min_history``: no
                   verdict before the series has that many steps behind it (default 0).
``loss_jump``      ``spike`` for the loss, whose evidence also says what happened at that
                   sample: the learning rate changed, the gradient norm jumped.
``level_rise``     the series' level (the median of its last ``window`` steps) is ``factor`` x
                   (or, with ``margin``, ``margin`` above) the lowest level it settled to
                   (lowest since ``min_history`` steps into the series), and above ``floor``:
                   a gradient norm whose level keeps growing. ``while_rising: lr``: only
                   while that scalar is more than ``rising_factor`` x its value
                   ``rising_span`` steps before (a warm-up still climbing; not within
                   ``rising_span`` steps of a frame whose ``fuse.lr_backoff.multiplier``
                   is below 1: the job's LR backoff coming back to its schedule), and with
                   ``rising_max`` at most that many times (a climb, not a step) unless,
                   with ``ramp_steps: n``, it rose on each of its last n steps (a ramp still
                   going on, however fast: a step taken and held rises on one).
                   ``also_metric: grad.norm``: only while that series' level (median of
                   its last ``also_window`` steps) is ``also_factor`` x the lowest it
                   settled to (from ``also_min_history`` steps into it) as well: two
                   series rising together. With ``also_rate``, the other series' mean over
                   its last ``also_window`` steps must be at least ``also_rate`` instead
                   (``also_metric: grad.clipped``: the share of those steps clipped).
                   ``noise_margin: k`` (with ``margin``): the margin is at least k x the
                   series' step-to-step noise over its last ``noise_window`` steps (robust
                   standard deviation of one value; its newest 10 samples when those steps
                   hold fewer), so a level within a noisy loss's own wander is not a rise.
                   ``low_window: n`` (n > 0): the lowest is taken from the median of the
                   last n steps instead (a short level, a long settled lowest); a level of
                   0 or below sets no lowest for ``factor``. ``climb_factor: f``: only
                   while the level is also f x the level ``climb_span`` steps before, and
                   that one f x the level ``climb_span`` before it (``climbs`` spans in
                   all): a growth still climbing, not a jump that holds.
``above_peak``     the value is above ``factor`` x the peak the series settled at (its highest
                   value before it went ``settle`` steps without a new high): a learning rate
                   re-warmed, ramped or jumped far above where its schedule had settled.
``lr_jump``        the learning rate changed by more than ``factor`` between two samples,
                   and by more than ``vs_schedule`` x the median change of the samples before
                   (a jump, not a ramp: a linear warm-up moves it by the same amount a sample).
``entropy_collapse`` value below ``fraction`` x the median of the run's first samples (its first
                   ``first_steps`` steps): attention entropy collapsing toward one-hot.
``clip_rate``      mean of ``grad.clipped`` over the last ``window`` steps above ``rate`` and at
                   least ``rise`` above its mean over the ``window`` steps before.
``ratio``          this series (q/k weight norm) fell by ``min_change`` or more since ``window``
                   steps ago while ``other`` (the bias norm) rose by ``min_rise`` (None: as
                   much): the QK-clip bias refuge.
``first_loss``     the first loss sample is far from ln(``vocab``): beyond ``tolerance`` nats
                   (without ``vocab``: above ln(262144) + tolerance, or non-finite).
``no_data``        the run sent nothing for ``seconds`` (judged by the engine's clock, not
                   per sample; see :meth:`AlertEngine.check_stale`).

Every rule also has a hold, ``keep_firing_for`` (in steps; default per kind:
:attr:`Kind.keep_firing_for`): once firing, an alert resolves only after its condition has
stayed clear for that many steps (and ``resolve_after`` samples); a breach within the hold
continues the same alert (one episode, one alert), as Prometheus' ``keep_firing_for``.
A :class:`Downgrade` lowers a rule's severity while a frame scalar says the harm it warns of
cannot happen (a per-head logit departure in a float32/bf16 attention cannot overflow), unless
the loss itself shows harm; a :class:`Page` holds an alert at ``info`` until its condition
has persisted or a forecast's horizon is short enough to act on.
"""

from __future__ import annotations

from logitwatch.server.alerts.detectors import (
    DETECTORS,
    EARLY_MAX,
    KINDS,
    RECENT_MAX,
    SCALAR_KEEP,
    FrameView,
    Kind,
    Memory,
    State,
    Track,
    Transition,
    Verdict,
    kendall_tau,
    mad,
    theil_sen,
    window,
)
from logitwatch.server.alerts.screens import SCREENS, CellMemory
from logitwatch.server.alerts.spec import (
    FP16_MAX,
    REMEDIES,
    SEVERITIES,
    Downgrade,
    Page,
    RuleError,
    RuleSpec,
    remedies_for,
)

__all__ = [
    "DETECTORS",
    "EARLY_MAX",
    "FP16_MAX",
    "KINDS",
    "RECENT_MAX",
    "REMEDIES",
    "SCALAR_KEEP",
    "SCREENS",
    "SEVERITIES",
    "CellMemory",
    "Downgrade",
    "FrameView",
    "Kind",
    "Memory",
    "Page",
    "RuleError",
    "RuleSpec",
    "State",
    "Track",
    "Transition",
    "Verdict",
    "kendall_tau",
    "mad",
    "remedies_for",
    "theil_sen",
    "window",
]
