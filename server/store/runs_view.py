"""The dashboard's runs list: a row per run with its status, verdict, loss sparkline, start,
duration, tags and configuration; filtered by project, status, open alerts and a substring
of its name, project, tags or configuration.

* :class:`SparklineCache`: loss sparklines per run, cached and extended incrementally
  (only new frames are read; a page's runs in one query, or one per week of days its runs
  cover on a store partitioned by time).
* :func:`runs_overview`: one page of the list, filtered, ordered and paged in SQL; a run's
  status and verdict read its last loss from ``runs`` (kept by ingest, migration 0016), so
  no sparkline is made for a run that is not on the page.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, Select, Text, and_, cast, exists, func, or_, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Metric, Point, Run, RunTag
from logitwatch.server.db.partitions import DAY, is_partitioned
from logitwatch.server.errors import BadRequest
from logitwatch.server.schemas import AlertOut, RunOut, WireFloat
from logitwatch.server.store import incidents as inc
from logitwatch.server.store import runs
from logitwatch.server.store.alerts import firing_alerts
from logitwatch.server.store.downsample import minmax_downsample
from logitwatch.server.store.pruning import Bounds, prune_join

__all__ = ["STATUSES", "RunSummaryOut", "SparklineCache", "runs_overview"]

STATUSES = ("running", "finished", "stopped", "diverged", "empty")


class RunSummaryOut(BaseModel):
    """One row of the runs list."""

    id: int
    project: str
    name: str
    status: str = Field(description="the run's status (running, finished, stopped, "
                        "diverged: GET /api/v1/runs), diverged also when its last loss is "
                        "non-finite, or empty (no frame yet)")
    last_step: int | None
    last_time: float | None
    seen_at: float | None = Field(None, description="when the collector last received a "
                                  "frame of it (its clock, not the job's)")
    first_time: float | None = Field(None, description="its first frame's time (the job's "
                                     "clock, as last_time and ended_at)")
    open_alerts: int
    loss_steps: list[int] = Field(description="loss sparkline: steps")
    loss_values: list[WireFloat] = Field(description="loss sparkline: values")
    last_loss: WireFloat | None
    created_at: float = Field(description="when its first frame came (unix seconds)")
    ended_at: float | None = Field(None, description="when its job said it ended")
    tags: list[str] = Field(default_factory=list)
    config: dict[str, Any] | None = Field(None, description="what its job said about "
                                          "itself (PUT /api/v1/runs/{run}/config)")
    verdict: str = Field("healthy", description="diverged, stopped, warning, "
                         "finished_alerting, finished, healthy or empty (the run page's "
                         "verdict, from its firing alerts and its last loss)")
    verdict_text: str = ""


@dataclass(slots=True)
class _Spark:
    key: tuple[float, int | None, float | None]  # (created_at, last step, last time)
    last_frame_id: int = 0
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    values: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))


class SparklineCache:
    """Loss sparklines per run, read once and then extended with new frames only.

    Keyed by run id and validated by the run's (creation time, last step, last time): an
    unchanged run costs nothing, a changed one reads the points after the last frame already
    seen, and a run made anew under a deleted run's id (SQLite reuses the highest ids) starts
    over instead of inheriting the deleted run's points. Bounded:
    each run keeps at most ``4 * points`` values, re-downsampled with min/max buckets, and
    the cache at most ``max_runs`` runs, the least recently listed dropped first (read
    again if listed again). One cache per application (one database).
    """

    # 5,000 runs: at most ~22 MB (4 * 64 steps and values, 16 bytes each, per run)
    def __init__(self, points: int = 64, metric: str = "loss", max_runs: int = 5_000) -> None:
        self.points = points
        self.metric = metric
        self.max_runs = max_runs
        self._runs: OrderedDict[int, _Spark] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session: Session, runs: list[RunOut]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """(steps, values) of each run's sparkline (rank 0)."""
        with self._lock:
            stale = [r for r in runs if (s := self._runs.get(r.id)) is None
                     or s.key != (r.created_at, r.last_step, r.last_time)]
            if stale:
                self._refresh(session, stale)
            out = {r.id: _downsample_keep_last(self._runs[r.id].steps,
                                               self._runs[r.id].values, self.points)
                   for r in runs}
            for r in runs:
                self._runs.move_to_end(r.id)
            while len(self._runs) > max(self.max_runs, len(runs)):
                self._runs.popitem(last=False)
            return out

    def __len__(self) -> int:
        return len(self._runs)

    def _refresh(self, session: Session, runs: list[RunOut]) -> None:
        ids = [r.id for r in runs]
        metric_of = dict(session.execute(
            select(Metric.run_id, Metric.id).where(Metric.run_id.in_(ids),
                                                   Metric.name == self.metric)
        ).all())
        spark_of: dict[int, _Spark] = {}  # by metric id
        for r in runs:
            s = self._runs.get(r.id)
            if s is None or s.key[0] != r.created_at:
                s = _Spark(key=(r.created_at, None, None))
            s.key = (r.created_at, r.last_step, r.last_time)
            self._runs[r.id] = s
            mid = metric_of.get(r.id)
            if mid is not None:
                spark_of[mid] = s
        for group, bounds in _by_days(session, list(metric_of)):
            after = {metric_of[rid]: spark_of[metric_of[rid]].last_frame_id for rid in group}
            for mid, rows in _new_points(session, after, bounds):
                self._extend(spark_of[mid], rows)

    def _extend(self, s: _Spark, rows: list[Any]) -> None:
        """Add a run's new points (step order) to its sparkline."""
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


