"""The ``no_data`` rule: runs that stopped reporting.

The rule is judged by the engine's clock, not per sample: :meth:`NoDataMixin.check_stale`
fires it for a run the collector has received nothing from for the rule's ``seconds`` and
whose job did not say it ended (the run is then ``stopped``), and resolves it for runs
that finished; the run's next frame resolves it too
(:meth:`NoDataMixin._resolve_no_data`, the run is ``running`` again).

"Next" is by ``seq``, the job's own numbering (as a finished run is resumed,
:mod:`~logitwatch.server.store.lifecycle`): the alert records the run's newest frame row
when it fired (``evidence.frame_id``, rows are numbered as they arrive), and a frame that
arrived since resolves it only if it is numbered after every frame its rank had sent
before: a job back, or resumed from a checkpoint below its last step; or if its step is
past the one the run fell silent at (``fired_step``: a job resumed on a host whose clock
is behind numbers its frames below its first life's, seqs following the clock). An old
spool pushed late (frames numbered before those stored, at steps stored) is not news: the
alert stays open and the run ``stopped``.
"""

from __future__ import annotations

import time as _time
from collections.abc import Collection
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Engine, Select, and_, func, or_, select, update
from sqlalchemy.orm import Session

from logitwatch.server.alerts.lifecycle import PAGING, LifecycleMixin
from logitwatch.server.alerts.rules import RuleSpec, State, remedies_for
from logitwatch.server.db.models import Alert, Frame, Run
from logitwatch.server.db.session import write_lock
from logitwatch.server.store.ingest import NewFrame
from logitwatch.server.store.pruning import prune_frames, run_bounds

__all__ = ["NoDataMixin"]


