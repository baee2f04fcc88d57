"""Silences are judged again when an alert escalates, not only when it is created: a loss
jump held at ``info`` (it may recover) escalates to ``critical`` once it persists 100
steps (step ~500); under an active silence that escalation is stored (severity,
``paged_step``, evidence) but ``suppressed="silenced"`` and not notified, even for an alert
created before the silence; after the silence it was created under has ended, the
escalation is notified and the alert is no longer suppressed."""

from __future__ import annotations

import time

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.db.models import Alert, Silence
from logitwatch.server.db.session import session_scope
from tests.alert_frames import feed, frames_at, plateau_loss

#: every step's loss, +11 nats from step 400 for good: loss_jump fires at 400 as info,
#: escalates to critical (pages) about 100 steps later
FRAMES = frames_at(1, 620, lambda step: {"loss": plateau_loss(step) + (11.0 if step >= 400
                                                                       else 0.0),
                                         "lr": 1e-3})


def _upto(step: int) -> int:
    return next(i for i, f in enumerate(FRAMES) if f["step"] >= step)


def _silence(sessions: sessionmaker[Session]) -> int:
    with session_scope(sessions) as s:
        now = time.time()
        sil = Silence(project=None, run="r", rule=None, rank=None, layer=None,
                      starts_at=now - 1, ends_at=now + 3600, comment="known bump",
                      created_by="t")
        s.add(sil)
        s.flush()
        return sil.id


def _jump(sessions: sessionmaker[Session]) -> Alert:
    with sessions() as s:
        return s.scalars(select(Alert).where(Alert.rule == "loss_jump")).one()


def test_an_escalation_under_an_active_silence_is_stored_not_notified(
        sessions: sessionmaker[Session]) -> None:
    """(a) created at info before the silence, escalated during it: it paged through the
    silence."""
    eng = AlertEngine()
    before = feed(sessions, eng, FRAMES[:_upto(450)])
    assert [(a.severity, a.suppressed) for a in before if a.rule == "loss_jump"] == [
        ("info", None)]  # created and notified before the silence
    sid = _silence(sessions)
    during = feed(sessions, eng, FRAMES[_upto(450):])
    assert [a for a in during if a.rule == "loss_jump"] == []
    a = _jump(sessions)
    assert (a.state, a.severity, a.suppressed) == ("firing", "critical", "silenced")
    assert a.paged_step is not None and 500 <= a.paged_step <= 502
    assert a.evidence["silence"] == sid and a.evidence["escalated_step"] == a.paged_step
    assert "Escalated to critical" in a.message


def test_an_escalation_after_the_silence_ended_is_notified(
        sessions: sessionmaker[Session]) -> None:
    """(b) created under a silence, escalated after it ended: it was stored paged, never
    notified, and stayed silenced."""
    eng = AlertEngine()
    feed(sessions, eng, FRAMES[:_upto(380)])
    sid = _silence(sessions)
    during = feed(sessions, eng, FRAMES[_upto(380):_upto(450)])
    assert [a for a in during if a.rule == "loss_jump"] == []
    a = _jump(sessions)
    assert (a.severity, a.suppressed, a.evidence["silence"]) == ("info", "silenced", sid)
    with session_scope(sessions) as s:  # DELETE /alerts/silences/{id}
        s.execute(update(Silence).where(Silence.id == sid).values(ends_at=time.time()))
    after = feed(sessions, eng, FRAMES[_upto(450):])
    got = [(a.severity, a.suppressed, a.paged_step) for a in after if a.rule == "loss_jump"]
    assert len(got) == 1 and got[0][:2] == ("critical", None), got
    a = _jump(sessions)
    assert (a.state, a.severity, a.suppressed) == ("firing", "critical", None)
    assert a.paged_step is not None and 500 <= a.paged_step <= 502
    assert a.evidence["silence_ended_step"] == a.paged_step


def test_an_escalation_under_the_silence_it_fired_under_stays_silenced(
        sessions: sessionmaker[Session]) -> None:
    """Created and escalated under one silence: stored paged, silenced, not notified."""
    eng = AlertEngine()
    feed(sessions, eng, FRAMES[:_upto(380)])
    sid = _silence(sessions)
    later = feed(sessions, eng, FRAMES[_upto(380):])
    assert [a for a in later if a.rule == "loss_jump"] == []
    a = _jump(sessions)
    assert (a.severity, a.suppressed, a.evidence["silence"]) == ("critical", "silenced", sid)
    assert a.paged_step is not None
