"""Alert rules: what a rule says (:class:`RuleSpec`) and how each kind judges one sample.

Everything here is pure: no clock, no I/O, no database. A *detector* (one per rule kind)
looks at one series cell (a scalar, or one layer/head of a per-head metric, or the max over
all heads) one sample at a time, with a small :class:`Memory` of that cell's past, and
returns a :class:`Verdict` (breach or not, plus evidence) or ``None`` when it cannot judge
yet (no data, too little history). The lifecycle (pending, firing, resolved) is
:class:`Track`; the engine owns the keys, the database and notifications.

Rule kinds (``RuleSpec.kind``) and their ``params``:

``threshold``      value ``op`` (``>``/``<``) ``value``.
``nonfinite``      the value is NaN or infinite.
``baseline``       value above ``factor`` x the median of the run's first ``samples`` samples
                   (its own early baseline), and above ``floor``; ``below: true`` inverts.
``departure``      value above ``factor`` x the median of its recent window (``window``
                   samples, skipping the ``lag`` newest so a steady climb cannot drag its own
                   baseline along), and above ``floor``: the series leaves its recent range.
                   An optional ``ceiling`` alarms above it whatever the baseline.
``trend``          robust slope: Theil-Sen slope of log(value) over ``window`` samples with a
                   Mann-Kendall score of at least ``min_tau``, and growth over the window of at
                   least ``min_ratio``; p99 8 -> 12 -> 18 is such a trend.
``forecast``       extrapolates the Theil-Sen trend of log(value) over ``window`` samples and
                   fires when the series will cross ``critical`` (default 65504, the float16
                   maximum; a scalar named ``critical_metric``, ``attn.dtype_max``, in the
                   frame wins when a job sends it) within ``horizon`` steps; the evidence
                   says in how many steps.
``spike``          robust z-score against the rolling median/MAD of ``window`` samples above
                   ``z``, and the value above ``min_jump`` + median (absolute units);
                   ``only_unclipped``: not on a step whose gradient was clipped.
``loss_jump``      ``spike`` for the loss, whose evidence also says what happened at that
                   sample: the learning rate changed, the gradient norm jumped.
``lr_jump``        the learning rate changed by more than ``factor`` between two samples,
                   and by more than ``vs_schedule`` x the median change of the samples before
                   (a jump, not a ramp: a linear warm-up moves it by the same amount a sample).
``entropy_collapse`` value below ``fraction`` x the median of the run's first ``samples``
                   samples (attention entropy collapsing toward one-hot).
``clip_rate``      mean of ``grad.clipped`` over ``window`` samples above ``rate`` and at least
                   ``rise`` above the mean of the window before it.
``ratio``          over ``window`` samples, this series (q/k weight norm) falls by
                   ``min_change`` or more while ``other`` (the bias norm) rises by as much:
                   the QK-clip bias refuge.
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
the loss itself shows harm.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from statistics import median
from typing import Any

import numpy as np

__all__ = [
    "DETECTORS",
    "KINDS",
    "SCREENS",
    "CellMemory",
    "Downgrade",
    "REMEDIES",
    "FrameView",
    "Memory",
    "RuleError",
    "RuleSpec",
    "State",
    "Track",
    "Transition",
    "Verdict",
    "remedies_for",
]

FP16_MAX = 65504.0

#: Remedies from the field notes (../shared/seeds), by topic; alerts carry the relevant ones.
REMEDIES: dict[str, str] = {
    "qk_norm": "Add QK-norm (RMSNorm over head_dim on q and k, before RoPE): it bounds the "
    "q.k logits at their source.",
    "softcap": "Or soft-cap the attention logits: cap * tanh(logits / cap), e.g. cap 50 "
    "(above the healthy range of your logits; it cuts gradients beyond the cap).",
    "qk_clip": "QK-clip: when a head's max logit exceeds tau (e.g. 100), rescale that head's "
    "W_q and W_k by sqrt(tau / max_logit); with biased q/k projections scale the biases too, "
    "or the weights shrink while the biases grow and carry the logits.",
    "z_loss": "Add z-loss (1e-4 * log^2 Z) to keep the output logits' normaliser near 0.",
    "lower_lr": "Lower the learning rate (or lengthen the warm-up).",
    "restart": "Restart from a checkpoint about 100 steps before the trouble started and "
    "skip the next batches.",
    "check_lr": "Check the learning-rate schedule: a jump or a restarted warm-up.",
    "check_data": "Inspect the batch at this step (a corrupt or outlier batch), and keep "
    "gradient clipping on.",
    "init": "Check the initialisation and the output layer: a first loss far from ln(vocab) "
    "means the model starts confidently wrong (init std too large) or the loss is wrong.",
    "hung": "The job stopped reporting: check whether it hung (NCCL, data loader) or crashed.",
}

_TOPICS: dict[str, tuple[str, ...]] = {
    "attn": ("qk_norm", "softcap", "qk_clip", "lower_lr", "restart"),
    "final": ("z_loss", "lower_lr", "restart"),
    "loss": ("restart", "lower_lr", "check_lr", "check_data"),
    "grad": ("check_data", "lower_lr", "restart"),
    "lr": ("check_lr", "restart"),
    "qk": ("qk_clip", "qk_norm"),
    "init": ("init",),
    "hung": ("hung",),
}


def remedies_for(metric: str, kind: str) -> list[str]:
    """The remedies an alert on ``metric`` of rule kind ``kind`` carries."""
    if kind == "no_data":
        topic = "hung"
    elif kind == "first_loss":
        topic = "init"
    elif kind == "ratio" or metric.startswith("qk."):
        topic = "qk"
    elif kind == "lr_jump" or metric == "lr":
        topic = "lr"
    else:
        topic = next((t for t in ("attn", "final", "loss", "grad") if metric.startswith(t)),
                     "loss")
    return [REMEDIES[k] for k in _TOPICS[topic]]


class RuleError(ValueError):
    """A rule specification is invalid; the message says which field and why."""


class State(str, Enum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Downgrade:
    """When a rule's alerts are less severe than its ``severity``.

    A sample is *downgraded* when the frame's scalar ``metric`` is above ``above`` (by
    default: the attention's dtype max, ``attn.dtype_max``, is wider than float16's 65504,
    so the logits cannot overflow it) and the loss shows no harm: the median of its last
    ``loss_window`` samples is less than ``loss_rise`` nats above the lowest such median of
    the run (``loss_rise: null``: the loss is not consulted). A frame without ``metric`` is
    never downgraded (today's behaviour for jobs that do not send it). An alert that fires
    on a downgraded sample is stored with severity ``to`` and ``note``; if a later sample
    of the same episode is not downgraded (the loss rose), it is escalated to the rule's
    severity (``evidence.escalated_step``).
    """

    to: str = "info"
    metric: str = "attn.dtype_max"
    above: float = FP16_MAX
    loss_rise: float | None = 0.25
    loss_window: int = 10
    note: str = ""

    def __post_init__(self) -> None:
        if self.to not in SEVERITIES:
            raise RuleError(f"downgrade.to must be one of {SEVERITIES}, not {self.to!r}")
        if not isinstance(self.metric, str) or not self.metric:
            raise RuleError("downgrade.metric must be a scalar's name (e.g. attn.dtype_max)")
        if isinstance(self.above, bool) or not isinstance(self.above, (int, float)):
            raise RuleError(f"downgrade.above must be a number, got {self.above!r}")
        if self.loss_rise is not None and (isinstance(self.loss_rise, bool) or not
                                           isinstance(self.loss_rise, (int, float))
                                           or self.loss_rise <= 0):
            raise RuleError(f"downgrade.loss_rise must be a positive number of nats or null, "
                            f"got {self.loss_rise!r}")
        if not isinstance(self.note, str):
            raise RuleError(f"downgrade.note must be a string, got {self.note!r}")
        w = self.loss_window
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 1000:
            raise RuleError(f"downgrade.loss_window must be an int in 1..1000, got {w!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"to": self.to, "metric": self.metric, "above": self.above,
                "loss_rise": self.loss_rise, "loss_window": self.loss_window,
                "note": self.note}

    @classmethod
    def from_dict(cls, d: Any) -> Downgrade:
        """Build from a mapping; raises :class:`RuleError` on unknown fields."""
        if isinstance(d, Downgrade):
            return d
        if not isinstance(d, Mapping):
            raise RuleError(f"downgrade must be a mapping, got {type(d).__name__}")
        known = {"to", "metric", "above", "loss_rise", "loss_window", "note"}
        unknown = set(d) - known
        if unknown:
            raise RuleError(f"downgrade: unknown fields {sorted(unknown)}; known: "
                            f"{sorted(known)}")
        return cls(**d)


@dataclass(frozen=True)
class RuleSpec:
    """One alert rule.

    Attributes:
        name: Unique name (``[a-z0-9_.-]``), the ``rule`` of its alerts.
        kind: One of :data:`KINDS`.
        metric: The series: a scalar (``loss``) or a per-head metric (``attn.logit_max``).
        params: Kind-specific parameters (see the module docstring).
        over: For per-head metrics: ``cell`` judges every layer/head on its own; ``max``
            and ``min`` judge the max/min over all heads of a sample (one run-level series).
        for_samples: Consecutive breaching samples before pending turns firing.
        resolve_after: Consecutive calm samples before firing turns resolved (at least).
        keep_firing_for: Steps the condition must stay clear before a firing alert
            resolves; a breach within them continues the same alert. ``None``: the
            kind's default (:attr:`Kind.keep_firing_for`); see :attr:`hold`.
        severity: ``info``, ``warning`` or ``critical``.
        inhibits: This rule, while firing on a rank, holds back new per-head alerts of
            that rank (the run-level divergence alert).
        summary: One line saying what it means, used in the alert message.
        enabled: False keeps the rule but does not evaluate it.
        downgrade: When its alerts are less severe (:class:`Downgrade`), or ``None``.
    """

    name: str
    kind: str
    metric: str
    params: Mapping[str, Any] = field(default_factory=dict)
    over: str = "cell"
    for_samples: int = 1
    resolve_after: int = 3
    severity: str = "warning"
    inhibits: bool = False
    summary: str = ""
    enabled: bool = True
    keep_firing_for: int | None = None
    downgrade: Downgrade | None = None

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "_.-" for c in self.name):
            raise RuleError(f"rule name {self.name!r}: use letters, digits, '_', '.', '-'")
        if self.kind not in KINDS:
            raise RuleError(f"rule {self.name!r}: kind {self.kind!r} is not one of "
                            f"{sorted(KINDS)}")
        if self.over not in ("cell", "max", "min"):
            raise RuleError(f"rule {self.name!r}: over must be 'cell', 'max' or 'min', "
                            f"not {self.over!r}")
        if self.severity not in SEVERITIES:
            raise RuleError(f"rule {self.name!r}: severity must be one of {SEVERITIES}")
        for attr in ("for_samples", "resolve_after"):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise RuleError(f"rule {self.name!r}: {attr} must be an int >= 1, got {v!r}")
        k = self.keep_firing_for
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise RuleError(f"rule {self.name!r}: keep_firing_for must be an int >= 0 (steps) "
                            f"or null (the kind's default), got {k!r}")
        if self.downgrade is not None and not isinstance(self.downgrade, Downgrade):
            try:
                object.__setattr__(self, "downgrade", Downgrade.from_dict(self.downgrade))
            except (RuleError, TypeError) as e:
                raise RuleError(f"rule {self.name!r}: {e}") from e
        unknown = set(self.params) - set(KINDS[self.kind].defaults)
        if unknown:
            raise RuleError(f"rule {self.name!r}: unknown params {sorted(unknown)} for kind "
                            f"{self.kind!r}; known: {sorted(KINDS[self.kind].defaults)}")
        for key, value in self.params.items():
            problem = _param_problem(self.kind, key, value)
            if problem:
                raise RuleError(f"rule {self.name!r}: param {key} {problem}, got {value!r}")

    def param(self, key: str) -> Any:
        """A parameter, or its kind's default."""
        return self.params.get(key, KINDS[self.kind].defaults[key])

    @property
    def hold(self) -> int:
        """``keep_firing_for`` in steps, or the kind's default."""
        if self.keep_firing_for is not None:
            return self.keep_firing_for
        return KINDS[self.kind].keep_firing_for

    def to_dict(self) -> dict[str, Any]:
        """A JSON/YAML-able form that :meth:`from_dict` reads back."""
        return {"name": self.name, "kind": self.kind, "metric": self.metric,
                "params": dict(self.params), "over": self.over,
                "for_samples": self.for_samples, "resolve_after": self.resolve_after,
                "severity": self.severity, "inhibits": self.inhibits,
                "summary": self.summary, "enabled": self.enabled,
                "keep_firing_for": self.keep_firing_for,
                "downgrade": None if self.downgrade is None else self.downgrade.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RuleSpec:
        """Build from a mapping (YAML file, API body); raises :class:`RuleError`."""
        if not isinstance(d, Mapping):
            raise RuleError(f"a rule must be a mapping, got {type(d).__name__}")
        known = {"name", "kind", "metric", "params", "over", "for_samples", "resolve_after",
                 "severity", "inhibits", "summary", "enabled", "keep_firing_for", "downgrade"}
        unknown = set(d) - known
        if unknown:
            raise RuleError(f"rule {d.get('name')!r}: unknown fields {sorted(unknown)}; "
                            f"known: {sorted(known)}")
        for req in ("name", "kind", "metric"):
            if not isinstance(d.get(req), str):
                raise RuleError(f"rule {d.get('name')!r}: {req} (a string) is required")
        params = d.get("params") or {}
        if not isinstance(params, Mapping):
            raise RuleError(f"rule {d['name']!r}: params must be a mapping")
        return cls(**{**d, "params": dict(params)})


_MIN_COUNT = {"samples": 1, "min_history": 1}  # other int params (lag): >= 0
_MIN_WINDOW = {"trend": 2, "forecast": 2}  # a slope needs two points; other kinds 1


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def _param_problem(kind: str, key: str, v: Any) -> str:
    """What is wrong with ``v`` for ``kind``'s parameter ``key`` ('' when nothing): its type
    follows the kind's default, so a rule from YAML or the API cannot fail later, at ingest."""
    default = KINDS[kind].defaults[key]
    if isinstance(default, bool):
        return "" if isinstance(v, bool) else "must be true or false"
    if isinstance(default, int):
        low = _MIN_WINDOW.get(kind, 1) if key == "window" else _MIN_COUNT.get(key, 0)
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= low
        return "" if ok else f"must be an integer >= {low}"
    if isinstance(default, float):
        return "" if _number(v) else "must be a number"
    if default is None:
        return "" if v is None or _number(v) else "must be a number or null"
    if key == "op":
        return "" if v in ("<", ">") else "must be '<' or '>'"
    return "" if isinstance(v, str) and v else "must be a non-empty string"


# -- per-cell memory, verdicts, lifecycle ---------------------------------------------------


@dataclass(slots=True)
class Memory:
    """What a detector remembers about one cell: recent finite samples, the first ones."""

    recent: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=64))
    early: list[float] = field(default_factory=list)
    last: tuple[int, float] | None = None
    seen: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def push(self, step: int, value: float, keep_early: int = 32) -> None:
        self.seen += 1
        self.last = (step, value)
        if math.isfinite(value):
            self.recent.append((step, value))
            if len(self.early) < keep_early:
                self.early.append(value)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One judgement: ``breach`` or not, with what it was judged on."""

    breach: bool
    value: float
    evidence: dict[str, Any] = field(default_factory=dict)
    baseline: float | None = None
    limit: float | None = None
    left_step: int | None = None  # where the series first left its range, if known


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of an alert: ``firing`` (new, or ``reopened``: a breach within the hold
    of a firing alert, which updates that alert) or ``resolved``."""

    state: State
    step: int
    started_step: int
    verdict: Verdict
    reopened: bool = False


