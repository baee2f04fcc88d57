"""Whether a frame lowers a rule's severity: its :class:`~.rules.Downgrade`.

An alert fires below its rule's severity while the downgrade holds: the attention cannot
overflow on the frame (a wide dtype, or a soft-cap) and the loss shows no harm, judged on
the (run, rank)'s loss tracker (:mod:`.loss_levels`): risen less than ``loss_rise`` above
its best, or winning a bump back, or (``start_rise``) no higher than when the episode
started; unless a plain optimizer's LR still climbs (``lr_climb``).
:class:`DowngradeMixin` answers on a frame why (the evidence kept as
``evidence.downgraded``) or None; the lifecycle stores and escalates what it decides.
"""

from __future__ import annotations

from logitwatch.server.alerts.messages import _json
from logitwatch.server.alerts.recovery import RecoveryMixin
from logitwatch.server.alerts.rules import FrameView, RuleSpec
from logitwatch.server.alerts.state import _loss_key

__all__ = ["DowngradeMixin"]


class DowngradeMixin(RecoveryMixin):
    """A rule's downgrade judged on a frame (see the module's docstring)."""

    def _downgrade(self, rule: RuleSpec, run_id: int, rank: int, fv: FrameView,
                   started: int | None = None,
                   start_level: float | None = None) -> dict[str, object] | None:
        """Why this frame lowers ``rule``'s severity, or None when it does not. ``started``:
        the step its episode started; ``start_level``: the loss's level then, as the alert
        kept it (``Downgrade.start_rise``; else read from the tracker at ``started``)."""
        d = rule.downgrade
        if d is None:
            return None
        x = fv.get(d.metric)
        capped = d.capped_metric is not None and d.capped_metric in fv.heads
        if not capped and (x is None or not x > d.above):
            return None  # no word on the dtype, or one that can overflow: as severe as ever
        why: dict[str, object] = {"from": rule.severity, "to": d.to, "metric": d.metric,
                                  "value": _json(x), "above": d.above}
        if capped:
            why["capped_metric"] = d.capped_metric
        if self._lr_kept(rule, run_id, rank, fv) is not None:
            return None  # a plain optimizer's LR still climbing: the logits climb with it
        if d.loss_rise is not None:
            tr = self._loss.get(_loss_key(run_id, rank, d))
            rise, won_back = (0.0, 0.0) if tr is None else (tr.rise, tr.won_back)
            recovering = d.recover_span is not None and won_back >= d.recover_share
            since = None  # the level's climb since the episode started
            if d.start_rise is not None and tr is not None:
                if start_level is None and started is not None:
                    start_level = tr.level_at(started)
                if start_level is not None and tr.now is not None:
                    since = tr.now - start_level
                    why.update(loss_level_at_start=round(start_level, 4), started_step=started,
                               start_rise=d.start_rise)
            before = since is not None and since < (d.start_rise or 0.0)  # set with since
            if rise >= d.loss_rise and not recovering and not before:
                return None  # the loss shows harm
            why.update(loss_rise=round(rise, 4), loss_rise_limit=d.loss_rise,
                       loss_window=d.loss_window)
            if rise >= d.loss_rise and recovering:  # held back: winning it back
                why.update(loss_recovering=True, loss_won_back=round(won_back, 3),
                           recover_span=d.recover_span, recover_share=d.recover_share)
            elif rise >= d.loss_rise:  # held back: up already when the episode started
                why.update(loss_before=True, loss_since_start=round(since or 0.0, 4),
                           recover_span=d.recover_span)
        if d.note:
            why["note"] = d.note
        return why

    def _lr_kept(self, rule: RuleSpec, run_id: int, rank: int,
                 fv: FrameView) -> dict[str, object] | None:
        """Why ``rule`` keeps its severity in a wide dtype on this frame because a plain
        optimizer's LR still climbs (:class:`~.rules.Downgrade`'s ``lr_climb``), or None."""
        d = rule.downgrade
        if d is None or d.lr_climb is None or fv.get("optim.adaptive") != 0.0:
            return None
        x = fv.get(d.metric)
        if x is None or not x > d.above or (d.capped_metric is not None
                                            and d.capped_metric in fv.heads):
            return None  # not lowered by the dtype anyway, or lowered by a cap
        tr = self._loss.get(_loss_key(run_id, rank, d))
        if tr is None or tr.lr_climb < d.lr_climb:
            return None
        return {"lr_climb": round(tr.lr_climb, 4), "lr_climb_limit": d.lr_climb,
                "loss_window": d.loss_window, "metric": d.metric, "value": _json(x)}
