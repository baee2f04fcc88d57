"""Reading runs back, as API models: the runs list with its filters and its paging, and one
run, each with its count of firing alerts, its newest frame and its tags.

A page costs the same whatever the number of stored runs: the filters, the order and the
page are SQL, and what each run of the page needs besides its row (its firing alerts, its
tags) is one query for the whole page. Nothing here reads frames: a run's newest frame id
and its last loss are kept on ``runs`` by ingest (migration 0016), so that on a partitioned
PostgreSQL no read of the list plans the partitions of ``frames``.

* :func:`select_runs`: the filtered, ordered ``SELECT`` of runs, for callers that add
  predicates of their own (the dashboard's runs list) before :func:`read_page`.
* :func:`read_page` / :func:`read_runs`: a page of that query, or runs by id, as
  :class:`RunRead` (the API model and the run's last loss).
* :func:`list_runs`, :func:`get_run`, :func:`read_run`: the list and one run.
"""

from __future__ import annotations

import math
import time as _time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import ColumnElement, Select, exists, func, or_, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Alert, Run, RunTag
from logitwatch.server.errors import NotFound
from logitwatch.server.schemas import RunOut
from logitwatch.server.store.lifecycle import run_status

__all__ = ["RunRead", "RunStatus", "get_run", "last_loss", "list_runs", "loss_nonfinite",
           "read_page", "read_run", "read_runs", "select_runs"]

RunStatus = Literal["running", "finished", "stopped", "diverged", "alerting", "active", "idle"]

#: Ids per ``IN (...)`` list: SQLite binds at most 32,766 parameters a statement.
IN_CHUNK = 10_000


@dataclass(frozen=True, slots=True)
class RunRead:
    """A run as the API shows it, and its last loss (:func:`last_loss`), which the runs
    list and the verdicts read and :class:`RunOut` does not carry."""

    out: RunOut
    last_loss: float | None


def last_loss(run: Run) -> float | None:
    """The run's last loss as ingest kept it: rank 0's loss at its newest (step, seq) with
    one, float32 as stored, NaN and inf included; None before its first loss. SQLite
    cannot store NaN (it stores NULL): there a NaN is a NULL value marked not finite."""
    if run.last_loss_finite is None:
        return None
    if run.last_loss is None:
        return math.nan
    return float(run.last_loss)


def loss_nonfinite() -> ColumnElement[bool]:
    """SQL: the run's last loss is NaN or infinite (false before its first loss)."""
    return Run.last_loss_finite.is_(False)


def _run_out(run: Run, open_alerts: int, *, tags: list[str] | None = None,
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
        last_frame_id=run.last_frame_id or 0,
        status=run_status(run),
        active=active,
        ended_at=run.ended_at,
        end_step=run.end_step,
        diverged_step=run.diverged_step,
        tags=tags or [],
        config=run.config,
    )


def _chunks(ids: Sequence[int]) -> Iterator[list[int]]:
    for i in range(0, len(ids), IN_CHUNK):
        yield list(ids[i:i + IN_CHUNK])


def _tags(session: Session, run_ids: Sequence[int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = defaultdict(list)
    for part in _chunks(run_ids):
        for rid, tag in session.execute(
            select(RunTag.run_id, RunTag.tag).where(RunTag.run_id.in_(part))
            .order_by(RunTag.tag)
        ):
            out[rid].append(tag)
    return out


def _firing_counts(session: Session, run_ids: Sequence[int]) -> dict[int, int]:
    """Firing alerts per run (suppressed ones included: the list's ``open_alerts``)."""
    out: dict[int, int] = {}
    for part in _chunks(run_ids):
        out.update((rid, int(n)) for rid, n in session.execute(
            select(Alert.run_id, func.count()).where(Alert.run_id.in_(part),
                                                     Alert.state == "firing")
            .group_by(Alert.run_id)))
    return out


def _reads(session: Session, runs: Sequence[Run], *, now: float,
           active_seconds: float) -> list[RunRead]:
    """``runs`` as :class:`RunRead`, with one query for their alerts and one for their tags."""
    ids = [r.id for r in runs]
    firing = _firing_counts(session, ids)
    tags = _tags(session, ids)
    return [RunRead(_run_out(r, firing.get(r.id, 0), tags=tags.get(r.id), now=now,
                             active_seconds=active_seconds), last_loss(r))
            for r in runs]


def select_runs(
    *,
    project: str | None = None,
    tag: str | None = None,
    status: RunStatus | None = None,
    since: float | None = None,
    until: float | None = None,
    name: str | None = None,
    active_seconds: float = 600.0,
    now: float | None = None,
) -> Select[tuple[Run]]:
    """The runs that match the filters (see :func:`list_runs`), most recently active first."""
    now = _time.time() if now is None else now
    q = select(Run).order_by(Run.last_time.desc().nulls_last(), Run.id.desc())
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
        q = q.where(exists().where(Alert.run_id == Run.id, Alert.state == "firing"))
    if since is not None:
        q = q.where(Run.last_time >= since)
    if until is not None:
        q = q.where(Run.created_at <= until)
    if name is not None:
        q = q.where(Run.name.contains(name, autoescape=True))
    return q


def read_page(
    session: Session,
    q: Select[tuple[Run]],
    *,
    limit: int | None = None,
    offset: int = 0,
    total: list[int] | None = None,
    active_seconds: float = 600.0,
    now: float | None = None,
) -> list[RunRead]:
    """``limit`` runs of ``q`` from ``offset`` (None: all); ``total``, a list, gets the
    number of runs ``q`` matches."""
    now = _time.time() if now is None else now
    if total is not None:
        total.append(session.scalar(select(func.count()).select_from(
            q.with_only_columns(Run.id).order_by(None).subquery())) or 0)
    if limit is not None:
        q = q.limit(limit)
    if offset:
        q = q.offset(offset)
    return _reads(session, session.scalars(q).all(), now=now, active_seconds=active_seconds)


def read_runs(session: Session, run_ids: Sequence[int], *, active_seconds: float = 600.0,
              now: float | None = None) -> list[RunRead]:
    """The runs of ``run_ids``, in that order (an id with no run is left out)."""
    now = _time.time() if now is None else now
    found: dict[int, Run] = {}
    for part in _chunks(run_ids):
        found.update((r.id, r) for r in session.scalars(select(Run).where(Run.id.in_(part))))
    return _reads(session, [found[i] for i in run_ids if i in found], now=now,
                  active_seconds=active_seconds)


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
    q = select_runs(project=project, tag=tag, status=status, since=since, until=until,
                    name=name, active_seconds=active_seconds, now=now)
    return [r.out for r in read_page(session, q, limit=limit, offset=offset, total=total,
                                     active_seconds=active_seconds, now=now)]


def read_run(session: Session, run_id: int, *, active_seconds: float = 600.0) -> RunRead:
    """One run and its last loss; :class:`NotFound` ``run-not-found`` when there is none."""
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound("run-not-found", f"no run with id {run_id}")
    return _reads(session, [run], now=_time.time(), active_seconds=active_seconds)[0]


def get_run(session: Session, run_id: int, *, active_seconds: float = 600.0) -> RunOut:
    return read_run(session, run_id, active_seconds=active_seconds).out