@dataclass(slots=True)
class Track:
    """Lifecycle of one (rule, run, rank, cell): inactive -> pending -> firing -> resolved.

    Firing resolves once the condition has been clear for ``rule.resolve_after`` samples
    and ``rule.hold`` steps (from the first clear sample, ``clear_since``); a breach before
    that keeps the alert firing and returns a ``reopened`` transition (one episode, one
    alert).
    """

    state: State = State.INACTIVE
    streak: int = 0
    calm: int = 0
    started_step: int = 0
    clear_since: int | None = None

    def advance(self, rule: RuleSpec, step: int, v: Verdict) -> Transition | None:
        if v.breach:
            reopened = self.state is State.FIRING and self.calm > 0
            self.calm = 0
            self.clear_since = None
            self.streak += 1
            if self.streak == 1 and self.state is not State.FIRING:
                self.started_step = v.left_step if v.left_step is not None else step
                self.state = State.PENDING
            if self.streak >= rule.for_samples and self.state is State.PENDING:
                self.state = State.FIRING
                return Transition(State.FIRING, step, self.started_step, v)
            if reopened:
                return Transition(State.FIRING, step, self.started_step, v, reopened=True)
            return None
        self.streak = 0
        if self.state is State.PENDING:
            self.state = State.INACTIVE
        elif self.state is State.FIRING:
            self.calm += 1
            if self.clear_since is None or step < self.clear_since:  # (a job restarted
                self.clear_since = step  # from an earlier checkpoint counts from there)
            if self.calm >= rule.resolve_after and step - self.clear_since >= rule.hold:
                self.state = State.RESOLVED
                self.clear_since = None
                return Transition(State.RESOLVED, step, self.started_step, v)
        return None