#: (metric, frames already read) pairs one query of :func:`_new_points` reads at most.
SPARK_CHUNK = 500


#: The most days one read of a page's points spans (:func:`_by_days`).
SPAN_DAYS = 7


def _by_days(session: Session,
             run_ids: list[int]) -> list[tuple[list[int], Bounds | None]]:
    """The runs in groups, each with the least and greatest frame time of its runs: on a
    store partitioned by time (:mod:`.pruning`) the read of a group's points then plans
    the partitions of those days only, not every partition (820 at 410 days kept: several
    seconds of planning, and PostgreSQL's JIT compiling the plan). Runs are grouped in the
    order of their first frame while a group spans at most :data:`SPAN_DAYS` (a longer
    run is a group of its own): one group for a page of recent runs, a few for one that
    spans months. Elsewhere one group, unbounded."""
    if not run_ids:
        return []
    if not is_partitioned(session.connection()):
        return [(run_ids, None)]
    rows = session.execute(select(Run.id, Run.time_min, Run.time_max)
                           .where(Run.id.in_(run_ids))).all()
    out: list[tuple[list[int], Bounds | None]] = []
    unknown = {r.id for r in rows if r.time_min is None or r.time_max is None}
    if unknown:  # no frame stored yet, or bounds never kept: no pruning
        out.append((sorted(unknown), None))
    group: list[int] = []
    lo = hi = 0.0
    for r in sorted((r for r in rows if r.id not in unknown), key=lambda r: r.time_min):
        if group and max(hi, r.time_max) - lo <= SPAN_DAYS * DAY:
            group.append(r.id)
            hi = max(hi, r.time_max)
            continue
        if group:
            out.append((group, (lo, hi)))
        group, lo, hi = [r.id], r.time_min, r.time_max
    if group:
        out.append((group, (lo, hi)))
    return out


