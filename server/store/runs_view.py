"""The dashboard's runs list: a row per run with its status, verdict, loss sparkline, start,
duration, tags and configuration; filtered by project, status, open alerts and a substring
of its name, project, tags or configuration.

* :class:`SparklineCache`: loss sparklines per run, cached and extended incrementally
  (only new frames are read).
* :func:`runs_overview`: one page of the list.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Metric, Point
from logitwatch.server.errors import BadRequest
from logitwatch.server.schemas import AlertOut, RunOut, WireFloat
from logitwatch.server.store import incidents as inc
from logitwatch.server.store import queries
from logitwatch.server.store.alerts import firing_alerts
from logitwatch.server.store.downsample import minmax_downsample

__all__ = ["STATUSES", "RunSummaryOut", "SparklineCache", "last_loss", "runs_overview"]

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
                .order_by(Frame.step, Frame.seq)
            ).all()
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


def _searchable(r: RunOut) -> str:
    """What the runs list's filter box matches: name, project, tags and configuration."""
    config = (json.dumps(r.config, separators=(",", ":"), ensure_ascii=False)
              if r.config else "")  # "wikipédia" must match as typed, not as \u00e9
    return " ".join([r.name, r.project, *r.tags, config]).lower()


def _verdict(r: RunOut, firing: list[AlertOut], last_loss: float | None) -> inc.VerdictOut:
    """The run page's verdict (:func:`incidents.verdict`), from the run, its firing alerts
    and its last loss, as the run page reads it (:func:`last_loss`)."""
    if r.last_step is None:
        return inc.VerdictOut(kind="empty", text="no data yet", detail="")
    return inc.verdict(r, firing, last_loss=last_loss)


def last_loss(session: Session, cache: SparklineCache, run: RunOut) -> float | None:
    """The run's last loss (rank 0) as the runs list reads it (its sparkline's newest point),
    for the run page's and the inbox's verdicts, so that the list and the page agree."""
    _, values = cache.get(session, [run])[run.id]
    return float(values[-1]) if len(values) else None


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
    before its first frame), open alerts and a substring of the run or project name; a
    page of ``limit`` runs from ``offset`` (None: all), sparklines made for that page only
    unless ``status`` needs them all. ``total``, a list, gets the number that match."""
    if status is not None and status not in STATUSES:
        raise BadRequest("bad-status", f"status: {status!r} is not one of {', '.join(STATUSES)}",
                         field="status")
    runs = queries.list_runs(session, project=project, status="alerting" if alerting else None)
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
        v = _verdict(r, firing.get(r.id, []), last)
        out.append(RunSummaryOut(
            id=r.id, project=r.project, name=r.name, status=st, last_step=r.last_step,
            last_time=r.last_time, seen_at=r.seen_at, first_time=r.first_time,
            open_alerts=r.open_alerts, loss_steps=steps.tolist(),
            loss_values=values.tolist(), last_loss=last, created_at=r.created_at,
            ended_at=r.ended_at, tags=r.tags, config=r.config, verdict=v.kind,
            verdict_text=v.text,
        ))
    if status is not None:
        if total is not None:
            total.append(len(out))
        out = out[offset:end]
    return out
