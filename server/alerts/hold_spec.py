"""How a rule's severity is held back, as a rule file says it (:class:`Downgrade`,
:class:`Page`), and what every part of a rule spec shares (:class:`RuleError`, the
mapping round trip). :mod:`.spec` holds the rule itself (:class:`~.spec.RuleSpec`) and
re-exports these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from logitwatch.server.alerts.detectors import FP16_MAX

__all__ = ["FP16_MAX", "LOSS_STEPS_MAX", "SEVERITIES", "Downgrade", "Page", "RuleError"]

LOSS_STEPS_MAX = 2000  # the longest loss window a downgrade may name (steps)
SEVERITIES = ("info", "warning", "critical")


class RuleError(ValueError):
    """A rule specification is invalid; the message says which field and why."""


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
      rise counts);
    * and, with ``lr_climb`` (the dtype case only; a cap lowers it whatever the LR does),
      the job's optimizer is not a plain one (``optim.adaptive`` = 0, e.g. SGD) whose
      learning rate has climbed by that share or more over the last ``loss_window`` steps
      (its newest value over its oldest there): a plain optimizer's step grows with the LR
      and the gradient, so logits leaving their range while the LR still climbs go on
      climbing with it and blow up before the loss shows it; an adaptive optimizer's step is
      normalised, and its logits climbing under a warm-up are the wide-dtype case above
      (``null``: the LR is not consulted);
    * and, with ``start_rise`` (needs ``recover_span``), a loss that has risen counts as
      harm only once its level has also climbed ``start_rise`` nats or more above its level
      at the step the episode started (the rule's metric left its range; a negative value
      is a tolerance: the level may sit that far under it): a loss already up when the
      logits left their range, for another cause (an LR bump, garbage batches), and no
      higher since, is that cause's bump, which the loss rules judge (``null``: the rise is
      judged from the run's best alone).

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
    lr_climb: float | None = None
    start_rise: float | None = None

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
        u = self.lr_climb
        if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float))
                              or not u > 0):
            raise RuleError(f"downgrade.lr_climb must be a positive share (0.1: the LR up 10 %) "
                            f"or null, got {u!r}")

        r = self.start_rise
        if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float))
                              or not (self.loss_rise is None or r > -self.loss_rise)):
            raise RuleError(f"downgrade.start_rise must be a number of nats above -loss_rise "
                            f"(negative: a tolerance under the start's level) or null, "
                            f"got {r!r}")
        if r is not None and g is None:
            raise RuleError("downgrade.start_rise needs recover_span (it compares the loss's "
                            "level now with its level when the episode started)")

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
      With ``repeats_aftershock`` (a fraction) an episode does not count when an earlier
      one within ``repeats_within`` steps before it jumped more than ``1/repeats_aftershock``
      times as far (each episode's jump: its value over its baseline when it fired): the
      smaller jumps after one big kick are that kick's aftershocks while the weights heal,
      where the bumps of an unstable run keep their height or grow.
    * ``recover_within`` (nats, the rule's unit; with ``after``): an episode held back at
      ``info`` counts as recovered only once the level of the rule's series (the median of
      its newest ``recover_steps`` steps) is back within this much of its level before the
      episode (the alert's baseline, or the higher median of the detector's whole window when
      it measured the jump from that: ``evidence.level``). An episode whose condition
      clears with the level still further up stays open, and pages once ``after`` steps
      have passed since it started without that: a bad batch the run shrugs off comes
      back, one that damaged it for good leaves the loss a step higher, under the jump
      detector's limit but not where it was. Without it (null), an episode that clears
      first is recovered.

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
    repeats_aftershock: float | None = None
    confirm_adaptive: bool = False
    at_once_adaptive_above: float | None = None
    climb_above: float | None = None
    recover_within: float | None = None
    recover_steps: int = 20

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
        f = self.repeats_aftershock
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float))
                              or not 0 < f < 1):
            raise RuleError(f"page.repeats_aftershock must be a number between 0 and 1 "
                            f"(a fraction of an earlier jump) or null, got {f!r}")
        if f is not None and r is None:
            raise RuleError("page.repeats_aftershock qualifies repeats: give repeats too")
        v = self.recover_within
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v) or v < 0):
            raise RuleError(f"page.recover_within must be a number >= 0 (the rule's unit) or "
                            f"null, got {v!r}")
        if v is not None and a is None:
            raise RuleError("page.recover_within pages an episode that has not recovered "
                            "after page.after steps: give after too")
        g = self.recover_steps
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise RuleError(f"page.recover_steps must be an int >= 1 (steps), got {g!r}")
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
