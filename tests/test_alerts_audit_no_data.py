"""The ``no_data`` alert resolves only on a frame newer than what it fired on (by the job's
``seq``, per rank): an old spool pushed late (frames numbered before the ones stored, steps
below the run's last step) neither resolves it nor makes the stopped run ``running``; a
frame numbered after them does, at the newest step that came back, also when it is not the
first frame of its batch, and also when a job resumed from a checkpoint below its last
step sends it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.db.models import Alert, Run
from logitwatch.server.db.session import session_scope
from logitwatch.server.schemas import IngestIn
from logitwatch.server.store.ingest import ingest_frames
from tests.alert_frames import feed, frame

HOUR = 3600.0


def _no_data(sessions: sessionmaker[Session]) -> tuple[Alert, Run]:
    with sessions() as s:
        a = s.scalars(select(Alert).where(Alert.rule == "no_data")).one()
        return a, s.get(Run, a.run_id)  # type: ignore[return-value]


def _batch(sessions: sessionmaker[Session], eng: AlertEngine,
           frames: list[dict[str, Any]], now: float) -> list[Alert]:
    """``frames`` in one ingest batch, as a client's push sends them."""
    with session_scope(sessions) as s:
        stored = ingest_frames(s, IngestIn.model_validate({"frames": frames}).frames, now=now)
        return eng.process(s, stored.new_frames)


def _silent_with_spool(sessions: sessionmaker[Session]) -> tuple[AlertEngine, list[Any]]:
    """Steps 0-90 of which 30-50 (seq 3-5) are still in a dead job's spool; no_data fires
    at step 90."""
    eng = AlertEngine()
    fr = [frame(i, loss=2.0) for i in range(10)]
    feed(sessions, eng, fr[:3] + fr[6:])
    with session_scope(sessions) as s:
        fired = eng.check_stale(s, now=1009.0 + HOUR)
    assert [(a.rule, a.fired_step) for a in fired] == [("no_data", 90)]
    return eng, fr


def test_an_old_spool_pushed_late_does_not_resolve_no_data(
        sessions: sessionmaker[Session]) -> None:
    """The audit's case: the old spool resolved the alert at step 30 (before it fired at
    90), made the silent run ``running`` and notified a resolution."""
    eng, fr = _silent_with_spool(sessions)
    changed = feed(sessions, eng, fr[3:6])  # the old spool, pushed after the silence
    assert [a.rule for a in changed if a.rule == "no_data"] == []
    a, run = _no_data(sessions)
    assert (a.state, a.fired_step, a.resolved_step) == ("firing", 90, None)
    assert (run.status, run.last_step) == ("stopped", 90)
    with session_scope(sessions) as s:  # still one alert for this silence
        assert eng.check_stale(s, now=1009.0 + 2 * HOUR) == []
    # the job itself comes back: resolved at its step, the run running again
    changed = feed(sessions, eng, [frame(10, loss=2.0)])
    assert [(c.rule, c.state, c.resolved_step) for c in changed if c.rule == "no_data"] == [
        ("no_data", "resolved", 100)]
    a, run = _no_data(sessions)
    assert (a.state, a.resolved_step, run.status) == ("resolved", 100, "running")


def test_a_new_frame_after_silence_resolves_no_data(sessions: sessionmaker[Session]) -> None:
    """The normal case: the run's next frame resolves it, at that frame's step."""
    eng = AlertEngine()
    feed(sessions, eng, [frame(i, loss=2.0) for i in range(5)])
    with session_scope(sessions) as s:
        assert [a.fired_step for a in eng.check_stale(s, now=1004.0 + HOUR)] == [40]
    assert _no_data(sessions)[1].status == "stopped"
    changed = feed(sessions, eng, [frame(5, loss=2.0)])
    assert [(c.state, c.resolved_step) for c in changed if c.rule == "no_data"] == [
        ("resolved", 50)]
    a, run = _no_data(sessions)
    assert (a.state, a.resolved_step, run.status) == ("resolved", 50, "running")


def test_a_batch_of_old_and_new_frames_resolves_at_the_newest_step(
        sessions: sessionmaker[Session]) -> None:
    """The spool and the job's next frames in one batch: its first frame (the engine looks
    at one a run) is old, the batch as a whole is news: resolved at its newest step."""
    eng, fr = _silent_with_spool(sessions)
    changed = _batch(sessions, eng, [*fr[3:6], frame(10, loss=2.0), frame(11, loss=2.0)],
                     now=1011.0 + HOUR)
    assert [(c.rule, c.resolved_step) for c in changed if c.rule == "no_data"] == [
        ("no_data", 110)]
    a, run = _no_data(sessions)
    assert (a.state, a.resolved_step, run.status) == ("resolved", 110, "running")


