"""What an alert rule says (:class:`RuleSpec`), and checking it when it is read.

Every window, history and persistence a rule names is counted in **training steps**, never in
samples, so one rule means the same at any sampling interval: a job that sends every step, or
one that sends one step in 40 (the engine also judges per-head statistics at most once every
few steps, see :mod:`.engine`). A window that holds too few samples for its statistic at a
wide interval is widened to the newest few samples it needs (each kind's ``min_samples``).

A rule's severity can be *held back* two ways, and an alert that fired below its rule's
severity is escalated as soon as neither holds:

* :class:`Downgrade`: a frame scalar says the harm it warns of cannot happen (the attention
  dtype cannot overflow, or a soft-cap bounds what the softmax receives), unless the loss
  itself shows harm;
* :class:`Page`: the condition has not yet persisted ``after`` steps (a one-batch event is
  shown, not paged; one that recovers is reported as recovered), or a forecast's horizon is
  still longer than ``eta_within`` steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from logitwatch.server.alerts.detectors import KINDS, State

__all__ = ["REMEDIES", "SEVERITIES", "Downgrade", "Page", "RuleError", "RuleSpec", "State",
           "remedies_for"]

FP16_MAX = 65504.0
LOSS_STEPS_MAX = 2000  # the longest loss window a downgrade may name (steps)

#: Remedies from the field notes (docs/DESIGN.md), by topic; alerts carry the relevant ones.
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


SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Downgrade:
    """When a rule's alerts are less severe than its ``severity``.

    A sample is *downgraded* when the harm the rule warns of cannot happen on it and the
    loss shows no harm:

    * the frame's scalar ``metric`` is above ``above`` (by default: the attention's dtype
      max, ``attn.dtype_max``, is wider than float16's 65504, so the scores cannot overflow),
      or the frame carries the per-head ``capped_metric`` (``attn.capped_logit_max``: the
      attention soft-caps its scores, so what the softmax receives is bounded by the cap
      whatever the raw logits do);
    * and the loss has not risen: the median of its samples over the last ``loss_window``
      **steps** is less than ``loss_rise`` nats above the lowest such median of the run
      (``loss_rise: null``: the loss is not consulted), or it is winning that ground back
      (``recover_span``: its level, the median of its newest ``recover_span`` steps, has
      come down from the highest level it had within the ``loss_window`` by at least
      ``recover_share`` of that peak's height over the run's best level: a bump being
      recovered from, which the loss rules judge, not ground being lost; ``null``: any
      rise counts).

    A frame with neither ``metric`` nor ``capped_metric`` is never downgraded (a job that
    does not say). An alert that fires on a downgraded sample is stored with severity
    ``to`` and ``note``; if a later sample of the same episode is not downgraded (the loss
    rose), it is escalated to the rule's severity (``evidence.escalated_step``).
    """

    to: str = "info"
    metric: str = "attn.dtype_max"
    above: float = FP16_MAX
    loss_rise: float | None = 0.25
    loss_window: int = 100
    note: str = ""
    capped_metric: str | None = "attn.capped_logit_max"
    recover_span: int | None = None
    recover_share: float = 0.5

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
        if self.capped_metric is not None and (not isinstance(self.capped_metric, str)
                                               or not self.capped_metric):
            raise RuleError("downgrade.capped_metric must be a per-head metric's name or null")
        w = self.loss_window
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= LOSS_STEPS_MAX:
            raise RuleError(f"downgrade.loss_window must be an int in 1..{LOSS_STEPS_MAX} "
                            f"(steps), got {w!r}")
        g = self.recover_span
        if g is not None and (isinstance(g, bool) or not isinstance(g, int)
                              or not 2 <= g <= w // 2):
            raise RuleError(f"downgrade.recover_span must be null or an int in "
                            f"2..loss_window/2 ({w // 2}), got {g!r}")
        if g is not None and self.loss_rise is None:
            raise RuleError("downgrade.recover_span needs loss_rise (it qualifies a loss rise)")
        c = self.recover_share
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c <= 1:
            raise RuleError(f"downgrade.recover_share must be a number in (0, 1], got {c!r}")

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, d: Any) -> Downgrade:
        """Build from a mapping; raises :class:`RuleError` on unknown fields."""
        return _from_mapping(cls, d, "downgrade")


@dataclass(frozen=True)
class Page:
    """When a firing alert pages (reaches its rule's severity) rather than being shown as
    ``info``: a page needs persistence or a short horizon.

    * ``after``: the condition has held for this many steps since the episode started
      (counted on a breaching sample: a bump that recovers sooner is reported, as ``info``,
      and resolves as recovered; one that persists is escalated);
    * ``eta_within``: a forecast's ``evidence.eta_steps`` is at most this many steps (a
      crossing far ahead is shown with its horizon; one close enough to act on pages);
    * ``with_rules``: corroboration: one of these run-level rules breached on the same rank
      within ``within`` steps of this rule's newest breach (an unclipped gradient spike and a
      loss jump together are a blow-up; either alone may be one bad batch). With
      ``confirm_steps`` the two breaches must span at least that many steps (the event seen
      on more than one step: an unclipped run's single bad batch spikes the gradient and the
      loss together on one step, then recovers), unless the breaching sample is at least
      ``at_once_above`` over its baseline (the rule's unit: nats for the loss). With
      ``precursor_above`` a corroboration counts only when the newest breach of this rule
      or of the corroborating one carries an ``evidence.precursor`` at least that (the
      ``loss_jump`` kind's: the gradient norm at its highest in the ``precursor_steps``
      steps before the jump, over its median: an instability building up, where one
      garbage batch comes out of the blue; 0 on a breach of a run of jumps that does not
      take the loss to a new high for the run, as a garbage stretch's loss wanders under
      its first kick with the gradient up), or an ``evidence.aftershock`` at least
      ``aftershock_above`` (the ``loss_jump`` kind's: on a step within two of a jump whose
      loss is still out of range, and at least its ``aftershock_loss`` nats over its
      median, the gradient norm over its median: the kick's update
      damaged the weights, where a garbage batch the run shrugs off leaves the next
      batch's gradient modest). With ``confirm_adaptive`` the ``confirm_steps`` must be the
      loss's own when its step went in unclipped under an adaptive optimizer (the newest
      ``loss_jump`` breach of the pair carries ``evidence.adaptive`` and
      ``evidence.unclipped``): its episode has breached that many steps after it began,
      where otherwise the gradient's breach on the next step counts (Adam's and RMSprop's
      step is normalised by the gradient's running RMS, so one bad batch's update is
      bounded: its loss is back the next step while its gradient stays up a step longer).
      There ``at_once_above`` skips that hold only when the update of the step before the
      jump went in at ``at_once_adaptive_above`` times the gradient's median or more (the
      ``loss_jump`` kind's ``evidence.went_in``; null: any at-once jump): a garbage batch's
      own loss jumps after an ordinary step, a blow-up after the update that did it.
      With ``climb_above`` (and ``precursor_above``) the pair also counts when the newest
      ``loss_jump`` breach carries an ``evidence.climb`` at least that: a later step of a
      run of jumps (each within two steps of the last) that takes the loss that many nats
      over the run's earlier jumps (and over a higher jump in its wake): a blow-up is
      still up on its next steps and climbs past them, where a garbage stretch's loss
      wanders under its first kick and one garbage batch is back the next step;
    * ``repeats``: this episode is at least the ``repeats``-th of the rule on the same rank
      (run-level) to fire within ``repeats_within`` steps: bumps that each recover but keep
      coming back are an unstable run, not one bad batch. With ``repeats_built`` (and
      ``precursor_above``) an episode pages as the ``repeats_built``-th instead when its
      first breach came after a precursor (``evidence.precursor`` at least
      ``precursor_above``) and its step's update went in unclipped
      (``evidence.unclipped``): a loss that jumps again after the gradient built up, and
      nothing bounded it, is an instability, where bad batches come out of the blue.

    Any one of them pages. Until then the alert is stored as ``info`` with ``evidence.page``
    saying what would page it.
    """

    after: int | None = None
    eta_within: float | None = None
    note: str = ""
    with_rules: tuple[str, ...] = ()
    within: int = 5
    confirm_steps: int = 0
    at_once_above: float | None = None
    precursor_above: float | None = None
    aftershock_above: float | None = None
    repeats: int | None = None
    repeats_within: int = 20
    repeats_built: int | None = None
    confirm_adaptive: bool = False
    at_once_adaptive_above: float | None = None
    climb_above: float | None = None

    def __post_init__(self) -> None:
        a = self.after
        if a is not None and (isinstance(a, bool) or not isinstance(a, int) or a < 0):
            raise RuleError(f"page.after must be an int >= 0 (steps) or null, got {a!r}")
        e = self.eta_within
        if e is not None and (isinstance(e, bool) or not isinstance(e, (int, float))
                              or not e >= 0):
            raise RuleError(f"page.eta_within must be a number >= 0 (steps) or null, got {e!r}")
        w = self.with_rules
        if isinstance(w, list):
            object.__setattr__(self, "with_rules", w := tuple(w))
        if not isinstance(w, tuple) or not all(isinstance(x, str) and x for x in w):
            raise RuleError(f"page.with_rules must be a list of rule names, got {w!r}")
        n = self.within
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RuleError(f"page.within must be an int >= 0 (steps), got {n!r}")
        n = self.confirm_steps
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RuleError(f"page.confirm_steps must be an int >= 0 (steps), got {n!r}")
        x = self.at_once_above
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))
                              or not math.isfinite(x) or x < 0):
            raise RuleError(f"page.at_once_above must be a number >= 0 or null, got {x!r}")
        p = self.precursor_above
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float))
                              or not math.isfinite(p) or p < 0):
            raise RuleError(f"page.precursor_above must be a number >= 0 or null, got {p!r}")
        q = self.aftershock_above
        if q is not None and (isinstance(q, bool) or not isinstance(q, (int, float))
                              or not math.isfinite(q) or q < 0):
            raise RuleError(f"page.aftershock_above must be a number >= 0 or null, got {q!r}")
        if q is not None and p is None:
            raise RuleError("page.aftershock_above is an alternative to precursor_above: "
                            "give precursor_above too")
        c = self.climb_above
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float))
                              or not math.isfinite(c) or c < 0):
            raise RuleError(f"page.climb_above must be a number >= 0 (nats) or null, got {c!r}")
        if c is not None and p is None:
            raise RuleError("page.climb_above is an alternative to precursor_above: "
                            "give precursor_above too")
        if not isinstance(self.confirm_adaptive, bool):
            raise RuleError(f"page.confirm_adaptive must be true or false, got "
                            f"{self.confirm_adaptive!r}")
        if self.confirm_adaptive and not n:
            raise RuleError("page.confirm_adaptive says whose steps confirm_steps counts: "
                            "give confirm_steps too")
        u = self.at_once_adaptive_above
        if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float))
                              or not math.isfinite(u) or u < 0):
            raise RuleError(f"page.at_once_adaptive_above must be a number >= 0 or null, "
                            f"got {u!r}")
        if u is not None and (not self.confirm_adaptive or x is None):
            raise RuleError("page.at_once_adaptive_above qualifies at_once_above under "
                            "confirm_adaptive: give both")
        if (n or x is not None or p is not None) and not w:
            raise RuleError("page.confirm_steps, at_once_above and precursor_above qualify "
                            "with_rules: give with_rules too")
        r = self.repeats
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 2):
            raise RuleError(f"page.repeats must be an int >= 2 (episodes) or null, got {r!r}")
        n = self.repeats_within
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise RuleError(f"page.repeats_within must be an int >= 1 (steps), got {n!r}")
        b = self.repeats_built
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 2
                              or (r is not None and b > r)):
            raise RuleError(f"page.repeats_built must be an int from 2 to page.repeats "
                            f"(episodes) or null, got {b!r}")
        if b is not None and (p is None or r is None):
            raise RuleError("page.repeats_built lowers repeats after a precursor: give "
                            "repeats and precursor_above too")
        if a is None and e is None and not w and r is None:
            raise RuleError("page needs after (steps), eta_within (steps), with_rules or "
                            "repeats")
        if not isinstance(self.note, str):
            raise RuleError(f"page.note must be a string, got {self.note!r}")

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, d: Any) -> Page:
        """Build from a mapping; raises :class:`RuleError` on unknown fields."""
        return _from_mapping(cls, d, "page")


def _to_dict(spec: Any) -> dict[str, Any]:
    """A nested spec's fields as YAML/JSON-able values (tuples as lists)."""
    return {f.name: list(v) if isinstance(v := getattr(spec, f.name), tuple) else v
            for f in fields(spec)}


