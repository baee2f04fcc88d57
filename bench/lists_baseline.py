"""The dashboard's runs list and alerts inbox as they were read before migration 0016: the
baseline of ``bench_lists.py`` and the reference that ``tests/test_dashboard_lists_scale.py``
compares the store's answers with.

* :func:`old_list_runs` / :func:`old_get_run`: every run's newest frame id read as
  ``max(frames.id)`` (a correlated subquery per run), firing alerts counted over the store.
* :func:`old_runs_overview`: every run listed, the substring filter applied in Python, and,
  with a status filter, a sparkline read for every run (``diverged`` also covers a run whose
  last loss, the sparkline's newest point, is not finite).
* :func:`old_alerts_inbox`: the runs with alerts walked one at a time (the run, its alerts,
  its incidents, its sparkline each), in an order that puts the firing runs first whatever
  ``state`` asks.

Nothing here is used by the collector.
"""

from __future__ import annotations

import json
import math
import time as _time
from typing import Any

import numpy as np
from sqlalchemy import case, func, or_, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Alert, Frame, Metric, Point, Run, RunTag
from logitwatch.server.errors import BadRequest, NotFound
from logitwatch.server.schemas import AlertOut, RunOut
from logitwatch.server.store import incidents as inc
from logitwatch.server.store.alerts import firing_alerts, list_alerts
from logitwatch.server.store.inbox import InboxRunOut
from logitwatch.server.store.lifecycle import run_status
from logitwatch.server.store.runs import _tags
from logitwatch.server.store.runs_view import (
    STATUSES,
    RunSummaryOut,
    SparklineCache,
    _downsample_keep_last,
    _Spark,
)

__all__ = ["OldSparklineCache", "old_alerts_inbox", "old_get_run", "old_list_runs",
           "old_runs_overview"]


class OldSparklineCache(SparklineCache):
    """The sparkline cache reading each stale run's points with a query of its own."""

    def _refresh(self, session: Session, runs: list[RunOut]) -> None:
        ids = [r.id for r in runs]
        metric_of = dict(session.execute(
            select(Metric.run_id, Metric.id).where(Metric.run_id.in_(ids),
                                                   Metric.name == self.metric)).all())
        for r in runs:
            s = self._runs.get(r.id)
            if s is None or s.key[0] != r.created_at:
                s = _Spark(key=(r.created_at, None, None))
            s.key = (r.created_at, r.last_step, r.last_time)
            self._runs[r.id] = s
            mid = metric_of.get(r.id)
            if mid is None:
                continue
            rows = session.execute(
                select(Frame.id, Frame.step, Point.data)
                .join(Frame, Frame.id == Point.frame_id)
                .where(Point.metric_id == mid, Point.frame_id > s.last_frame_id,
                       Frame.rank == 0)
                .order_by(Frame.step, Frame.seq)).all()
            if not rows:
                continue
            steps = np.fromiter((row.step for row in rows), dtype=np.int64, count=len(rows))
            values = np.frombuffer(b"".join(row.data for row in rows), dtype="<f4")
            s.last_frame_id = max(s.last_frame_id, max(row.id for row in rows))
            all_steps = np.concatenate([s.steps, steps])
            all_values = np.concatenate([s.values, values.astype(np.float64)])
            order = np.argsort(all_steps, kind="stable")
            all_steps, all_values = all_steps[order], all_values[order]
            if len(all_steps) > 4 * self.points:
                all_steps, all_values = _downsample_keep_last(all_steps, all_values,
                                                              2 * self.points)
            s.steps, s.values = all_steps, all_values


def _run_out(run: Run, open_alerts: int, last_frame_id: int, tags: list[str] | None,
             now: float, active_seconds: float) -> RunOut:
    active = run.seen_at is not None and now - run.seen_at <= active_seconds
    return RunOut(id=run.id, project=run.project, name=run.name, created_at=run.created_at,
                  last_step=run.last_step, last_time=run.last_time, seen_at=run.seen_at,
                  first_time=run.time_min, open_alerts=open_alerts,
                  last_frame_id=last_frame_id, status=run_status(run), active=active,
                  ended_at=run.ended_at, end_step=run.end_step,
                  diverged_step=run.diverged_step, tags=tags or [], config=run.config)


def old_list_runs(session: Session, *, project: str | None = None, tag: str | None = None,
                  status: str | None = None, since: float | None = None,
                  until: float | None = None, name: str | None = None,
                  active_seconds: float = 600.0, now: float | None = None,
                  limit: int | None = None, offset: int = 0,
                  total: list[int] | None = None) -> list[RunOut]:
    """``queries.list_runs`` before 0016."""
    now = _time.time() if now is None else now
    firing = (select(Alert.run_id, func.count().label("n")).where(Alert.state == "firing")
              .group_by(Alert.run_id).subquery())
    last_frame = (select(func.max(Frame.id)).where(Frame.run_id == Run.id)
                  .correlate(Run).scalar_subquery())
    q = (select(Run, func.coalesce(firing.c.n, 0), last_frame)
         .outerjoin(firing, firing.c.run_id == Run.id)
         .order_by(Run.last_time.desc().nulls_last(), Run.id.desc()))
    if project is not None:
        q = q.where(Run.project == project)
    if tag is not None:
        q = q.where(Run.id.in_(select(RunTag.run_id).where(RunTag.tag == tag)))
    if status == "diverged":
        q = q.where(Run.diverged_step.is_not(None))
    elif status in ("running", "finished", "stopped"):
        q = q.where(Run.diverged_step.is_(None), Run.status == status)
    elif status == "active":
        q = q.where(Run.seen_at >= now - active_seconds)
    elif status == "idle":
        q = q.where(or_(Run.seen_at.is_(None), Run.seen_at < now - active_seconds))
    elif status == "alerting":
        q = q.where(firing.c.n > 0)
    if since is not None:
        q = q.where(Run.last_time >= since)
    if until is not None:
        q = q.where(Run.created_at <= until)
    if name is not None:
        q = q.where(Run.name.contains(name, autoescape=True))
    if total is not None:
        total.append(session.scalar(select(func.count()).select_from(q.subquery())) or 0)
    if limit is not None:
        q = q.limit(limit)
    if offset:
        q = q.offset(offset)
    rows = session.execute(q).all()
    tags = _tags(session, [r.id for r, _, _ in rows])
    return [_run_out(r, int(n), int(last or 0), tags.get(r.id), now, active_seconds)
            for r, n, last in rows]