class NoDataMixin(LifecycleMixin):
    """The ``no_data`` alerts of an :class:`~logitwatch.server.alerts.engine.AlertEngine`."""

    def check_stale(self, session: Session, now: float | None = None, *,
                    runs: Collection[int] | None = None,
                    listening_since: float | None = None,
                    lock: AbstractContextManager[Any] | None = None) -> list[Alert]:
        """Fire ``no_data`` for every run that has not finished and that the collector
        last received a frame of (``runs.seen_at``, the collector's clock: a job's skewed
        clock does not matter) more than the rule's ``seconds`` before ``now`` (and that
        has no open ``no_data`` alert): the run is then ``stopped``. Resolve the open
        ``no_data`` alerts of finished runs. Only the runs of ``runs`` when given (the
        ingest route passes those that just finished). ``listening_since``: when the
        collector that checks started; nothing is fired before it has listened for the
        rule's ``seconds`` itself (after a collector's own outage, the jobs' clients resend
        within their backoff: their silence was the collector's, not theirs).
        Returns the alerts fired or resolved that people should hear about.

        Writes. With ``runs`` (the ingest route, a replay), the check is part of the
        caller's transaction, which holds the engine's write lock already where it needs
        it: nothing is taken or committed here; so on PostgreSQL (row locks, many writers:
        that lock is nothing there). Without, on SQLite (the checker thread, every
        :data:`~logitwatch.server.alerts.config.STALE_CHECK_S`), or with ``lock``, the
        check is a transaction of its own: it looks for work first, without any lock (most
        passes find none and write nothing), then does it and commits it under ``lock``,
        by default the engine's :func:`~logitwatch.server.db.session.write_lock`, the one
        ingest requests queue in. It waited for SQLite's own lock instead, in its busy
        handler, which polls: under a steady stream of ingests handing the lock on to each
        other it could miss every gap, then fail ``database is locked`` after the busy
        timeout (the silent runs went unalerted that pass); and an ingest at the head of
        the queue polled for the lock the check held, where it would have waited its turn
        in order."""
        names = [r.name for r in self._rules if r.kind == "no_data"]
        if not names:
            return []
        now = _time.time() if now is None else now
        bind = session.get_bind()
        if lock is None:
            if runs is not None or bind.dialect.name != "sqlite":
                return self._stale(session, names, now, runs, listening_since)
            lock = write_lock(bind if isinstance(bind, Engine) else bind.engine)
        if not self._stale_work(session, names, now, runs, listening_since):
            return []
        with lock:
            try:
                out = self._stale(session, names, now, runs, listening_since)
                session.commit()
            except BaseException:
                session.rollback()  # under the lock: SQLite's is let go before the turn is
                raise
        return out

    def _ended(self, names: list[str], runs: Collection[int] | None) -> Select[Any]:
        """The open ``no_data`` alerts of finished runs, with their runs."""
        ended = (select(Alert, Run).join(Run, Run.id == Alert.run_id)
                 .where(Alert.rule.in_(names), Alert.state == State.FIRING.value,
                        Run.status == "finished"))
        return ended if runs is None else ended.where(Run.id.in_(list(runs)))

    def _silent(self, rule: RuleSpec, now: float,
                runs: Collection[int] | None) -> Select[Any]:
        """The runs silent for ``rule``'s ``seconds`` that need work, with whether their
        ``no_data`` alert is open."""
        seconds = float(rule.param("seconds"))
        # Only the runs that need work, chosen in SQL: a stopped run whose open alert
        # already says so (a crashed run stays stopped for ever) is not read, nor
        # written, each pass; the check takes no write lock when nothing changed.
        open_ = select(Alert.id).where(
            Alert.run_id == Run.id, Alert.rank == 0, Alert.rule == rule.name,
            Alert.state == State.FIRING.value, Alert.layer.is_(None)).exists()
        # already alerted for this silence: an alert's fired_at - value (its silence)
        # is the seen_at it was raised for, whichever collector's clock raised it; not
        # by step, since a job resumed from a checkpoint below its last step, then
        # silent again, is a new silence at the same last step
        alerted = select(Alert.id).where(
            Alert.run_id == Run.id, Alert.rule == rule.name,
            func.abs(Alert.fired_at - Alert.value - Run.seen_at) < 1e-3).exists()
        q = (select(Run, open_)
             .where(Run.seen_at.is_not(None), Run.seen_at < now - seconds,
                    Run.status != "finished",
                    or_(and_(Run.status == "running", open_), and_(~open_, ~alerted)))
             .order_by(Run.id))
        return q if runs is None else q.where(Run.id.in_(list(runs)))

    def _judged(self, now: float, listening_since: float | None) -> list[RuleSpec]:
        """The enabled ``no_data`` rules the check may fire now: not before the collector
        has listened for the rule's ``seconds`` (a silent job, not its own outage)."""
        return [r for r in self._rules if r.kind == "no_data" and r.enabled
                and (listening_since is None
                     or now - listening_since >= float(r.param("seconds")))]

    def _stale_work(self, session: Session, names: list[str], now: float,
                    runs: Collection[int] | None, listening_since: float | None) -> bool:
        """Whether :meth:`_stale` has anything to write: the same reads, a row each."""
        if session.execute(self._ended(names, runs).limit(1)).first() is not None:
            return True
        return any(session.execute(self._silent(rule, now, runs).limit(1)).first()
                   is not None for rule in self._judged(now, listening_since))

    def _stale(self, session: Session, names: list[str], now: float,
               runs: Collection[int] | None, listening_since: float | None) -> list[Alert]:
        """:meth:`check_stale`'s reads and writes, in the session's transaction."""
        out: list[Alert] = []
        for a, run in session.execute(self._ended(names, runs)).all():
            a.state = State.RESOLVED.value  # the job said it ended: it did not hang
            a.resolved_step = run.end_step if run.end_step is not None else a.fired_step
            if a.suppressed is None:
                out.append(a)
        for rule in self._judged(now, listening_since):
            seconds = float(rule.param("seconds"))
            repair: list[int] = []
            for run, is_open in session.execute(self._silent(rule, now, runs)).all():
                if is_open:  # a run alerted before statuses were stored: stopped below
                    repair.append(run.id)
                    continue
                if run.status == "running" and not session.execute(
                        update(Run).where(Run.id == run.id, Run.status == "running",
                                          Run.seen_at == run.seen_at)
                        .values(status="stopped")
                        .execution_options(synchronize_session=False)).rowcount:
                    # Several collectors on one database check the same runs: the one whose
                    # UPDATE stops the run fires, the others' match nothing (PostgreSQL
                    # re-reads the row once the first commits); nor does a frame's arrival.
                    continue
                assert run.seen_at is not None
                silent = now - run.seen_at
                msg = (f"{run.name}: no data for {silent:.0f} s since step {run.last_step} "
                       f"(limit {seconds:.0f} s) and its job did not say it ended: it may "
                       "have hung or crashed.")
                sid = self._silenced(session, run, rule.name, 0, None, now)
                # what it fired on: the run's newest frame row (_resolve_no_data), read
                # within the run's time bounds (only its days' partitions on PostgreSQL);
                # the UPDATE above holds the run's row, so no frame of it lands meanwhile
                newest = session.scalar(prune_frames(
                    select(func.max(Frame.id)).where(Frame.run_id == run.id),
                    run_bounds(session, run.id)))
                a = Alert(
                    run_id=run.id, rule=rule.name, metric="*", severity=rule.severity,
                    state=State.FIRING.value, rank=0, layer=None, head=None,
                    started_step=run.last_step or 0, fired_step=run.last_step or 0,
                    fired_at=now, value=silent, baseline=None, threshold=seconds,
                    message=msg, evidence={"silent_s": silent, "seen_at": run.seen_at,
                                           "last_time": run.last_time,
                                           "frame_id": newest or 0,
                                           "rule_kind": "no_data"},
                    remedies=remedies_for("*", "no_data"),
                    suppressed="silenced" if sid is not None else None,
                    paged_step=(run.last_step or 0) if rule.severity in PAGING else None,
                )
                session.add(a)
                run.status = "stopped"
                session.flush()
                if a.suppressed is None:
                    out.append(a)
            for i in range(0, len(repair), 500):
                # conditional, so that a run another collector's ingest just finished stays
                # finished
                session.execute(update(Run).where(Run.id.in_(repair[i:i + 500]),
                                                  Run.status == "running")
                                .values(status="stopped")
                                .execution_options(synchronize_session=False))
        return out

    def _resolve_no_data(self, session: Session, f: NewFrame) -> list[Alert]:
        """Resolve the open ``no_data`` alerts of ``f``'s run once a frame numbered after
        what it had sent when an alert fired has arrived (:func:`_back`; the module's
        docstring), at the newest step that came back; the run is ``running`` again. The
        engine calls this with a batch's first frame of each run, after the batch is
        stored: the whole batch is judged, not ``f`` alone."""
        names = [r.name for r in self._rules if r.kind == "no_data"]
        if not names:
            return []
        rows = session.scalars(select(Alert).where(
            Alert.run_id == f.run_id, Alert.rule.in_(names),
            Alert.state == State.FIRING.value)).all()
        resolved: list[Alert] = []
        for a in rows:
            step = _back(session, f, a)
            if step is None:
                continue  # only frames older than its silence (an old spool): still silent
            a.state = State.RESOLVED.value
            a.resolved_step = step
            resolved.append(a)
        if resolved:  # the stopped run reports again
            session.execute(update(Run).where(Run.id == f.run_id, Run.status == "stopped")
                            .values(status="running")
                            .execution_options(synchronize_session="evaluate"))
        return [a for a in resolved if a.suppressed is None]


