"""The lifecycle of alerts: what becomes of the transitions the rules report on a frame.

A firing transition stores an :class:`~logitwatch.server.db.models.Alert`, a snapshot of
the breach (value, baseline, limit, evidence, message, remedies), unless one is open for
the rule and layer: then more heads of the layer join it (grouping), or a breach within its
hold adds to its evidence (``evidence.breaches``, ``reopened``) and changes nothing else.
A resolving transition resolves it once no head of it is active. New alerts are stored
``suppressed`` while a rule with ``inhibits`` fires on the rank and has paged (``inhibited``), a
silence matches them (``silenced``), or a run-level alert of the same rule already paged
from another rank of the run and still fires (``duplicate``); an escalation judges the
silences and the duplicates again (:meth:`LifecycleMixin._raise`).

Severity: an alert fires below its rule's severity while the rule's
:class:`~logitwatch.server.alerts.rules.Downgrade` holds on the frame, or at ``info`` while
its :class:`~logitwatch.server.alerts.rules.Page` holds it back;
:meth:`LifecycleMixin._escalate` raises it to the rule's severity (and pages it:
``paged_step``) once neither holds (the downgrade is judged in :mod:`.downgrade`).
"""

from __future__ import annotations

import logging
import math
import time as _time
from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from logitwatch.server.alerts.downgrade import DowngradeMixin
from logitwatch.server.alerts.messages import (
    _downgrade_text,
    _finite,
    _fmt,
    _json,
    _lr_kept_text,
    _message,
    _page_text,
)
from logitwatch.server.alerts.recovery import _awaiting, _recovered, _unrecovered_due
from logitwatch.server.alerts.rules import (
    FrameView,
    RuleSpec,
    State,
    Transition,
    remedies_for,
)
from logitwatch.server.alerts.state import _Down, _loss_key
from logitwatch.server.db.models import Alert, Run, Silence
from logitwatch.server.store.ingest import NewFrame

__all__ = ["MAX_BREACHES", "PAGING", "LifecycleMixin"]

log = logging.getLogger("logitwatch.alerts")

MAX_BREACHES = 20  # re-breaches within a hold kept in an alert's evidence (the newest)
PAGING = ("warning", "critical")  # severities that page: an alert's paged_step


@dataclass(slots=True)
class _Pending:
    """A transition of one rule on one layer (its heads grouped) on its way to an alert."""

    rule: RuleSpec
    layer: int | None
    heads: list[int]
    transition: Transition
    severity: str = ""  # the alert's severity when it fires (a downgrade may lower it)
    downgraded: dict[str, object] | None = None  # why, when it was lowered
    kept: dict[str, object] | None = None  # why a downgrade did not lower it (lr_climb)
    unpaged: dict[str, object] | None = None  # what would page it, while its Page holds it
    paged_because: str | None = None  # why its Page let it page when it fired (a repeat)
    pages_on: str | None = None  # why it paged when it fired otherwise (PagePolicyMixin)


