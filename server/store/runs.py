"""Reading runs back, as API models: the runs list with its filters and its paging, and one
run, each with its count of firing alerts, its newest frame and its tags."""

from __future__ import annotations

import time as _time
from collections import defaultdict
from typing import Literal

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Alert, Frame, Run, RunTag
from logitwatch.server.errors import NotFound
from logitwatch.server.schemas import RunOut
from logitwatch.server.store.lifecycle import run_status

__all__ = ["RunStatus", "get_run", "list_runs"]

RunStatus = Literal["running", "finished", "stopped", "diverged", "alerting", "active", "idle"]


def _run_out(run: Run, open_alerts: int, last_frame_id: int = 0, *, tags: list[str] | None = None,
             now: float | None = None, active_seconds: float = 600.0) -> RunOut:
    now = _time.time() if now is None else now
    active = run.seen_at is not None and now - run.seen_at <= active_seconds
    return RunOut(
        id=run.id,
        project=run.project,
        name=run.name,
        created_at=run.created_at,
        last_step=run.last_step,
        last_time=run.last_time,
        seen_at=run.seen_at,
        first_time=run.time_min,
        open_alerts=open_alerts,
        last_frame_id=last_frame_id,
        status=run_status(run),
        active=active,
        ended_at=run.ended_at,
        end_step=run.end_step,
        diverged_step=run.diverged_step,
        tags=tags or [],
        config=run.config,
    )


def _tags(session: Session, run_ids: list[int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = defaultdict(list)
    if run_ids:
        for rid, tag in session.execute(
            select(RunTag.run_id, RunTag.tag).where(RunTag.run_id.in_(run_ids))
            .order_by(RunTag.tag)
        ):
            out[rid].append(tag)
    return out


def list_runs(
    session: Session,
    *,
    project: str | None = None,
    tag: str | None = None,
    status: RunStatus | None = None,
    since: float | None = None,
    until: float | None = None,
    name: str | None = None,
    active_seconds: float = 600.0,
    now: float | None = None,
    limit: int | None = None,
    offset: int = 0,
    total: list[int] | None = None,
) -> list[RunOut]:
    """Runs, most recently active first, with their count of firing alerts.

    ``limit``/``offset`` page through them (None: all); ``total``, a list, gets the number
    of runs that match the filters appended.

    Filters (all optional, combined with AND): ``project``; ``tag``; ``status``: one of
    :data:`~.lifecycle.STATUSES` (``running``, ``finished``, ``stopped``, ``diverged``: see
    :mod:`.lifecycle`), ``alerting`` (an alert firing), ``active`` (a frame within
    ``active_seconds``) or ``idle`` (none);
    ``since``/``until``: the run was active in that window of unix seconds (first seen by
    the collector at or before ``until``, its last frame's time at or after ``since``);
    ``name``: a substring of the run name.
    """
    now = _time.time() if now is None else now
    firing = (
        select(Alert.run_id, func.count().label("n")).where(Alert.state == "firing")
        .group_by(Alert.run_id).subquery()
    )
    # One index lookup per run (ix_frames_run_id): its newest frame, the stream's `after`.
    last_frame = (select(func.max(Frame.id)).where(Frame.run_id == Run.id)
                  .correlate(Run).scalar_subquery())
    q = (
        select(Run, func.coalesce(firing.c.n, 0), last_frame)
        .outerjoin(firing, firing.c.run_id == Run.id)
        .order_by(Run.last_time.desc().nulls_last(), Run.id.desc())
    )
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
    return [_run_out(r, int(n), int(last or 0), tags=tags.get(r.id), now=now,
                     active_seconds=active_seconds)
            for r, n, last in rows]


def get_run(session: Session, run_id: int, *, active_seconds: float = 600.0) -> RunOut:
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound("run-not-found", f"no run with id {run_id}")
    n = session.scalar(
        select(func.count()).where(Alert.run_id == run_id, Alert.state == "firing")
    )
    last = session.scalar(select(func.max(Frame.id)).where(Frame.run_id == run_id))
    return _run_out(run, int(n or 0), int(last or 0), tags=_tags(session, [run_id]).get(run_id),
                    active_seconds=active_seconds)