class FrameView:
    """Read access to the other series of the sample being judged."""

    def __init__(self, scalars: Mapping[str, float],
                 heads: Mapping[str, list[list[float]]]) -> None:
        self.scalars = scalars
        self.heads = heads

    def get(self, metric: str, layer: int | None = None, head: int | None = None) -> float | None:
        if layer is None:
            v = self.scalars.get(metric)
            return None if v is None else float(v)
        m = self.heads.get(metric)
        try:
            return None if m is None else float(m[layer][head])  # type: ignore[index]
        except (IndexError, TypeError):
            return None


# -- robust statistics ------------------------------------------------------------------------


def theil_sen(xs: list[float], ys: list[float]) -> float:
    """Median of pairwise slopes (robust to a few outliers)."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i])
              for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    return median(slopes) if slopes else 0.0


def kendall_tau(ys: list[float]) -> float:
    """Mann-Kendall score normalised to [-1, 1]: +1 when every sample exceeds all before it."""
    n = len(ys)
    if n < 2:
        return 0.0
    s = sum((ys[j] > ys[i]) - (ys[j] < ys[i]) for i in range(n) for j in range(i + 1, n))
    return s / (n * (n - 1) / 2)


def mad(values: list[float], center: float) -> float:
    return median([abs(v - center) for v in values])


# -- detectors ----------------------------------------------------------------------------------

Detect = Callable[[RuleSpec, Memory, int, float, FrameView, tuple[int | None, int | None]],
                  "Verdict | None"]


@dataclass(frozen=True)
class Kind:
    """A rule kind: its detector, parameter defaults, whether breaching samples are kept
    out of the cell's memory (so a climb cannot become its own baseline), and its default
    hold in steps (``RuleSpec.keep_firing_for``): how long its condition must stay clear
    before a firing alert resolves."""

    detect: Detect
    defaults: Mapping[str, Any]
    hold_breaches: bool = False
    keep_firing_for: int = 100


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


def _baseline(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
              cell: tuple[int | None, int | None]) -> Verdict | None:
    n = int(r.param("samples"))
    if len(m.early) < n:
        return None
    base = median(m.early[:n])
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
    n = int(r.param("samples"))
    if len(m.early) < n or not math.isfinite(v):
        return None
    base = median(m.early[:n])
    limit = base * float(r.param("fraction"))
    return Verdict(v < limit, v, {"value": v, "baseline": base, "limit": limit},
                   baseline=base, limit=limit)


def _window(m: Memory, lag: int, window: int) -> list[tuple[int, float]]:
    past = list(m.recent)
    past = past[: max(0, len(past) - lag)]
    return past[-window:]


def _departure(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
               cell: tuple[int | None, int | None]) -> Verdict | None:
    past = _window(m, int(r.param("lag")), int(r.param("window")))
    if len(past) < int(r.param("min_history")):
        return None
    base = median(x for _, x in past)
    limit = float(_departure_limit(r, base))
    if not math.isfinite(v):
        return Verdict(True, v, {"value": str(v), "baseline": base, "limit": limit},
                       baseline=base, limit=limit)
    breach = v > limit
    if r.param("margin") is not None:
        how: dict[str, Any] = {"above_baseline": v - base}
    else:
        how = {"ratio": v / base if base else None}
    return Verdict(breach, v, {"value": v, "baseline": base, "limit": limit, **how},
                   baseline=base, limit=limit)


def _departure_limit(r: RuleSpec, base: Any) -> Any:
    """A departure's limit from its baseline (a float or an array of them): ``factor`` x
    the baseline, or with ``margin`` set the baseline + ``margin`` (for a series that is
    already a logarithm, such as log Z, where a fixed distance is a fixed ratio of the
    underlying quantity); at least ``floor``, at most ``ceiling``."""
    margin = r.param("margin")
    if margin is not None:
        limit = np.maximum(float(r.param("floor")), base + float(margin))
    else:
        limit = np.maximum(float(r.param("floor")), float(r.param("factor")) * base)
    if r.param("ceiling") is not None:
        limit = np.minimum(limit, float(r.param("ceiling")))
    return limit


def _log_series(m: Memory, window: int, step: int, v: float) -> tuple[list[float], list[float]]:
    """The last ``window`` positive samples, this one included, as (steps, log values)."""
    pts = [(s, x) for s, x in [*list(m.recent)[-(window - 1):], (step, v)] if x > 0]
    return [float(s) for s, _ in pts], [math.log(x) for _, x in pts]


def _trend(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
           cell: tuple[int | None, int | None]) -> Verdict | None:
    window = int(r.param("window"))
    if not math.isfinite(v):
        return None
    xs, ys = _log_series(m, window, step, v)
    if len(xs) < window:
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
    if not math.isfinite(v):
        return Verdict(True, v, {"value": str(v), "critical": critical, "eta_steps": 0},
                       limit=critical)
    window = int(r.param("window"))
    xs, ys = _log_series(m, window, step, v)
    if len(xs) < window:
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
    breach = eta is not None and eta <= horizon and v >= float(r.param("floor"))
    return Verdict(breach, v, {"value": v, "critical": critical,
                               "eta_steps": None if eta is None else round(eta),
                               "crosses_at_step": None if eta is None else round(step + eta),
                               "slope_log_per_step": slope, "horizon": horizon},
                   limit=critical, left_step=int(xs[0]) if breach else None)


def _spike(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
           cell: tuple[int | None, int | None]) -> Verdict | None:
    past = _window(m, 0, int(r.param("window")))
    if len(past) < int(r.param("min_history")):
        return None
    vals = [x for _, x in past]
    med = median(vals)
    spread = max(mad(vals, med) * 1.4826, float(r.param("min_scale")))
    if not math.isfinite(v):
        return Verdict(True, v, {"value": str(v), "median": med, "mad": spread},
                       baseline=med)
    z = (v - med) / spread
    breach = z > float(r.param("z")) and v - med > float(r.param("min_jump"))
    if breach and r.param("only_unclipped") and (fv.get("grad.clipped") or 0.0) >= 0.5:
        breach = False  # clipping bounded this step's update
    return Verdict(breach, v, {"value": v, "median": med, "robust_z": z, "scale": spread},
                   baseline=med, limit=med + float(r.param("z")) * spread)


def _loss_jump(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
               cell: tuple[int | None, int | None]) -> Verdict | None:
    if not math.isfinite(v):
        return None  # a non-finite loss is the nonfinite rule's
    out = _spike(r, m, step, v, fv, cell)
    lr, prev_lr = fv.get("lr"), m.extra.get("lr")
    g = fv.get("grad.norm")
    grads: deque[float] = m.extra.setdefault("grads", deque(maxlen=20))
    gmed = median(grads) if grads else None
    if lr is not None and math.isfinite(lr):
        m.extra["lr"] = lr
    if out is None or not out.breach:
        if g is not None and math.isfinite(g):
            grads.append(g)
        return out
    ev = dict(out.evidence)
    causes: list[str] = []
    if lr is not None and prev_lr and lr > 0 and abs(math.log(lr / prev_lr)) > math.log(1.5):
        causes.append(f"the learning rate changed from {prev_lr:.3g} to {lr:.3g}")
    if g is not None and gmed and (not math.isfinite(g) or g > 5 * gmed):
        causes.append(f"the gradient norm jumped to {g:.3g} (median {gmed:.3g})")
    ev["causes"] = causes
    return Verdict(True, v, ev, out.baseline, out.limit)


def _lr_jump(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
             cell: tuple[int | None, int | None]) -> Verdict | None:
    past = [x for _, x in list(m.recent)[-4:]]
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
                   {"value": v, "previous": prev, "previous_step": list(m.recent)[-1][0],
                    "ratio": ratio, "schedule_step": steps}, baseline=prev)


def _clip_rate(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
               cell: tuple[int | None, int | None]) -> Verdict | None:
    w = int(r.param("window"))
    vals = [x for _, x in m.recent] + ([v] if math.isfinite(v) else [])
    if len(vals) < 2 * w:
        return None
    now, before = sum(vals[-w:]) / w, sum(vals[-2 * w:-w]) / w
    breach = now >= float(r.param("rate")) and now - before >= float(r.param("rise"))
    return Verdict(breach, now, {"clip_rate": now, "previous_rate": before, "window": w})


def _ratio(r: RuleSpec, m: Memory, step: int, v: float, fv: FrameView,
           cell: tuple[int | None, int | None]) -> Verdict | None:
    other_name = str(r.param("other"))
    other = fv.get(other_name, *cell)
    if other is None or not math.isfinite(v) or not math.isfinite(other):
        return None
    hist: deque[tuple[float, float]] = m.extra.setdefault(
        "pairs", deque(maxlen=int(r.param("window"))))
    hist.append((v, other))
    if len(hist) < int(r.param("window")) or hist[0][0] <= 0 or hist[0][1] <= 0:
        return None
    w_change = v / hist[0][0] - 1
    b_change = other / hist[0][1] - 1
    c = float(r.param("min_change"))
    return Verdict(w_change <= -c and b_change >= c, v,
                   {"weight_norm": v, "bias_norm": other, "weight_change": w_change,
                    "bias_change": b_change, "other": other_name})


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
#: others.
KINDS: dict[str, Kind] = {
    "threshold": Kind(_threshold, {"op": ">", "value": 0.0}, keep_firing_for=0),
    "nonfinite": Kind(_nonfinite, {}, keep_firing_for=0),
    "baseline": Kind(_baseline, {"samples": 10, "factor": 4.0, "floor": 0.0, "below": False}),
    "departure": Kind(_departure, {"factor": 4.0, "floor": 30.0, "window": 20, "lag": 5,
                                   "min_history": 5, "ceiling": None, "margin": None},
                      hold_breaches=True),
    "trend": Kind(_trend, {"window": 8, "min_tau": 0.7, "min_ratio": 1.5, "floor": 0.0},
                  keep_firing_for=200),
    "forecast": Kind(_forecast, {"critical": FP16_MAX, "window": 10, "horizon": 500.0,
                                 "floor": 0.0, "critical_metric": "attn.dtype_max"},
                     keep_firing_for=200),
    "spike": Kind(_spike, {"window": 20, "z": 6.0, "min_jump": 0.0, "min_history": 5,
                           "min_scale": 1e-6, "only_unclipped": False}, hold_breaches=True),
    "loss_jump": Kind(_loss_jump, {"window": 20, "z": 6.0, "min_jump": 0.5,
                                   "min_history": 5, "min_scale": 0.02,
                                   "only_unclipped": False},
                       hold_breaches=True, keep_firing_for=0),
    "lr_jump": Kind(_lr_jump, {"factor": 2.0, "vs_schedule": 5.0}),
    "entropy_collapse": Kind(_entropy_collapse, {"samples": 10, "fraction": 0.25}),
    "clip_rate": Kind(_clip_rate, {"window": 10, "rate": 0.9, "rise": 0.5}),
    "ratio": Kind(_ratio, {"other": "qk.q_bias_norm", "window": 10, "min_change": 0.2}),
    "first_loss": Kind(_first_loss, {"vocab": None, "tolerance": 1.5}, keep_firing_for=0),
    "no_data": Kind(_no_data, {"seconds": 600.0}, keep_firing_for=0),
}
DETECTORS = {k: v.detect for k, v in KINDS.items()}


# -- whole-matrix memory and screens (the engine's fast path for per-head rules) ------------

RECENT_MAX = 64  # Memory.recent's maxlen
EARLY_MAX = 32  # Memory.push's keep_early


class CellMemory:
    """The :class:`Memory` of every cell of one per-head metric (layers x heads), as arrays.

    It holds exactly what :meth:`Memory.push` would hold for each cell (the newest
    ``RECENT_MAX`` finite samples in ring buffers, the first ``EARLY_MAX`` finite ones, the
    count seen, the last sample); :meth:`memory` rebuilds one cell's :class:`Memory` for its
    detector.
    """

    def __init__(self, shape: tuple[int, int]) -> None:
        layers, heads = shape
        self.shape = shape
        self.vals = np.zeros((RECENT_MAX, layers, heads))
        self.steps = np.zeros((RECENT_MAX, layers, heads), dtype=np.int64)
        self.pos = np.zeros(shape, dtype=np.int64)  # each cell's next ring slot
        self.count = np.zeros(shape, dtype=np.int64)  # len(Memory.recent)
        self.early = np.zeros((EARLY_MAX, layers, heads))
        self.early_n = np.zeros(shape, dtype=np.int64)
        self.seen = 0  # every cell sees every sample of its metric
        self.last_step = 0
        self.last_val = np.full(shape, math.nan)
        self._li, self._hi = np.indices(shape)

    def recent_idx(self, k: int, skip: int = 0) -> np.ndarray:
        """Ring slots of each cell's ``k`` newest samples before its ``skip`` newest, oldest
        first, shape (k, layers, heads); slots beyond a short history hold stale values."""
        back = np.arange(k - 1 + skip, skip - 1, -1)[:, None, None]
        return (self.pos[None] - 1 - back) % RECENT_MAX

    def take(self, arr: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """``arr`` (ring-buffer shaped) at the slots ``idx`` of :meth:`recent_idx`."""
        return arr[idx, self._li, self._hi]

    def push(self, step: int, v: np.ndarray, keep: np.ndarray) -> None:
        """Record one sample of every cell, as :meth:`Memory.push` does for the cells in
        ``keep`` (the others: counted and remembered as last, kept out of the history)."""
        self.seen += 1
        self.last_step = step
        self.last_val = v.copy()
        li, hi = np.nonzero(keep & np.isfinite(v))
        if not li.size:
            return
        p = self.pos[li, hi]
        self.vals[p, li, hi] = v[li, hi]
        self.steps[p, li, hi] = step
        self.pos[li, hi] = (p + 1) % RECENT_MAX
        self.count[li, hi] = np.minimum(self.count[li, hi] + 1, RECENT_MAX)
        e = self.early_n[li, hi] < EARLY_MAX
        le, he = li[e], hi[e]
        self.early[self.early_n[le, he], le, he] = v[le, he]
        self.early_n[le, he] += 1

    def memory(self, layer: int, head: int) -> Memory:
        """One cell's :class:`Memory`, as the per-cell path would hold it."""
        m = Memory()
        n, p = int(self.count[layer, head]), int(self.pos[layer, head])
        for j in range(p - n, p):
            q = j % RECENT_MAX
            m.recent.append((int(self.steps[q, layer, head]), float(self.vals[q, layer, head])))
        m.early = self.early[: int(self.early_n[layer, head]), layer, head].tolist()
        m.seen = self.seen
        if self.seen:
            m.last = (self.last_step, float(self.last_val[layer, head]))
        return m


