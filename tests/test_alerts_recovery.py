"""A held-back loss jump is "recovered" only when the loss's level is back, and pages when
it is not (``Page.recover_within``): a bad batch the run shrugs off is shown and resolves,
one that left the run worse for good pages once ``Page.after`` steps have passed. A
recovered alert says how long it waited (``evidence.waited``); a new jump while it waits
joins it and pages it when the jump pages on its own terms (a repeat, a corroborated
blow-up).

Before this, an episode resolved as recovered on its first step under the jump detector's
limit: a garbage stretch that left the loss 0.6-0.7 nat up for good, under that limit, was
reported "Recovered" and never paged.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.alerts.defaults import DEFAULT_RULES
from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.alerts.rules import Page, RuleError
from logitwatch.server.db.models import Alert
from tests.alert_frames import alerts_of, by_rule, defaults_with, feed, frames_at, growing

#: the defaults' limit: a loss level this far above where it was before the jump is not back
WITHIN = next(r for r in DEFAULT_RULES if r.name == "loss_jump").page.recover_within  # type: ignore[union-attr]
_RNG = random.Random(3)
_NOISE = [_RNG.gauss(0.0, 0.12) for _ in range(3000)]  # batch noise, 0.12 nat


def _garbage_then(after: Any, start: int = 400, length: int = 10):  # type: ignore[no-untyped-def]
    """A plateau at 3 nats with batch noise; ``length`` garbage batches (+8 nats) from
    ``start``; then the loss sits ``after(step)`` nats above the plateau."""
    def scalars(step: int) -> dict[str, float]:
        v = 3.0 + _NOISE[step]
        if start <= step < start + length:
            v += 8.0
        elif step >= start + length:
            v += after(step)
        return {"loss": v, "lr": 1e-3}
    return scalars


def _stays_up(step: int) -> float:
    return 0.7  # under the jump detector's limit on this noise, above the defaults' 0.5


def _comes_back(step: int) -> float:
    return max(0.0, 0.7 - 0.02 * (step - 410))  # back on the plateau by step 445


def test_the_defaults_ask_for_the_level_to_come_back() -> None:
    assert WITHIN is not None and 0 < WITHIN < 1


@pytest.mark.parametrize("k", [1, 10, 40])
def test_a_bump_that_leaves_the_loss_higher_pages_once_after_has_passed(k: int) -> None:
    """Ten garbage batches, then the loss settles 0.7 nat above where it was: the jump is
    shown (info), not reported recovered, and pages 100 steps after it started, saying so,
    at every interval (every step's loss travels as history)."""
    alerts = alerts_of(frames_at(k, 700, _garbage_then(_stays_up), history=k > 1))
    (a,) = by_rule(alerts, "loss_jump")
    assert a.severity == "critical" and a.started_step == 400, a.evidence
    assert a.paged_step is not None and 500 <= a.paged_step <= 500 + k, a.paged_step
    assert a.state == "firing" and not a.evidence.get("recovered")
    because = a.evidence["escalated_because"]
    assert because.startswith("it did not recover: 100 steps after it started (step 400)")
    assert "0.7" in because and f"more than {WITHIN:g}" in because
    assert a.evidence["unrecovered"]["step"] < 450  # its condition had cleared long before
    assert "is not back within" in a.message  # said when it fired, as what would page it
    assert [x.rule for x in alerts if x.paged_step is not None] == ["loss_jump"]


def test_without_recover_within_the_same_bump_is_reported_recovered() -> None:
    """The option taken back: the episode resolves at its first step under the detector's
    limit and says it recovered, with the loss still 0.7 nat up (the old behaviour)."""
    rules = defaults_with("loss_jump", page={"recover_within": None})
    (a,) = by_rule(alerts_of(frames_at(1, 700, _garbage_then(_stays_up)), rules=rules),
                   "loss_jump")
    assert a.severity == "info" and a.state == "resolved" and a.resolved_step < 450
    assert a.evidence.get("recovered") is True


@pytest.mark.parametrize("k", [1, 10])
def test_a_bump_whose_level_comes_back_resolves_as_recovered(k: int) -> None:
    alerts = alerts_of(frames_at(k, 700, _garbage_then(_comes_back), history=k > 1))
    (a,) = by_rule(alerts, "loss_jump")
    assert a.severity == "info" and a.paged_step is None and a.state == "resolved"
    assert a.evidence.get("recovered") is True and a.evidence["recovered_step"] < 500
    assert f"back within {WITHIN:g} of its level before" in a.message
    # it waited for its level from the step its condition cleared: a recovered alert's
    # evidence says so, and no longer reads "unrecovered"
    assert "unrecovered" not in a.evidence
    assert a.evidence["waited"]["from"] < a.evidence["waited"]["until"]
    assert a.evidence["waited"]["until"] == a.evidence["recovered_step"]
    assert not [x for x in alerts if x.paged_step is not None]


def test_a_one_batch_outlier_resolves_once_the_level_after_it_is_back() -> None:
    """One garbage batch, the next batches on the plateau: recovered a level's span (20
    steps) after it, not on the jump's own steps."""
    (a,) = by_rule(alerts_of(frames_at(1, 700, _garbage_then(lambda s: 0.0, length=1))),
                   "loss_jump")
    assert a.severity == "info" and a.state == "resolved" and a.evidence["recovered"]
    assert 420 <= a.resolved_step <= 425, a.resolved_step


def test_a_new_jump_while_the_level_is_still_up_pages_on_its_own_terms() -> None:
    """The loss stays up after the garbage, then jumps three times within 20 steps (440,
    445, 450): the third episode of the rule within 20 steps pages (``Page.repeats``), as it
    would without the wait. The open alert pages then, not 100 steps after the first jump,
    and says why; the new jumps join its evidence."""
    jumps = {440: 6.0, 445: 6.0, 450: 6.0}

    def after(step: int) -> float:
        return jumps.get(step, 0.7)
    alerts = alerts_of(frames_at(1, 700, _garbage_then(after)))
    (a,) = by_rule(alerts, "loss_jump")
    assert a.started_step == 400 and a.paged_step == 450, (a.paged_step, a.evidence)
    assert a.evidence["escalated_because"].startswith("it jumped again at step 450: episode")
    assert {b["step"] for b in a.evidence["breaches"]} >= {440, 445, 450}


def test_a_blow_up_while_the_level_is_still_up_pages_the_waiting_alert_at_once() -> None:
    """The loss stays up after the garbage; at 455 the gradient builds to 3x its median, and
    at 460 the loss jumps 3 nats with an unclipped gradient 60x up: a blow-up, paged on its
    own terms (corroborated by ``grad_blowup`` after a precursor, the page policy's
    ``pages_on``). It joins the waiting alert and pages it at 460, saying why, not 100
    steps after the first jump."""
    grad = [0.6 + abs(g) for g in _NOISE]

    def scalars(step: int) -> dict[str, float]:
        s = _garbage_then(_stays_up)(step)
        g = grad[step] * (3.0 if 455 <= step < 460 else 1.0)
        if step in (460, 461):
            s["loss"] += 3.0
            g = 40.0
        return {**s, "grad.norm": g}
    alerts = alerts_of(frames_at(1, 700, scalars))
    (a,) = by_rule(alerts, "loss_jump")
    assert a.started_step == 400 and a.paged_step == 460, (a.paged_step, a.evidence)
    assert a.evidence["escalated_because"].startswith(
        "it jumped again at step 460: corroborated: grad_blowup breached at step 460, after "
        "a precursor"), a.evidence["escalated_because"]
    assert "unrecovered" in a.evidence and a.severity == "critical"


def test_an_episode_held_at_info_does_not_inhibit_head_alerts() -> None:
    """While the loss's level is still up after a cleared jump, a head's max logit leaves
    its range: that alert is stored as usual, not suppressed by the waiting loss alert.
    While the loss jumps again (470-499, joining the alert, still held at info until it
    pages at 500 as unrecovered), the head's page is not swallowed either: the loss alert
    has told nobody yet (a paged divergence alert does inhibit: test_alerts_engine)."""
    heads = growing(420, rate=0.05)
    alerts = alerts_of(frames_at(1, 700, _garbage_then(_stays_up), heads=heads))
    dep = by_rule(alerts, "attn_logit_departure")
    assert dep and dep[0].fired_step < 500, [(a.rule, a.fired_step) for a in alerts]
    assert dep[0].suppressed is None

    def again(step: int) -> float:
        return 6.0 if 470 <= step < 500 else 0.7
    alerts = alerts_of(frames_at(1, 700, _garbage_then(again), heads=heads))
    (dep,) = by_rule(alerts, "attn_logit_departure")
    (jump,) = by_rule(alerts, "loss_jump")
    assert jump.paged_step == 500, jump.paged_step
    assert 470 <= dep.fired_step < 500 and dep.suppressed is None, (dep.fired_step,
                                                                    dep.suppressed)


# -- restart -------------------------------------------------------------------------------


def _loss_jump_stored(sessions: sessionmaker[Session]) -> Alert:
    """The one ``loss_jump`` alert stored in the database of ``sessions``."""
    with sessions() as s:
        (a,) = s.scalars(select(Alert).where(Alert.rule == "loss_jump")).all()
    return a


@pytest.mark.parametrize("restart_at", [None, 460])
def test_the_wait_for_the_level_survives_a_restart(sessions: sessionmaker[Session],
                                                   restart_at: int | None) -> None:
    """The collector restarts while the episode waits for the level (step 460, its
    condition cleared before): the alert still pages at 500, the level rebuilt from the
    stored every-step losses."""
    frames = frames_at(1, 560, _garbage_then(_stays_up))
    cut = restart_at or len(frames)
    for part in (frames[:cut], frames[cut:]):
        feed(sessions, AlertEngine(list(DEFAULT_RULES)), part)  # a restarted collector
    a = _loss_jump_stored(sessions)
    assert a.paged_step == 500 and a.severity == "critical", a.evidence
    assert a.evidence["escalated_because"].startswith("it did not recover")


def test_a_bump_judged_back_after_a_restart_resolves_as_recovered(
        sessions: sessionmaker[Session]) -> None:
    """The collector restarts at step 430 while the episode waits for the level (its
    condition cleared at the end of the garbage, the loss coming back by 445): the restarted
    engine finds the open alert, rebuilds the level from the stored every-step losses and
    resolves it as recovered at the same step as a collector that ran throughout, with the
    same ``evidence.waited``."""
    frames = frames_at(1, 560, _garbage_then(_comes_back))
    (once,) = by_rule(alerts_of(frames), "loss_jump")
    assert once.state == "resolved" and once.evidence["recovered"] is True
    feed(sessions, AlertEngine(list(DEFAULT_RULES)), frames[:430])
    a = _loss_jump_stored(sessions)  # waiting when the collector stops
    assert a.state == "firing" and "unrecovered" in a.evidence, a.evidence
    feed(sessions, AlertEngine(list(DEFAULT_RULES)), frames[430:])  # a restarted collector
    a = _loss_jump_stored(sessions)
    assert a.state == "resolved" and a.paged_step is None and a.severity == "info"
    assert a.evidence["recovered_step"] == once.evidence["recovered_step"], a.evidence
    assert a.evidence["waited"] == once.evidence["waited"]


def test_recover_within_is_validated() -> None:
    with pytest.raises(RuleError, match="recover_within pages an episode"):
        Page(repeats=3, recover_within=0.5)
    with pytest.raises(RuleError, match="recover_within must be a number"):
        Page(after=100, recover_within=-1.0)
    with pytest.raises(RuleError, match="recover_steps must be an int"):
        Page(after=100, recover_within=0.5, recover_steps=0)
    p = Page.from_dict({"after": 100, "recover_within": 0.5, "recover_steps": 30})
    assert (p.recover_within, p.recover_steps) == (0.5, 30)
    assert Page.from_dict(p.to_dict()) == p