def _back(session: Session, f: NewFrame, a: Alert) -> int | None:
    """The step at which the run of the open ``no_data`` alert ``a`` is back, or None
    while nothing newer than what it fired on has arrived: of the frames stored since it
    fired (frame rows above ``evidence.frame_id``), for each rank, the one numbered last
    (its highest ``seq``) counts if no frame of that rank stored before is numbered after
    it, and so does a step past the one it fired at; the newest step among those that
    count. An alert fired before it recorded its frame row resolves on any frame, at
    ``f``'s step."""
    fid = (a.evidence or {}).get("frame_id")
    if not isinstance(fid, int):
        return f.step
    # every read within the run's time bounds (only its days' partitions on PostgreSQL):
    # the batch that brought f widened them in this transaction
    bounds = run_bounds(session, f.run_id)

    def frames(q: Select[Any]) -> Select[Any]:
        return prune_frames(q, bounds)

    arrived = session.execute(frames(
        select(Frame.rank, func.max(Frame.seq)).where(
            Frame.run_id == f.run_id, Frame.id > fid, Frame.seq >= 0)  # not history rows
        .group_by(Frame.rank))).all()
    steps: list[int] = []
    before = None  # the run's highest seq when it fired (any rank), read once if needed
    for rank, seq in arrived:
        if session.scalar(frames(select(Frame.id).where(
                Frame.run_id == f.run_id, Frame.rank == rank, Frame.seq > seq
        ).limit(1))) is not None:
            continue  # numbered before a frame it had sent: an old spool
        if session.scalar(frames(select(Frame.id).where(
                Frame.run_id == f.run_id, Frame.rank == rank, Frame.id <= fid,
                Frame.seq >= 0).limit(1))) is None:
            # a rank heard of for the first time: news only if numbered after what the
            # run had sent (seqs follow the job's clock on every rank), not an old spool
            # of a rank that never reached the collector
            if before is None:
                before = session.scalar(frames(select(func.max(Frame.seq)).where(
                    Frame.run_id == f.run_id, Frame.id <= fid, Frame.seq >= 0))) or -1
            if seq < before:
                continue
        steps.append(session.scalar(frames(select(Frame.step).where(
            Frame.run_id == f.run_id, Frame.rank == rank, Frame.seq == seq))))
    past = session.scalar(frames(select(func.max(Frame.step)).where(
        Frame.run_id == f.run_id, Frame.id > fid, Frame.seq >= 0)))
    if past is not None and past > a.fired_step:  # past where it fell silent: news
        steps.append(past)
    return max(steps) if steps else None