def _new_points(session: Session, after: dict[int, int],
                bounds: Bounds | None = None) -> Iterator[tuple[int, list[Any]]]:
    """(metric id, its rank 0 points after frame ``after[metric]``, in (step, seq) order)
    for each metric of ``after`` that has some: one query for a page's runs, not one per run
    (the metrics that have read the same frames share one ``IN``; a cold cache's: all of
    them), within ``bounds`` (:func:`_by_days`). Streamed a metric at a time: one run's
    points in memory, not the page's."""
    items = sorted(after.items())
    for i in range(0, len(items), SPARK_CHUNK):
        by_after: dict[int, list[int]] = {}
        for mid, last in items[i:i + SPARK_CHUNK]:
            by_after.setdefault(last, []).append(mid)
        q = (select(Point.metric_id, Frame.id, Frame.step, Point.data)
             .join(Frame, Frame.id == Point.frame_id)
             .where(or_(*[and_(Point.metric_id.in_(mids), Point.frame_id > last)
                          for last, mids in by_after.items()]), Frame.rank == 0)
             .order_by(Point.metric_id, Frame.step, Frame.seq))
        result = session.execute(prune_join(q, bounds).execution_options(yield_per=10_000))
        mid, rows = -1, []
        for row in result:
            if row.metric_id != mid:
                if rows:
                    yield mid, rows
                mid, rows = row.metric_id, []
            rows.append(row)
        if rows:
            yield mid, rows


def _downsample_keep_last(
    steps: np.ndarray, values: np.ndarray, points: int
) -> tuple[np.ndarray, np.ndarray]:
    """Min/max buckets, plus the newest point (a sparkline ends at the current value)."""
    s, v = minmax_downsample(steps, values, points)
    if len(steps) and (not len(s) or s[-1] != steps[-1]):
        s, v = np.append(s, steps[-1]), np.append(v, values[-1])
    return s, v


def _status(run: RunOut, last_loss: float | None) -> str:
    if run.last_step is None:
        return "empty"
    if last_loss is not None and not math.isfinite(last_loss):
        return "diverged"
    return run.status


def _status_is(status: str) -> ColumnElement[bool]:
    """SQL: :func:`_status` of the run is ``status`` (the run's last loss from ``runs``)."""
    nonfinite = runs.loss_nonfinite()
    if status == "empty":
        return Run.last_step.is_(None)
    if status == "diverged":
        return and_(Run.last_step.is_not(None), or_(Run.diverged_step.is_not(None), nonfinite))
    return and_(Run.last_step.is_not(None), Run.diverged_step.is_(None), ~nonfinite,
                Run.status == status)


def _searchable(name: str, project: str, tags: list[str], config: dict[str, Any] | None) -> str:
    """What the runs list's filter box matches: name, project, tags and configuration."""
    text = (json.dumps(config, separators=(",", ":"), ensure_ascii=False)
            if config else "")  # "wikipédia" must match as typed, not as \u00e9
    return " ".join([name, project, *tags, text]).lower()


#: The ASCII letters and digits of a lowered needle, each of which a match holds whole.
_TOKEN = re.compile(r"[a-z0-9]+")
#: The characters whose lower case (Python's) holds an ASCII letter: "İ" -> "i̇" and the
#: Kelvin sign -> "k"; SQL's lower() keeps them, so a run holding one is kept for the check.
_LOWER_TO_ASCII = ("\u0130", "\u212a")


def _may_match(needle: str) -> ColumnElement[bool] | None:
    """SQL that every run :func:`_searchable` matches ``needle`` (lowered) in satisfies,
    and few others: each ASCII letter-and-digit run of the needle is in one of the run's
    name, project, a tag or its stored configuration, ASCII case folded (None: the needle
    has none). A run is searched as ``name project tags... config`` (spaces between), so a
    letter-and-digit run of a match lies within one of them. The stored configuration is
    the JSON text the database holds (``json.dumps``' default, non-ASCII as \\uXXXX), which
    holds every letter-and-digit run of the compact text the check reads. The exact check
    is :func:`_searchable`, on the runs this keeps."""
    tokens = set(_TOKEN.findall(needle))
    tokens = {t for t in tokens if not any(t != u and t in u for u in tokens)}
    if not tokens:
        return None
    config = cast(Run.config, Text)
    fields = [func.lower(Run.name), func.lower(Run.project), func.lower(config)]
    every = [or_(*[f.contains(t, autoescape=True) for f in fields],
                 exists().where(RunTag.run_id == Run.id,
                                func.lower(RunTag.tag).contains(t, autoescape=True)))
             for t in sorted(tokens)]
    unsure = [f.contains(c, autoescape=True) for c in _LOWER_TO_ASCII
              for f in (Run.name, Run.project, config)]
    unsure += [config.contains(json.dumps(c)[1:-1], autoescape=True) for c in _LOWER_TO_ASCII]
    return or_(and_(*every), *unsure)