Screen = Callable[[RuleSpec, CellMemory, int, np.ndarray], tuple[np.ndarray, np.ndarray]]

_REL = 1e-9  # screens keep every cell within this of its limit for the exact detector


def _median0(x: np.ndarray) -> np.ndarray:
    """Median over axis 0 (``statistics.median``'s rule: the mean of the two middle values
    of an even count); sorting each cell's short row beats ``np.median``'s partition here."""
    k = x.shape[0]
    s = np.sort(x.reshape(k, -1).T, axis=1)
    mid = s[:, k // 2] if k % 2 else (s[:, k // 2 - 1] + s[:, k // 2]) / 2
    return mid.reshape(x.shape[1:])


def _all_cells(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(v.shape, dtype=bool), np.ones(v.shape, dtype=bool)


def _screen_departure(r: RuleSpec, cm: CellMemory, step: int,
                      v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lag, window, min_hist = int(r.param("lag")), int(r.param("window")), \
        int(r.param("min_history"))
    if lag < 0 or window < 1 or min_hist < 1 or lag + window > RECENT_MAX:
        return _all_cells(v)
    past = np.maximum(cm.count - lag, 0)
    judged = np.minimum(past, window) >= min_hist
    base = _median0(cm.take(cm.vals, cm.recent_idx(window, lag)))
    limit = _departure_limit(r, base)
    calm = v < limit - _REL * (np.abs(limit) + 1.0)  # False for NaN and inf
    return judged, judged & ((past < window) | ~calm)


def _screen_trend(r: RuleSpec, cm: CellMemory, step: int,
                  v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = int(r.param("window"))
    if w < 2 or w > RECENT_MAX:
        return _all_cells(v)
    idx = cm.recent_idx(w - 1)
    ys = np.concatenate([cm.take(cm.vals, idx), v[None]])
    xs = np.concatenate([cm.take(cm.steps, idx), np.full((1, *v.shape), step)]).astype(float)
    # a verdict needs w positive samples, this one (finite) included
    judged = (cm.count >= w - 1) & np.isfinite(v) & (ys > 0).all(axis=0)
    i, j = np.triu_indices(w, 1)
    d = ys[j] - ys[i]
    # Kendall's S on the values bounds the one on their logs from above (log may merge two
    # values a few ulps apart into a tie, never reorder them)
    s_up = (d > 0).sum(axis=0) - ((d < 0) & (-d > 1e-12 * np.abs(ys[i]))).sum(axis=0)
    tau_up = s_up / (w * (w - 1) / 2)
    logs = np.log(np.where(ys > 0, ys, 1.0))
    dx = xs[j] - xs[i]
    ties = (dx == 0).any(axis=0)
    slope = _median0((logs[j] - logs[i]) / np.where(dx == 0, 1.0, dx))
    growth = np.exp(slope * (xs[-1] - xs[0]))
    maybe = ((tau_up >= float(r.param("min_tau")) - 1e-12)
             & (growth >= float(r.param("min_ratio")) * (1 - 1e-6))
             & (v >= float(r.param("floor"))))
    return judged, judged & (ties | maybe)


def _screen_entropy_collapse(r: RuleSpec, cm: CellMemory, step: int,
                             v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = int(r.param("samples"))
    if n < 1:
        return _all_cells(v)
    judged = (cm.early_n >= n) & np.isfinite(v)
    if n > EARLY_MAX:
        return judged, judged
    limit = _median0(cm.early[:n]) * float(r.param("fraction"))
    calm = v >= limit + _REL * (np.abs(limit) + 1.0)
    return judged, judged & ~calm


#: Whole-matrix screens, per rule kind: ``(judged, candidates)`` over all cells of a
#: per-head metric. ``judged``: the cells whose detector returns a verdict (exact outside
#: the candidates). Outside ``candidates`` the detector's verdict is surely no breach (or
#: none), so a cell at rest there needs no detector call: the screens over-include (a
#: relative margin for rounding), and the exact detector decides every candidate.
SCREENS: dict[str, Screen] = {
    "departure": _screen_departure,
    "trend": _screen_trend,
    "entropy_collapse": _screen_entropy_collapse,
}