def old_get_run(session: Session, run_id: int, *, active_seconds: float = 600.0) -> RunOut:
    """``queries.get_run`` before 0016."""
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound("run-not-found", f"no run with id {run_id}")
    n = session.scalar(select(func.count()).where(Alert.run_id == run_id,
                                                  Alert.state == "firing"))
    last = session.scalar(select(func.max(Frame.id)).where(Frame.run_id == run_id))
    return _run_out(run, int(n or 0), int(last or 0), _tags(session, [run_id]).get(run_id),
                    _time.time(), active_seconds)


def old_last_loss(session: Session, cache: SparklineCache, run: RunOut) -> float | None:
    """The run's last loss as the list read it: its sparkline's newest point."""
    _, values = cache.get(session, [run])[run.id]
    return float(values[-1]) if len(values) else None


def _status(run: RunOut, last_loss: float | None) -> str:
    if run.last_step is None:
        return "empty"
    if last_loss is not None and not math.isfinite(last_loss):
        return "diverged"
    return run.status


def _searchable(r: RunOut) -> str:
    config = (json.dumps(r.config, separators=(",", ":"), ensure_ascii=False)
              if r.config else "")
    return " ".join([r.name, r.project, *r.tags, config]).lower()


def old_runs_overview(session: Session, cache: SparklineCache, *, project: str | None = None,
                      status: str | None = None, alerting: bool = False, q: str | None = None,
                      limit: int | None = None, offset: int = 0,
                      total: list[int] | None = None) -> list[RunSummaryOut]:
    """``runs_view.runs_overview`` before 0016."""
    if status is not None and status not in STATUSES:
        raise BadRequest("bad-status", f"status: {status!r}", field="status")
    runs = old_list_runs(session, project=project, status="alerting" if alerting else None)
    if q:
        needle = q.lower()
        runs = [r for r in runs if needle in _searchable(r)]
    end = None if limit is None else offset + limit
    if status is None:
        if total is not None:
            total.append(len(runs))
        runs = runs[offset:end]
    sparks = cache.get(session, runs)
    firing: dict[int, list[AlertOut]] = {}
    for a in firing_alerts(session, [r.id for r in runs if r.open_alerts]):
        firing.setdefault(a.run_id, []).append(a)
    out = []
    for r in runs:
        steps, values = sparks[r.id]
        last = float(values[-1]) if len(values) else None
        st = _status(r, last)
        if status is not None and st != status:
            continue
        v = (inc.VerdictOut(kind="empty", text="no data yet", detail="")
             if r.last_step is None else inc.verdict(r, firing.get(r.id, []), last_loss=last))
        out.append(RunSummaryOut(
            id=r.id, project=r.project, name=r.name, status=st, last_step=r.last_step,
            last_time=r.last_time, seen_at=r.seen_at, first_time=r.first_time,
            open_alerts=r.open_alerts, loss_steps=steps.tolist(),
            loss_values=values.tolist(), last_loss=last, created_at=r.created_at,
            ended_at=r.ended_at, tags=r.tags, config=r.config, verdict=v.kind,
            verdict_text=v.text))
    if status is not None:
        if total is not None:
            total.append(len(out))
        out = out[offset:end]
    return out


def old_alerts_inbox(session: Session, cache: SparklineCache, *, project: str | None = None,
                     state: str | None = None, limit: int = 100,
                     active_seconds: float = 600.0) -> list[InboxRunOut]:
    """The ``/api/v1/dashboard/alerts`` route before 0016."""
    firing = func.max(case((Alert.state == "firing", 1), else_=0))
    q: Any = select(Alert.run_id).group_by(Alert.run_id)
    if project is not None:
        q = q.join(Run, Run.id == Alert.run_id).where(Run.project == project)
    if state == "firing":
        q = q.having(firing == 1)
    q = q.order_by(firing.desc(), func.max(Alert.id).desc())
    out: list[InboxRunOut] = []
    for run_id in session.scalars(q).all():
        run = old_get_run(session, run_id, active_seconds=active_seconds)
        alerts = list_alerts(session, run_id)
        found = [i for i in inc.incidents(alerts, run.diverged_step)
                 if state is None or i.state == state]
        if found:
            loss = old_last_loss(session, cache, run)
            out.append(InboxRunOut(run=run, verdict=inc.verdict(run, alerts, last_loss=loss),
                                   incidents=found, alerts=alerts))
            if len(out) >= limit:
                break
    return out