def _from_mapping(cls: Any, d: Any, label: str) -> Any:
    """``cls`` (a nested spec: :class:`Downgrade`, :class:`Page`) from a mapping of its
    fields; a :class:`RuleError` names the unknown ones."""
    if isinstance(d, cls):
        return d
    if not isinstance(d, Mapping):
        raise RuleError(f"{label} must be a mapping, got {type(d).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise RuleError(f"{label}: unknown fields {sorted(unknown)}; known: {sorted(known)}")
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
        for_steps: Steps the breach must have lasted (from the first breaching sample of
            the streak) before pending turns firing; with ``for_samples``, both must hold.
            A streak is broken by a calm sample, so at a wide interval a one-sample
            breach never fires a rule with ``for_steps`` > 0. A smoothed departure
            (``smooth``) counts from the first of its newest raw samples that all breach:
            its level is a median over many steps, and the samples under it say how long
            the breach has lasted (at interval 50, a level crossing on the second sample
            out fires there, not one sample later).
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
        page: When a firing alert pages (:class:`Page`), or ``None`` (at once).
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
    for_steps: int = 0
    page: Page | None = None

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
        v = self.for_steps
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise RuleError(f"rule {self.name!r}: for_steps must be an int >= 0, got {v!r}")
        k = self.keep_firing_for
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise RuleError(f"rule {self.name!r}: keep_firing_for must be an int >= 0 (steps) "
                            f"or null (the kind's default), got {k!r}")
        for attr, cls in (("downgrade", Downgrade), ("page", Page)):
            value = getattr(self, attr)
            if value is not None and not isinstance(value, cls):
                try:
                    object.__setattr__(self, attr, _from_mapping(cls, value, attr))
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
                "downgrade": None if self.downgrade is None else self.downgrade.to_dict(),
                "for_steps": self.for_steps,
                "page": None if self.page is None else self.page.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RuleSpec:
        """Build from a mapping (YAML file, API body); raises :class:`RuleError`."""
        if not isinstance(d, Mapping):
            raise RuleError(f"a rule must be a mapping, got {type(d).__name__}")
        known = {"name", "kind", "metric", "params", "over", "for_samples", "resolve_after",
                 "severity", "inhibits", "summary", "enabled", "keep_firing_for", "downgrade",
                 "for_steps", "page"}
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


# int params: windows and counts >= 1, min_samples of a slope >= 3, the rest (lag,
# min_history: steps) >= 0
_MIN_COUNT = {"window": 1, "samples": 1, "min_samples": 1, "also_window": 1}
_MIN_SLOPE_SAMPLES = {"trend": 3, "forecast": 3}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


#: parameters that name another series, or are null (not used)
_METRIC_OR_NULL = frozenset({"logit", "while_rising", "also_metric"})


def _param_problem(kind: str, key: str, v: Any) -> str:
    """What is wrong with ``v`` for ``kind``'s parameter ``key`` ('' when nothing): its type
    follows the kind's default, so a rule from YAML or the API cannot fail later, at ingest."""
    default = KINDS[kind].defaults[key]
    if isinstance(default, bool):
        return "" if isinstance(v, bool) else "must be true or false"
    if isinstance(default, int):
        low = (_MIN_SLOPE_SAMPLES.get(kind, 1) if key == "min_samples"
               else _MIN_COUNT.get(key, 0))
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= low
        return "" if ok else f"must be an integer >= {low}"
    if isinstance(default, float):
        return "" if _number(v) else "must be a number"
    if key in _METRIC_OR_NULL:
        return "" if v is None or (isinstance(v, str) and v) else "must be a metric name or null"
    if key == "also_rate":  # a share of steps (``grad.clipped``'s mean): above 1 never fires
        ok = v is None or (_number(v) and 0 <= v <= 1)
        return "" if ok else "must be a share from 0 to 1 or null"
    if default is None:
        return "" if v is None or _number(v) else "must be a number or null"
    if key == "op":
        return "" if v in ("<", ">") else "must be '<' or '>'"
    if key == "noise":
        return "" if v in ("level", "diff") else "must be 'level' or 'diff'"
    return "" if isinstance(v, str) and v else "must be a non-empty string"

