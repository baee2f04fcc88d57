"""What pages: the :class:`~logitwatch.server.alerts.rules.Page` policy of a firing alert.

A rule with a ``page`` fires as ``info`` until persistence, a short forecast horizon, a
corroborating rule (qualified by ``confirm_steps`` / ``at_once_above`` and by a precursor or
damage), or repeated episodes say it should page; :class:`PagePolicyMixin` judges that on the
firing sample (:meth:`~PagePolicyMixin._page_policy`) and on each later breach
(:meth:`~PagePolicyMixin._page_due`, which the lifecycle's escalation asks). Split from the
lifecycle module, which stores and escalates what this decides.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from logitwatch.server.alerts.rules import Page, RuleSpec, Track, Verdict
from logitwatch.server.alerts.state import RankState
from logitwatch.server.db.models import Alert

if TYPE_CHECKING:
    from logitwatch.server.alerts.lifecycle import _Pending

__all__ = ["PagePolicyMixin"]


class PagePolicyMixin(RankState):
    """The page policy of an :class:`~logitwatch.server.alerts.engine.AlertEngine`'s alerts
    (see the module's docstring)."""

    def _page_policy(self, p: _Pending, run_id: int, rank: int) -> None:
        """Judge a firing alert by its rule's :class:`~.rules.Page` on the firing sample:
        ``p.unpaged`` says what would page one it holds back at ``info``; one that pages at
        once keeps why in ``p.pages_on`` (persistence, horizon, corroboration), or in
        ``p.paged_because`` as a repeat (which its message also says)."""
        rule, t = p.rule, p.transition
        pg = rule.page
        if pg is None or rule.severity == "info":
            return
        if pg.after is not None and t.step - t.started_step >= pg.after:
            p.pages_on = f"it persisted {t.step - t.started_step} steps"
            return
        eta = t.verdict.evidence.get("eta_steps")
        if pg.eta_within is not None and eta is not None and eta <= pg.eta_within:
            p.pages_on = f"the crossing is ~{eta} steps away"
            return
        pair = self._pair_pages(pg, run_id, rank, rule.name, t.verdict, t.step,
                                t.started_step)
        if pair is not None:
            p.pages_on = f"corroborated: {pair[0]} breached at step {pair[1]}{pair[2]}"
            return
        p.paged_because = self._repeated(rule, run_id, rank, t.step, t.verdict)
        if p.paged_because is None:
            p.unpaged = {"after": pg.after, "eta_within": pg.eta_within, "note": pg.note,
                         "with_rules": list(pg.with_rules), "repeats": pg.repeats,
                         "repeats_within": pg.repeats_within}
            if pg.confirm_steps:
                p.unpaged.update(confirm_steps=pg.confirm_steps,
                                 at_once_above=pg.at_once_above)
            if pg.confirm_adaptive:
                p.unpaged.update(confirm_adaptive=True)
            if pg.at_once_adaptive_above is not None:
                p.unpaged.update(at_once_adaptive_above=pg.at_once_adaptive_above)
            if pg.precursor_above is not None:
                p.unpaged.update(precursor_above=pg.precursor_above)
            if pg.aftershock_above is not None:
                p.unpaged.update(aftershock_above=pg.aftershock_above)
            if pg.climb_above is not None:
                p.unpaged.update(climb_above=pg.climb_above)
            if pg.repeats_built is not None:
                p.unpaged.update(repeats_built=pg.repeats_built)
            if pg.repeats_aftershock is not None:
                p.unpaged.update(repeats_aftershock=pg.repeats_aftershock)
            if pg.recover_within is not None:
                p.unpaged.update(recover_within=pg.recover_within,
                                 recover_steps=pg.recover_steps, metric=rule.metric)

    def _repeated(self, rule: RuleSpec, run_id: int, rank: int, step: int,
                  v: Verdict) -> str | None:
        """Why a run-level episode firing at ``step`` with ``v`` pages as a repeat
        (``Page.repeats`` episodes of ``rule`` fired within ``Page.repeats_within`` steps,
        ``Page.repeats_built`` when ``v`` came after a precursor and went unclipped), or
        None."""
        pg = rule.page
        if pg is None or pg.repeats is None:
            return None
        t = self._tracks.get((rule.name, run_id, rank, None, None))
        if t is None:
            return None
        recent = _counted(t, step, pg)
        need, built = pg.repeats, ""
        if pg.repeats_built is not None and pg.precursor_above is not None:
            x = v.evidence.get("precursor")
            if isinstance(x, (int, float)) and x >= pg.precursor_above \
                    and v.evidence.get("unclipped") is True:
                need = pg.repeats_built
                built = (f", after a precursor (the gradient norm {x:.3g}x its median in the "
                         "steps before), unclipped")
        if len(recent) < need:
            return None
        return (f"episode {len(recent)} within {pg.repeats_within} steps (fired at steps "
                f"{', '.join(map(str, recent))}){built}")

    def _corroborated(self, pg: Page, run_id: int, rank: int, step: int
                      ) -> tuple[str, int] | None:
        """The first of ``pg.with_rules`` that breached on (run, rank) within ``pg.within``
        steps of ``step``, and the step it breached, or None."""
        for name in pg.with_rules:
            t = self._tracks.get((name, run_id, rank, None, None))
            if t is not None and t.last_breach is not None \
                    and abs(t.last_breach[0] - step) <= pg.within:
                return name, t.last_breach[0]
        return None

    def _pair_pages(self, pg: Page, run_id: int, rank: int, name: str, v: Verdict,
                    own: int, started: int) -> tuple[str, int, str] | None:
        """The corroborating rule, its breach step and what let the pair through when rule
        ``name``'s breach ``v`` at ``own`` (its episode started at ``started``) pages with
        it under ``pg``: ``with_rules``, ``confirm_steps`` / ``at_once_above`` and
        ``precursor_above`` / ``aftershock_above`` (:class:`~.spec.Page`); else None."""
        other = self._corroborated(pg, run_id, rank, own)
        if other is None or not _confirmed(pg, v, other[1], own, started):
            return None
        if pg.confirm_adaptive and not self._loss_held(pg, run_id, rank, name, other[0]) \
                and not (_at_once(pg, v) and self._went_in(pg, run_id, rank, name, other[0])):
            return None
        why = self._pair_cause(pg, run_id, rank, name, other[0])
        return None if why is None else (*other, why)

    def _loss_held(self, pg: Page, run_id: int, rank: int, *names: str) -> bool:
        """Under ``pg.confirm_adaptive``: False when the newest breach of one of the rules
        ``names`` (the loss's) went in unclipped under an adaptive optimizer
        (``evidence.adaptive`` and ``evidence.unclipped``) and its episode has not breached
        ``pg.confirm_steps`` steps after it began; else True (not such a job, or held)."""
        for name in names:
            t = self._tracks.get((name, run_id, rank, None, None))
            if t is None or t.last_breach is None:
                continue
            ev = t.last_breach[1].evidence
            if ev.get("adaptive") is True and ev.get("unclipped") is True:
                return t.last_breach[0] - t.started_step >= pg.confirm_steps
        return True

    def _went_in(self, pg: Page, run_id: int, rank: int, *names: str) -> bool:
        """Under ``pg.at_once_adaptive_above``: whether the newest breach of one of the rules
        ``names`` that carries ``evidence.went_in`` (the loss's) followed an update of at
        least that many times the gradient's median; True when the option is off."""
        if pg.at_once_adaptive_above is None:
            return True
        for name in names:
            t = self._tracks.get((name, run_id, rank, None, None))
            if t is None or t.last_breach is None:
                continue
            x = t.last_breach[1].evidence.get("went_in")
            if isinstance(x, (int, float)):
                return x >= pg.at_once_adaptive_above
        return False

    def _pair_cause(self, pg: Page, run_id: int, rank: int, *names: str) -> str | None:
        """What lets a corroboration between the run-level rules ``names`` page under
        ``pg.precursor_above``: the newest breach of one of them carries an
        ``evidence.precursor`` at least that, an ``evidence.aftershock`` at least
        ``pg.aftershock_above`` or an ``evidence.climb`` at least ``pg.climb_above``; the
        text says which (empty when there is no such gate, or no breach carries a
        precursor: a job that sends neither every step's scalars nor frames near the
        breach cannot tell); None when it does not pass. Judged per breach,
        not per episode: a blow-up may follow an earlier bump of the same episode."""
        if pg.precursor_above is None:
            return ""
        said = False
        for name in names:
            t = self._tracks.get((name, run_id, rank, None, None))
            ev = t.last_breach[1].evidence if t is not None and t.last_breach is not None \
                else {}
            x, y, c = ev.get("precursor"), ev.get("aftershock"), ev.get("climb")
            if isinstance(x, (int, float)):
                said = True
                if x >= pg.precursor_above:
                    return (f", after a precursor (the gradient norm {x:.3g}x its median in "
                            "the steps before the loss jump)")
            if (isinstance(c, (int, float)) and pg.climb_above is not None
                    and c >= pg.climb_above):
                return (f", climbing (the loss {c:.3g} nats over the earlier jumps of its "
                        "run, each within two steps of the last)")
            if (isinstance(y, (int, float)) and pg.aftershock_above is not None
                    and y >= pg.aftershock_above):
                z = ev.get("aftershock_loss")
                still = (f"{z:.3g} over its median" if isinstance(z, (int, float))
                         and math.isfinite(z) else "out of range")
                return (f", after damage (the gradient norm {y:.3g}x its median on a batch "
                        f"after the jump, the loss still {still})")
        return None if said else ""

    def _page_due(self, rule: RuleSpec, run_id: int, rank: int, a: Alert,
                  step: int) -> str | None:
        """Why the alert ``a``, held back by ``rule.page``, pages now (its cells breach at
        ``step`` and have persisted, or forecast a crossing close enough), else None."""
        pg = rule.page
        if pg is None:
            return "its condition held"
        if a.layer is None:
            tracks = [self._tracks.get((rule.name, run_id, rank, None, None))]
        else:
            c = self._cells_of.get((rule.name, run_id, rank))
            tracks = [(c.tracks.get((a.layer, h)) if c is not None else
                       self._tracks.get((rule.name, run_id, rank, a.layer, h)))
                      for h in (a.heads or [])]
        for t in tracks:
            if t is None or t.last_breach is None:
                continue
            own = t.last_breach[0]
            if pg.with_rules and step - own <= pg.within:
                other = self._pair_pages(pg, run_id, rank, rule.name, t.last_breach[1],
                                         own, a.started_step)
                if other is not None:
                    return f"corroborated: {other[0]} breached at step {other[1]}{other[2]}"
            if own != step:
                continue
            if pg.after is not None and step - a.started_step >= pg.after:
                return (f"it persisted {step - a.started_step} steps (since step "
                        f"{a.started_step})")
            eta = t.last_breach[1].evidence.get("eta_steps")
            if pg.eta_within is not None and eta is not None and eta <= pg.eta_within:
                return f"the crossing is now ~{eta} steps away"
        return None


def _at_once(pg: Page, v: Verdict) -> bool:
    """Whether the breach ``v`` is ``pg.at_once_above`` or more over its baseline."""
    return (pg.at_once_above is not None and v.baseline is not None
            and v.value - v.baseline >= pg.at_once_above)


def _confirmed(pg: Page, v: Verdict, other: int, own: int, started: int) -> bool:
    """Whether a corroboration (this rule breaching at ``own`` with ``v``, its episode
    started at ``started``; a ``with_rules`` rule breaching at ``other``) pages under
    ``pg.confirm_steps`` / ``pg.at_once_above`` (:class:`~.spec.Page`)."""
    if not pg.confirm_steps or _at_once(pg, v):
        return True
    return max(own, other) - min(started, other) >= pg.confirm_steps


def _counted(t: Track, step: int, pg: Page) -> list[int]:
    """The firing steps of ``t``'s episodes within ``pg.repeats_within`` steps of ``step``
    that count toward ``pg.repeats``: all of them, or with ``pg.repeats_aftershock`` those
    that are not an aftershock (a jump under that fraction of the jump of an earlier episode
    within ``repeats_within`` steps before it; jumps compared by size, so a rule that
    breaches downwards reads its drops alike). Episodes are taken in firing order, not by
    step: a job restarted from a checkpoint may fire twice at one step."""
    f = pg.repeats_aftershock
    out = []
    for i, (s, j) in enumerate(t.fired):
        if not 0 <= step - s <= pg.repeats_within:
            continue
        if f is not None and j is not None and any(
                e is not None and 0 <= s - e0 <= pg.repeats_within and abs(j) < f * abs(e)
                for e0, e in t.fired[:i]):
            continue
        out.append(s)
    return out