def _matching(session: Session, q: Select[tuple[Run]], needle: str) -> list[int]:
    """The ids of the runs of ``q`` (in its order) whose :func:`_searchable` text holds
    ``needle``: narrowed in SQL (:func:`_may_match`), then checked exactly on those."""
    maybe = _may_match(needle)
    if maybe is not None:
        q = q.where(maybe)
    rows = session.execute(q.with_only_columns(Run.id, Run.name, Run.project, Run.config)).all()
    tags = runs._tags(session, [r.id for r in rows])
    return [r.id for r in rows
            if needle in _searchable(r.name, r.project, tags.get(r.id, []), r.config)]


def _verdict(r: RunOut, firing: list[AlertOut], last_loss: float | None) -> inc.VerdictOut:
    """The run page's verdict (:func:`incidents.verdict`), from the run, its firing alerts
    and its last loss (:func:`~.runs.last_loss`, as the run page reads it)."""
    if r.last_step is None:
        return inc.VerdictOut(kind="empty", text="no data yet", detail="")
    return inc.verdict(r, firing, last_loss=last_loss)


def runs_overview(
    session: Session,
    cache: SparklineCache,
    *,
    project: str | None = None,
    status: str | None = None,
    alerting: bool = False,
    q: str | None = None,
    limit: int | None = None,
    offset: int = 0,
    total: list[int] | None = None,
) -> list[RunSummaryOut]:
    """The runs list, most recently active first, filtered by project, status (one of
    :data:`STATUSES`: the run's own, ``diverged`` also for a non-finite last loss, ``empty``
    before its first frame), open alerts and a substring of the run's name, project, tags
    or configuration (case-insensitive); a page of ``limit`` runs from ``offset`` (None:
    all). ``total``, a list, gets the number that match.

    Filtered, ordered and paged in SQL (the substring narrowed there, then checked on the
    runs that may match); sparklines, firing alerts and tags are read for the page only."""
    if status is not None and status not in STATUSES:
        raise BadRequest("bad-status", f"status: {status!r} is not one of {', '.join(STATUSES)}",
                         field="status")
    sel = runs.select_runs(project=project, status="alerting" if alerting else None)
    if status is not None:
        sel = sel.where(_status_is(status))
    if q:
        ids = _matching(session, sel, q.lower())
        if total is not None:
            total.append(len(ids))
        page = runs.read_runs(session, ids[offset:None if limit is None else offset + limit])
    else:
        page = runs.read_page(session, sel, limit=limit, offset=offset, total=total)
    sparks = cache.get(session, [p.out for p in page])
    firing: dict[int, list[AlertOut]] = {}
    for a in firing_alerts(session, [p.out.id for p in page if p.out.open_alerts]):
        firing.setdefault(a.run_id, []).append(a)
    out = []
    for p in page:
        r, last = p.out, p.last_loss
        steps, values = sparks[r.id]
        v = _verdict(r, firing.get(r.id, []), last)
        out.append(RunSummaryOut(
            id=r.id, project=r.project, name=r.name, status=_status(r, last),
            last_step=r.last_step, last_time=r.last_time, seen_at=r.seen_at,
            first_time=r.first_time, open_alerts=r.open_alerts, loss_steps=steps.tolist(),
            loss_values=values.tolist(), last_loss=last, created_at=r.created_at,
            ended_at=r.ended_at, tags=r.tags, config=r.config, verdict=v.kind,
            verdict_text=v.text,
        ))
    return out
