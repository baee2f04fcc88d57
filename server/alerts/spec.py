"""What an alert rule says (:class:`RuleSpec`), and checking it when it is read.

Every window, history and persistence a rule names is counted in **training steps**, never in
samples, so one rule means the same at any sampling interval: a job that sends every step, or
one that sends one step in 40 (the engine also judges per-head statistics at most once every
few steps, see :mod:`.engine`). A window that holds too few samples for its statistic at a
wide interval is widened to the newest few samples it needs (each kind's ``min_samples``).

A rule's severity can be *held back* two ways, and an alert that fired below its rule's
severity is escalated as soon as neither holds:

* :class:`~.hold_spec.Downgrade`: a frame scalar says the harm it warns of cannot happen
  (the attention dtype cannot overflow, or a soft-cap bounds what the softmax receives),
  unless the loss itself shows harm;
* :class:`~.hold_spec.Page`: the condition has not yet persisted ``after`` steps (a
  one-batch event is shown, not paged; one that recovers is reported as recovered), or a
  forecast's horizon is still longer than ``eta_within`` steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from logitwatch.server.alerts.detectors import KINDS, State
from logitwatch.server.alerts.hold_spec import (  # re-exported
    FP16_MAX,
    SEVERITIES,
    Downgrade,
    Page,
    RuleError,
    _from_mapping,
)

__all__ = ["FP16_MAX", "REMEDIES", "SERIES_PARAMS", "SEVERITIES", "Downgrade", "Page",
           "RuleError", "RuleSpec", "State", "remedies_for"]

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
    "hung": "The job stopped reporting: check whether it hung (NCCL, data loader) or crashed; "
            "if it runs on, its link to the collector is down (its client spools the frames "
            "and sends them once it is back: check the URL, proxy and firewall from its "
            "host).",
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
    "wiped": ("restart", "check_data"),
}


def remedies_for(metric: str, kind: str) -> list[str]:
    """The remedies an alert on ``metric`` of rule kind ``kind`` carries."""
    if kind == "no_data":
        topic = "hung"
    elif kind == "collapse":
        topic = "wiped"
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
        if KINDS[self.kind].every_frame and self.over == "cell":
            raise RuleError(f"rule {self.name!r}: kind {self.kind!r} judges every frame's max "
                            "(or min) over all heads: set over: max (or min)")
        if self.kind == "departure" and self.param("below") and self.param("margin") is None:
            raise RuleError(f"rule {self.name!r}: below (a departure judged downwards) needs "
                            "margin (a fall in the series' units); factor judges a ratio")

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
_MIN_COUNT = {"window": 1, "samples": 1, "min_samples": 1, "also_window": 1,
              "noise_window": 3, "climb_span": 1, "climb_window": 1, "fast_for": 1,
              "climbs": 1}
_MIN_SLOPE_SAMPLES = {"trend": 3, "forecast": 3}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


#: margins and rises (in the series' units): finite and >= 0, or null (not used)
_MARGINS = frozenset({"noise_margin", "climb", "slow_margin", "fast_margin", "fast_climb",
                      "fast_tolerance", "loss_up_max"})

#: parameters that name another series, or are null (not used)
_METRIC_OR_NULL = frozenset({"logit", "while_rising", "also_metric", "capped_metric",
                             "fast_not_falling"})
#: every parameter that names a series a rule reads beside its own (what rebuilding its
#: state after a restart must read back too)
SERIES_PARAMS = _METRIC_OR_NULL | {"other", "critical_metric", "loss_metric"}


def _param_problem(kind: str, key: str, v: Any) -> str:
    """What is wrong with ``v`` for ``kind``'s parameter ``key`` ('' when nothing): its type
    follows the kind's default, so a rule from YAML or the API cannot fail later, at ingest."""
    default = KINDS[kind].defaults[key]
    if key == "floor" and kind == "departure":  # no floor: null (a series judged below)
        return "" if v is None or _number(v) else "must be a number or null"
    if key in _MARGINS:  # negative or infinite: says nothing
        ok = v is None or (_number(v) and 0 <= v < math.inf)
        return "" if ok else "must be a finite number >= 0 or null"
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