class LifecycleMixin(DowngradeMixin):
    """Firing, grouping, holds, resolution, suppression, downgrades and page holds of the
    alerts of an :class:`~logitwatch.server.alerts.engine.AlertEngine` (see the module's
    docstring)."""

    def _escalate(self, session: Session, f: NewFrame) -> list[Alert]:
        """Raise the open alerts of (run, rank) stored below their rule's severity once
        neither holds them any longer: the downgrade (re-judged on frames that carry
        per-head statistics, where the job says its dtype) and the page policy (judged on
        the rule's newest breach)."""
        down = self._down[(f.run_id, f.rank)]
        fv = FrameView(f.scalars, f.heads)
        rules = {r.name: r for r in self._rules}
        out: list[Alert] = []
        for name, layer in sorted(down.keys, key=lambda k: (k[0], k[1] is not None, k[1] or 0)):
            rule = rules.get(name)
            a = self._open_alert(session, f.run_id, f.rank, name, layer)
            if rule is None or a is None or a.severity == rule.severity:
                down.keys.discard((name, layer))
                continue
            ev = dict(a.evidence or {})
            reasons: list[str] = []
            d = rule.downgrade
            if d is not None and "downgraded" in ev and not ev.get("downgrade_lifted"):
                low = ev["downgraded"]
                at = low.get("loss_level_at_start") if isinstance(low, dict) else None
                at = at if isinstance(at, (int, float)) else None  # the level when it started
                if not f.heads or self._downgrade(
                        rule, f.run_id, f.rank, fv, a.started_step, at) is not None:
                    continue  # still lowered (or a frame that cannot say)
                x = fv.get(d.metric)
                if x is None or not x > d.above:
                    because = (f"{d.metric} = {_fmt(x)}" if x is not None else
                               f"the job no longer sends {d.metric}")
                elif (kept := self._lr_kept(rule, f.run_id, f.rank, fv)) is not None:
                    because = _lr_kept_text(kept)  # enough alone, even with the loss up
                else:
                    tr = self._loss.get(_loss_key(f.run_id, f.rank, d))
                    rise = math.inf if tr is None else tr.rise
                    because = (f"the loss (median of its last {d.loss_window} steps) rose "
                               f"{_fmt(rise)} nats above its best")
                    if (d.start_rise is not None and at is not None and tr is not None
                            and tr.now is not None):
                        because += (f", its level {_fmt(tr.now - at)} nats above where it "
                                    f"was when the episode started (step {a.started_step})")
                ev["downgrade_lifted"] = f.step
                reasons.append(because)
            if "page" in ev and not ev.get("page_due"):
                due = self._page_due(rule, f.run_id, f.rank, a, f.step)
                if due is None and "unrecovered" in ev:
                    up = self._not_back(rule, f.run_id, f.rank, a, f.step)
                    if up is None:  # its level came back: the bump recovered after all
                        down.keys.discard((name, layer))
                        _recovered(a, f.step, rule)
                        if a.suppressed is None:
                            out.append(a)
                        continue
                    due = _unrecovered_due(rule, a, f.step, up)
                if due is None:
                    a.evidence = ev
                    continue  # not persisted yet
                ev["page_due"] = f.step
                reasons.append(due)
            self._raise(session, f, rule, a, ev, "; ".join(reasons) or "its condition held")
            if a.suppressed is None:
                out.append(a)
        return out

    def _raise(self, session: Session, f: NewFrame, rule: RuleSpec, a: Alert,
               ev: dict[str, object], because: str) -> None:
        """Escalate the open alert ``a`` to ``rule``'s severity at frame ``f`` (paging it),
        with its evidence ``ev`` and why (``escalated_step``, ``escalated_because``, a line
        in the message); a run-level divergence alert marks its run diverged.

        The silences are judged again now, as for a new alert: under one that matches, the
        escalation is stored but ``suppressed="silenced"`` (not notified, ``evidence.
        silence`` its id), even for an alert that fired before the silence; once none
        matches, an alert that fired under a silence is no longer suppressed (the escalation
        is notified). An ``inhibited`` alert stays so."""
        down = self._down.get((f.run_id, f.rank))
        if down is not None:
            down.keys.discard((rule.name, a.layer))
        run = session.get(Run, f.run_id)
        a.severity = rule.severity
        if a.paged_step is None and rule.severity in PAGING:
            a.paged_step = f.step
        if rule.inhibits:  # a run-level divergence alert, confirmed now
            _diverged(run, a.fired_step)
        if a.suppressed != "inhibited":
            sid = self._silenced(session, run, rule.name, a.rank, a.layer, _time.time())
            if sid is not None:
                a.suppressed = "silenced"
                ev["silence"] = sid
            elif a.suppressed == "silenced":
                a.suppressed = None  # its silence ended: the escalation is news
                ev["silence_ended_step"] = f.step
        if a.suppressed is None:  # another rank's page may have said it already
            a.suppressed = self._duplicate(session, f, rule.name, a.layer, rule.severity, ev)
        ev.update(escalated_step=f.step, escalated_because=because)
        a.evidence = ev
        a.message = (f"{a.message} Escalated to {rule.severity} at step {f.step}: "
                     f"{because}.")
        (log.info if a.suppressed else log.warning)(
            "ALERT escalated: %s%s", a.message, f" ({a.suppressed})" if a.suppressed else "")

    # -- persistence -----------------------------------------------------------------------

    def _persist(self, session: Session, f: NewFrame, pending: list[_Pending]) -> list[Alert]:
        changed: list[Alert] = []
        if not pending:
            return changed
        run = session.get(Run, f.run_id)
        # resolutions first, then run-level firings (they inhibit), then per-head firings
        order = sorted(pending, key=lambda p: (p.transition.state is State.FIRING,
                                               p.layer is not None))
        for p in order:
            if p.transition.state is State.RESOLVED:
                a = self._resolve(session, f, p)
                if a is not None and a.suppressed is None:
                    changed.append(a)
                continue
            open_alert = self._open_alert(session, f.run_id, f.rank, p.rule.name, p.layer)
            if open_alert is not None and p.transition.reopened:
                _reopen(open_alert, p)  # a breach within the hold: the same episode
                continue
            if open_alert is not None and _awaiting(open_alert):
                # a new episode while an earlier one waits to recover: the same incident,
                # which pages now if the new episode pages on its own
                _reopen(open_alert, p)
                if self._page_again(session, f, p, open_alert) and \
                        open_alert.suppressed is None:
                    changed.append(open_alert)
                continue
            if open_alert is not None and p.layer is not None:
                # grouping: more heads of this layer joined the firing alert (a head that
                # resolved earlier in it is active again: stored, not news)
                heads = list(open_alert.heads or [])
                new = [h for h in p.heads if h not in heads]
                ev = dict(open_alert.evidence)
                active = set(ev.get("active_heads", heads))
                if not set(p.heads) <= active:
                    ev["active_heads"] = sorted(active | set(p.heads))
                    open_alert.evidence = ev
                if new:
                    open_alert.heads = heads + new
                    if open_alert.suppressed is None:
                        changed.append(open_alert)
                continue
            if open_alert is not None:
                continue  # deduplicated: already firing
            a = self._new_alert(session, f, run, p)
            if a.suppressed is None:
                changed.append(a)
        return changed

    def _open_alert(self, session: Session, run_id: int, rank: int, rule: str,
                    layer: int | None) -> Alert | None:
        q = select(Alert).where(Alert.run_id == run_id, Alert.rank == rank, Alert.rule == rule,
                                Alert.state == State.FIRING.value)
        q = q.where(Alert.layer.is_(None) if layer is None else Alert.layer == layer)
        return session.scalars(q.order_by(Alert.id.desc())).first()

    def _resolve(self, session: Session, f: NewFrame, p: _Pending) -> Alert | None:
        a = self._open_alert(session, f.run_id, f.rank, p.rule.name, p.layer)
        if a is None:
            return None
        if p.layer is not None:
            ev = dict(a.evidence)
            active = [h for h in ev.get("active_heads", a.heads or []) if h not in p.heads]
            ev["active_heads"] = active
            a.evidence = ev
            if active:
                return None
        ev = a.evidence or {}
        held = "page" in ev and a.paged_step is None and p.rule.severity != a.severity
        if held and self._not_back(p.rule, f.run_id, f.rank, a,
                                   p.transition.step) is not None:
            # held back by its Page, its condition cleared, but its level is not back where
            # it was (or cannot say yet): still open (at info) until it comes back or its
            # Page.after runs out
            if "unrecovered" not in ev:
                a.evidence = {**ev, "unrecovered": {"step": p.transition.step}}
            self._down.setdefault((f.run_id, f.rank), _Down()).keys.add((p.rule.name,
                                                                        p.layer))
            return None
        down = self._down.get((f.run_id, f.rank))
        if down is not None:
            down.keys.discard((p.rule.name, p.layer))
        if held:  # held back by its Page and cleared first: a bump that recovered
            _recovered(a, p.transition.step, p.rule)
        else:
            a.state = State.RESOLVED.value
            a.resolved_step = p.transition.step
        return a

    def _page_again(self, session: Session, f: NewFrame, p: _Pending, a: Alert) -> bool:
        """Page the alert ``a``, held open at ``info`` until its level comes back, when the
        new episode ``p`` of its rule pages on its own (its page policy let it through);
        return whether it did."""
        rule = p.rule
        if p.severity != rule.severity or rule.severity not in PAGING:
            return False
        because = p.paged_because or p.pages_on or "its condition held"
        self._raise(session, f, rule, a, {**(a.evidence or {}), "page_due": f.step},
                    f"it jumped again at step {p.transition.step}: {because}")
        return True

    def _duplicate(self, session: Session, f: NewFrame, rule: str, layer: int | None,
                   severity: str, ev: dict[str, object]) -> str | None:
        """``"duplicate"`` (naming the other alert in ``ev["duplicate_of"]``) when a paging
        run-level alert of ``rule`` on ``f``'s rank duplicates one firing on another rank of
        the run that paged and is not suppressed; else None. A job whose ranks each send
        their own frames (``reduce_ranks=False``, or detail ranks) has the same LR, global
        gradient norm and clip on every rank: one LR jump was one page per rank (128 pages
        on 64 ranks)."""
        if layer is not None or severity not in PAGING:
            return None
        row = session.execute(
            select(Alert.id, Alert.rank).where(
                Alert.run_id == f.run_id, Alert.rule == rule, Alert.layer.is_(None),
                Alert.rank != f.rank, Alert.state == State.FIRING.value,
                Alert.paged_step.is_not(None), Alert.suppressed.is_(None))
            .order_by(Alert.id).limit(1)).first()
        if row is None:
            return None
        ev["duplicate_of"] = {"alert": int(row.id), "rank": int(row.rank)}
        return "duplicate"

    def _inhibited(self, session: Session, run_id: int, rank: int) -> str | None:
        """The inhibiting rule firing on (run, rank) that has paged, if any. One held back at
        ``info`` by its :class:`~logitwatch.server.alerts.rules.Page` (a loss jump waiting to
        see whether it recovers) inhibits nothing: it told nobody, so another rule's page
        in the meantime (a loss climbing at the clip, the attention wiped) is the news."""
        names = [r.name for r in self._rules if r.inhibits]
        if not names:
            return None
        a = session.scalar(
            select(Alert).where(Alert.run_id == run_id, Alert.rank == rank,
                                Alert.rule.in_(names), Alert.state == State.FIRING.value,
                                Alert.paged_step.is_not(None)).limit(1))
        return None if a is None else a.rule

    def _silenced(self, session: Session, run: Run | None, rule: str, rank: int,
                  layer: int | None, now: float) -> int | None:
        q = select(Silence.id).where(Silence.starts_at <= now, Silence.ends_at > now)
        if run is not None:
            q = q.where(or_(Silence.project.is_(None), Silence.project == run.project),
                        or_(Silence.run.is_(None), Silence.run == run.name))
        q = q.where(or_(Silence.rule.is_(None), Silence.rule == rule),
                    or_(Silence.rank.is_(None), Silence.rank == rank))
        if layer is not None:
            q = q.where(or_(Silence.layer.is_(None), Silence.layer == layer))
        else:
            q = q.where(Silence.layer.is_(None))
        return session.scalar(q.limit(1))

    def _new_alert(self, session: Session, f: NewFrame, run: Run | None,
                   p: _Pending) -> Alert:
        t, rule = p.transition, p.rule
        v = t.verdict
        suppressed = None
        ev: dict[str, object] = {k: _json(x) for k, x in v.evidence.items()}
        if not rule.inhibits:
            by = self._inhibited(session, f.run_id, f.rank)
            if by is not None:
                suppressed = "inhibited"
                ev["inhibited_by"] = by
        sid = self._silenced(session, run, rule.name, f.rank, p.layer, _time.time())
        if sid is not None and suppressed is None:
            suppressed = "silenced"
            ev["silence"] = sid
        if suppressed is None:
            suppressed = self._duplicate(session, f, rule.name, p.layer,
                                         p.severity or rule.severity, ev)
        head = p.heads[0] if p.heads else None
        if p.heads:
            ev["active_heads"] = list(p.heads)
        ev.update({"rule_kind": rule.kind, "params": {k: _json(x) for k, x in
                                                       rule.params.items()},
                   "for_samples": rule.for_samples, "keep_firing_for": rule.hold})
        message = _message(run, rule, f.rank, p.layer, p.heads, t)
        if p.kept is not None:
            ev["kept_severity"] = p.kept
            message += f" Not lowered in a wide dtype: {_lr_kept_text(p.kept)}."
        if p.downgraded is not None:
            ev["downgraded"] = p.downgraded
            message += _downgrade_text(p.downgraded)
            self._down.setdefault((f.run_id, f.rank), _Down()).keys.add((rule.name, p.layer))
        if p.unpaged is not None:
            ev["page"] = p.unpaged
            message += _page_text(p.unpaged, rule.severity,
                                  rule.params.get("aftershock_loss"))
            self._down.setdefault((f.run_id, f.rank), _Down()).keys.add((rule.name, p.layer))
        elif p.paged_because is not None:
            ev["paged_because"] = p.paged_because
            message += f" It pages: {p.paged_because}."
        fin = v.value if math.isfinite(v.value) else None
        a = Alert(
            run_id=f.run_id, rule=rule.name,
            metric=str(v.evidence.get("judged_metric", rule.metric)),  # the series it read
            severity=p.severity or rule.severity,
            state=State.FIRING.value, rank=f.rank, layer=p.layer, head=head,
            started_step=t.started_step, fired_step=t.step, fired_at=f.time,
            value=fin, baseline=_finite(v.baseline), threshold=_finite(v.limit),
            message=message, evidence=ev,
            remedies=remedies_for(rule.metric, rule.kind), heads=list(p.heads) or None,
            suppressed=suppressed,
            paged_step=t.step if (p.severity or rule.severity) in PAGING else None,
        )
        session.add(a)
        if rule.inhibits and a.severity == rule.severity:  # not held back at a lower one
            _diverged(run, t.step)
        session.flush()
        (log.info if suppressed else log.warning)("ALERT %s%s", a.message,
                                                  f" ({suppressed})" if suppressed else "")
        return a


