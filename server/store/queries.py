"""The read path: runs, metric names, downsampled series, layer x head matrices."""

from __future__ import annotations

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Alert, Frame, Metric, Point, Run
from logitwatch.server.errors import BadRequest, NotFound
from logitwatch.server.schemas import HeatmapOut, MetricOut, RunOut, SeriesOut
from logitwatch.server.store.codec import decode
from logitwatch.server.store.downsample import minmax_downsample

__all__ = ["get_heatmap", "get_run", "get_series", "list_metrics", "list_runs"]


def _run_out(run: Run, open_alerts: int, last_frame_id: int = 0) -> RunOut:
    return RunOut(
        id=run.id,
        project=run.project,
        name=run.name,
        created_at=run.created_at,
        last_step=run.last_step,
        last_time=run.last_time,
        open_alerts=open_alerts,
        last_frame_id=last_frame_id,
    )


def list_runs(session: Session, *, project: str | None = None) -> list[RunOut]:
    """All runs (of ``project``, when given), most recently active first, with their count
    of firing alerts."""
    counts = dict(
        session.execute(
            select(Alert.run_id, func.count()).where(Alert.state == "firing").group_by(Alert.run_id)
        ).all()
    )
    q = select(Run).order_by(Run.last_time.desc().nulls_last(), Run.id.desc())
    if project is not None:
        q = q.where(Run.project == project)
    runs = session.scalars(q).all()
    return [_run_out(r, counts.get(r.id, 0)) for r in runs]


def get_run(session: Session, run_id: int) -> RunOut:
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound("run-not-found", f"no run with id {run_id}")
    n = session.scalar(
        select(func.count()).where(Alert.run_id == run_id, Alert.state == "firing")
    )
    last = session.scalar(select(func.max(Frame.id)).where(Frame.run_id == run_id))
    return _run_out(run, int(n or 0), int(last or 0))


def list_metrics(session: Session, run_id: int) -> list[MetricOut]:
    get_run(session, run_id)
    rows = session.scalars(select(Metric).where(Metric.run_id == run_id).order_by(Metric.name))
    return [
        MetricOut(name=m.name, kind="heads" if m.layers else "scalar", layers=m.layers,
                  heads=m.heads)
        for m in rows
    ]


def _metric(session: Session, run_id: int, name: str) -> Metric:
    get_run(session, run_id)
    m = session.scalar(select(Metric).where(Metric.run_id == run_id, Metric.name == name))
    if m is None:
        raise NotFound("metric-not-found", f"run {run_id} has no metric {name!r}")
    return m


def get_series(
    session: Session,
    *,
    run_id: int,
    name: str,
    rank: int = 0,
    layer: int | None = None,
    head: int | None = None,
    start: int | None = None,
    end: int | None = None,
    max_points: int = 2000,
) -> SeriesOut:
    """One series over a step range, downsampled with min/max-preserving buckets.

    For a per-head metric, ``layer`` and ``head`` pick one head; without them the series is
    the maximum over all layers and heads at each step (the run's envelope).
    """
    m = _metric(session, run_id, name)
    if m.layers and ((layer is None) != (head is None)):
        raise BadRequest("bad-selector", "give both layer and head, or neither")
    if m.layers and layer is not None and head is not None:
        if not (0 <= layer < m.layers and 0 <= head < m.heads):
            raise BadRequest(
                "bad-selector", f"{name!r} has {m.layers} layers x {m.heads} heads"
            )
    q = (
        select(Frame.step, Point.data)
        .join(Frame, Frame.id == Point.frame_id)
        .where(Point.metric_id == m.id, Frame.rank == rank)
        .order_by(Frame.step, Frame.seq)
    )
    if start is not None:
        q = q.where(Frame.step >= start)
    if end is not None:
        q = q.where(Frame.step <= end)
    rows = session.execute(q).all()
    steps = np.fromiter((r.step for r in rows), dtype=np.int64, count=len(rows))
    if not rows:
        values = np.zeros(0, dtype=np.float32)
    elif not m.layers:
        values = np.frombuffer(b"".join(r.data for r in rows), dtype="<f4")
    else:
        mat = np.frombuffer(b"".join(r.data for r in rows), dtype="<f4").reshape(
            len(rows), m.layers * m.heads
        )
        if layer is not None and head is not None:
            values = mat[:, layer * m.heads + head]
        else:
            with np.errstate(invalid="ignore"):
                values = np.max(mat, axis=1)
    s, v = minmax_downsample(steps, values.astype(np.float64), max_points)
    return SeriesOut(name=name, rank=rank, layer=layer, head=head, total=len(rows),
                     steps=s.tolist(), values=v.tolist())


def get_heatmap(
    session: Session, *, run_id: int, name: str, rank: int = 0, step: int | None = None
) -> HeatmapOut:
    """The layer x head matrix of ``name`` at ``step`` (the latest at or before it)."""
    m = _metric(session, run_id, name)
    if not m.layers:
        raise BadRequest("not-per-head", f"{name!r} is a scalar series, not per head")
    q = (
        select(Frame.step, Point.data)
        .join(Frame, Frame.id == Point.frame_id)
        .where(Point.metric_id == m.id, Frame.rank == rank)
        .order_by(Frame.step.desc(), Frame.seq.desc())
        .limit(1)
    )
    if step is not None:
        q = q.where(Frame.step <= step)
    row = session.execute(q).first()
    if row is None:
        return HeatmapOut(name=name, rank=rank, step=None, values=[])
    mat = decode(row.data, m.layers, m.heads).astype(np.float64)
    return HeatmapOut(name=name, rank=rank, step=row.step, values=mat.tolist())
