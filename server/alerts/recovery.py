"""Held-back episodes that wait for their level: a rule's ``Page.recover_within``.

An alert its :class:`~logitwatch.server.alerts.rules.Page` holds back at ``info`` whose
condition clears is a bump that recovered only once the level of the rule's series (the
median of its newest ``recover_steps`` steps, over the steps since the episode started) is
back within ``recover_within`` of its level before (:func:`_before`). Until then it stays
open (``evidence.unrecovered``; :func:`_awaiting`); once back it resolves as recovered
(:func:`_recovered`, which turns ``evidence.unrecovered`` into ``evidence.waited``, from and
until); ``Page.after`` steps after it started with the level still up, it pages
(:func:`_unrecovered_due`). :class:`RecoveryMixin` judges the level; the lifecycle
module stores and escalates what this decides.
"""

from __future__ import annotations

import math

from logitwatch.server.alerts.messages import _fmt, _json
from logitwatch.server.alerts.page_policy import PagePolicyMixin
from logitwatch.server.alerts.rules import RuleSpec, State
from logitwatch.server.alerts.state import _level_key
from logitwatch.server.db.models import Alert

__all__ = ["RecoveryMixin"]


class RecoveryMixin(PagePolicyMixin):
    """Whether a held-back alert's level is back (see the module's docstring)."""

    def _not_back(self, rule: RuleSpec, run_id: int, rank: int, a: Alert,
                  step: int) -> dict[str, object] | None:
        """Why the held-back alert ``a`` has not recovered at ``step`` under its rule's
        ``Page.recover_within``: the level of the rule's series (over the steps since the
        episode started, once ``recover_steps`` steps have passed) sits more than that above
        its level before (:func:`_before`; ``above``), or cannot be judged yet (``above``
        None); None when it is back (or the rule does not ask, or the alert has no level
        before to judge by)."""
        pg = rule.page
        base = _before(a)
        if pg is None or pg.recover_within is None or base is None:
            return None
        why: dict[str, object] = {"above": None, "recover_within": pg.recover_within,
                                  "recover_steps": pg.recover_steps}
        if step - a.started_step < pg.recover_steps:
            return why  # too soon: the level would still be the bump's own steps
        lv = self._levels.get(_level_key(run_id, rank, rule))
        level = None if lv is None else lv.level(since=a.started_step)
        if level is None:
            return why  # too few values since it started (a wide interval, no history)
        if level - base <= pg.recover_within:
            return None
        return {**why, "level": _json(level), "before": _json(base),
                "above": _json(level - base)}


def _before(a: Alert) -> float | None:
    """The level of the alert ``a``'s series before its episode: its baseline, or the
    higher window median its detector measured the jump from (``evidence.level``: after a
    stretch of trivially easy batches the newest values sit far below the run's level)."""
    xs = [x for x in (a.baseline, (a.evidence or {}).get("level"))
          if isinstance(x, (int, float)) and math.isfinite(x)]
    return max(xs) if xs else None


def _awaiting(a: Alert) -> bool:
    """Whether the open alert ``a`` is held open only until its level comes back
    (``Page.recover_within``): its condition cleared, and it has not paged."""
    return a.paged_step is None and "unrecovered" in (a.evidence or {})


def _recovered(a: Alert, step: int, rule: RuleSpec) -> None:
    """Resolve the held-back alert ``a`` at ``step`` as a bump that recovered without
    paging (with ``Page.recover_within``: its level back within that of its level before,
    :func:`_before`)."""
    a.state = State.RESOLVED.value
    a.resolved_step = step
    ev = dict(a.evidence or {})
    waited = ev.pop("unrecovered", None)  # it was waiting for its level: say it came back
    if isinstance(waited, dict):
        ev["waited"] = {"from": waited.get("step"), "until": step}
    a.evidence = {**ev, "recovered": True, "recovered_step": step}
    pg = rule.page
    base = _before(a)
    back = (f" (the {rule.metric}'s level, the median of its last {pg.recover_steps} steps, "
            f"back within {_fmt(pg.recover_within)} of its level before, {_fmt(base)})"
            if pg is not None and pg.recover_within is not None and base is not None
            else "")
    a.message = f"{a.message} Recovered at step {step} without paging{back}."


def _unrecovered_due(rule: RuleSpec, a: Alert, step: int,
                     up: dict[str, object]) -> str | None:
    """Why the held-back alert ``a``, whose condition cleared with its level still up
    (``up``: :meth:`RecoveryMixin._not_back`), pages at ``step``: ``Page.after`` steps have
    passed since it started; else None."""
    pg = rule.page
    if pg is None or pg.after is None or step - a.started_step < pg.after \
            or up.get("above") is None:
        return None
    return (f"it did not recover: {step - a.started_step} steps after it started (step "
            f"{a.started_step}), the {rule.metric}'s level (the median of its last "
            f"{pg.recover_steps} steps) is {_fmt(up['above'])} above its level before, "
            f"{_fmt(up['before'])}, more than {_fmt(pg.recover_within)}")