def test_a_job_resumed_below_its_last_step_resolves_no_data(
        sessions: sessionmaker[Session]) -> None:
    """A job resumed from a checkpoint (steps 20-30, below the last step 40) numbers its
    frames after the ones stored: it is back, though its steps are lower."""
    eng = AlertEngine()
    feed(sessions, eng, [frame(i, loss=2.0) for i in range(5)])
    with session_scope(sessions) as s:
        assert [a.fired_step for a in eng.check_stale(s, now=1004.0 + HOUR)] == [40]
    resumed = [{**frame(i, loss=2.0), "seq": 100 + i} for i in (2, 3)]
    changed = _batch(sessions, eng, resumed, now=1004.0 + HOUR + 10)
    assert [(c.rule, c.resolved_step) for c in changed if c.rule == "no_data"] == [
        ("no_data", 30)]
    assert _no_data(sessions)[1].status == "running"


def test_another_ranks_old_spool_does_not_resolve_but_its_new_frame_does(
        sessions: sessionmaker[Session]) -> None:
    """Per rank: rank 1's frames numbered before its stored ones are an old spool too; a
    frame of rank 1 numbered after them is news."""
    eng = AlertEngine()
    feed(sessions, eng, [f for i in range(5)
                         for f in (frame(i, loss=2.0), {**frame(i, loss=2.0), "rank": 1})
                         if i not in (1, 2) or f["rank"] == 0])
    with session_scope(sessions) as s:
        assert [a.fired_step for a in eng.check_stale(s, now=1004.0 + HOUR)] == [40]
    old = [{**frame(i, loss=2.0), "rank": 1} for i in (1, 2)]
    assert [c for c in _batch(sessions, eng, old, now=1004.0 + HOUR + 5)
            if c.rule == "no_data"] == []
    assert _no_data(sessions)[0].state == "firing"
    new = [{**frame(5, loss=2.0), "rank": 1}]
    assert [c.resolved_step for c in _batch(sessions, eng, new, now=1004.0 + HOUR + 9)
            if c.rule == "no_data"] == [50]


def test_a_job_resumed_on_a_host_whose_clock_is_behind_resolves_no_data(
        sessions: sessionmaker[Session]) -> None:
    """Resumed from its step-80 checkpoint on a host whose clock is 5 minutes behind, the
    job numbers its frames below its first life's: its first step past the one the run fell
    silent at (90) resolves no_data; by seq alone the run stayed stopped while it sent."""
    eng = AlertEngine()
    t1 = 1_700_000_000_000_000

    def fr(step: int, seq: int, t: float) -> dict[str, Any]:
        return {"run": "r", "rank": 0, "seq": seq, "step": step, "time": t,
                "scalars": {"loss": 2.0}, "heads": {}}

    feed(sessions, eng, [fr(s, t1 + s * 1_000_000, 1000.0 + s) for s in range(0, 100, 10)])
    with session_scope(sessions) as s:
        assert [a.rule for a in eng.check_stale(s, now=1090.0 + 3600)] == ["no_data"]
    t0 = t1 + 90 * 1_000_000 + 120_000_000 - 300_000_000
    feed(sessions, eng, [fr(s, t0 + (s - 80) * 1_000_000, 5000.0 + s)
                         for s in range(80, 200, 10)])
    a, run = _no_data(sessions)
    assert (a.state, a.resolved_step, run.status) == ("resolved", 100, "running")


def test_an_old_spool_of_a_rank_never_heard_of_does_not_resolve_no_data(
        sessions: sessionmaker[Session]) -> None:
    """A two-rank job whose rank 1 never reached the collector dies; rank 1's spool pushed
    later (numbered before rank 0's last frame) resolved no_data at step 0 and marked the
    dead run running: a rank with nothing stored passed the per-rank test (review)."""
    eng = AlertEngine()

    def fr(rank: int, seq: int, step: int) -> dict[str, Any]:
        return {"run": "r", "rank": rank, "seq": seq, "step": step, "time": 1000.0 + seq,
                "scalars": {"loss": 2.0}, "heads": {}}

    feed(sessions, eng, [fr(0, i + 1, 10 * i) for i in range(10)])
    with session_scope(sessions) as s:
        assert [a.rule for a in eng.check_stale(s, now=1010.0 + 3600)] == ["no_data"]
    assert feed(sessions, eng, [fr(1, i + 1, 10 * i) for i in range(5)]) == []
    a, run = _no_data(sessions)
    assert (a.state, run.status) == ("firing", "stopped")
    feed(sessions, eng, [fr(1, 20, 100)])  # rank 1 now, numbered after: back
    a, run = _no_data(sessions)
    assert (a.state, a.resolved_step, run.status) == ("resolved", 100, "running")