def _diverged(run: Run | None, step: int) -> None:
    """A run-level divergence alert (a rule with ``inhibits``) fired at its own severity
    on ``run`` at ``step``: the run's status is ``diverged`` from now on."""
    if run is not None and (run.diverged_step is None or step < run.diverged_step):
        run.diverged_step = step


def _reopen(a: Alert, p: _Pending) -> None:
    """A breach within the hold of the open alert ``a``: added to ``evidence.breaches``
    (the newest :data:`MAX_BREACHES`, ``breaches_dropped`` counts the older ones) and
    ``evidence.latest``; what the alert showed when it fired (``value``, ``baseline``,
    ``threshold``, message, the rest of its evidence) stays as it was."""
    t = p.transition
    v = t.verdict
    ev = dict(a.evidence)
    breach: dict[str, object] = {"step": t.step, "value": _json(v.value),
                                 "baseline": _json(v.baseline), "limit": _json(v.limit)}
    if p.heads:
        breach["heads"] = list(p.heads)
    breaches = [*ev.get("breaches", []), breach]
    if len(breaches) > MAX_BREACHES:
        ev["breaches_dropped"] = (int(ev.get("breaches_dropped", 0))
                                  + len(breaches) - MAX_BREACHES)
        breaches = breaches[-MAX_BREACHES:]
    ev["breaches"] = breaches
    ev["latest"] = {**breach, "evidence": {k: _json(x) for k, x in v.evidence.items()}}
    ev["reopened"] = int(ev.get("reopened", 0)) + 1
    ev["last_breach_step"] = t.step
    if p.heads:
        active = list(ev.get("active_heads", a.heads or []))
        ev["active_heads"] = sorted(set(active) | set(p.heads))
        a.heads = list(a.heads or []) + [h for h in p.heads if h not in (a.heads or [])]
    a.evidence = ev
