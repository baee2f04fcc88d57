"""The read path of a run's series: metric names, downsampled series, layer x head matrices.

The runs themselves are read in :mod:`.runs` (the runs list, one run) and changed in
:mod:`.run_edits` (configuration, tags, deletion); their names are re-exported here, the
one module the routes, the CLI and the tests read the store through.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Metric, Point
from logitwatch.server.errors import BadRequest, NotFound
from logitwatch.server.schemas import HeatmapOut, MetricOut, SeriesOut
from logitwatch.server.store.buckets import bucketed
from logitwatch.server.store.codec import decode
from logitwatch.server.store.downsample import minmax_downsample
from logitwatch.server.store.ingest import ENVELOPE
from logitwatch.server.store.pruning import Bounds, prune_join, run_bounds
from logitwatch.server.store.run_edits import (  # noqa: F401  (re-exported)
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_KEYS,
    TAG_RE,
    _depth,
    delete_run,
    set_config,
    set_tags,
)
from logitwatch.server.store.runs import (  # noqa: F401  (re-exported)
    RunStatus,
    _run_out,
    _tags,
    get_run,
    list_runs,
)

__all__ = [
    "Agg",
    "Merge",
    "RunStatus",
    "TAG_RE",
    "delete_run",
    "get_heatmap",
    "get_run",
    "get_series",
    "list_metrics",
    "list_runs",
    "set_tags",
]

Merge = Literal["max", "min", "mean"]
Agg = Literal["max", "min", "mean"]


def list_metrics(session: Session, run_id: int) -> list[MetricOut]:
    get_run(session, run_id)
    rows = session.scalars(
        select(Metric).where(Metric.run_id == run_id, Metric.name.not_like(f"%{ENVELOPE}"))
        .order_by(Metric.name)
    )
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


def _frames_query(
    cols: list[Any], metric_id: int, rank: int | None, start: int | None, end: int | None,
    start_time: float | None, end_time: float | None, bounds: Bounds | None = None,
) -> Any:
    q = (
        select(*cols)
        .join(Point, (Point.frame_id == Frame.id) & (Point.metric_id == metric_id))
    )
    return prune_join(_where_frames(q, rank, start, end, start_time, end_time), bounds)


def _where_frames(
    q: Any, rank: int | None, start: int | None, end: int | None,
    start_time: float | None, end_time: float | None,
) -> Any:
    """Restrict a query over ``Frame`` to a rank and step/time ranges (None: no bound)."""
    if rank is not None:
        q = q.where(Frame.rank == rank)
    if start is not None:
        q = q.where(Frame.step >= start)
    if end is not None:
        q = q.where(Frame.step <= end)
    if start_time is not None:
        q = q.where(Frame.time >= start_time)
    if end_time is not None:
        q = q.where(Frame.time <= end_time)
    return q


def _read_series(
    session: Session, metric_id: int, data: Any, *, scalar: bool, rank: int | None,
    start: int | None, end: int | None, start_time: float | None, end_time: float | None,
    bounds: Bounds | None = None,
) -> tuple[np.ndarray, list[bytes]]:
    """(steps, blobs) of one metric, in (step, rank, seq) order.

    Driven from ``points`` by metric id (scalars: from the covering partial index alone)
    and sorted in numpy, which is several times faster than walking frames in step order
    and fetching each frame's row. ``bounds``: the run's time bounds on a store partitioned
    by time (:mod:`.pruning`).
    """
    q = (
        select(Frame.step, Frame.rank, Frame.seq, data)
        .select_from(Point)
        .join(Frame, Frame.id == Point.frame_id)
        .where(Point.metric_id == metric_id)
    )
    if scalar:
        q = q.where(func.length(Point.data) == 4)  # the partial index's condition
    q = prune_join(_where_frames(q, rank, start, end, start_time, end_time), bounds)
    rows = session.connection().execute(q).all()
    n = len(rows)
    steps = np.fromiter((r[0] for r in rows), dtype=np.int64, count=n)
    if n > 1:
        ranks = np.fromiter((r[1] for r in rows), dtype=np.int64, count=n)
        seqs = np.fromiter((r[2] for r in rows), dtype=np.int64, count=n)
        order = np.lexsort((seqs, ranks, steps))
        if not (order[1:] > order[:-1]).all():
            steps = steps[order]
            return steps, [rows[i][3] for i in order.tolist()]
    return steps, [r[3] for r in rows]


def scalar_arrays(session: Session, *, run_id: int, name: str, rank: int = 0,
                  start: int | None = None, end: int | None = None,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one rank's scalar series in a step range, whole, as numpy arrays
    (16 bytes a step; not the Python lists of :func:`get_series`, ~20x that): for a
    statistic derived from every step (the clip rate)."""
    m = _metric(session, run_id, name)
    steps, blobs = _read_series(session, m.id, Point.data, scalar=True, rank=rank,
                                start=start, end=end, start_time=None, end_time=None,
                                bounds=run_bounds(session, run_id))
    values = (np.frombuffer(b"".join(blobs), dtype="<f4").astype(np.float64) if blobs
              else np.zeros(0, dtype=np.float64))
    return steps, values


def nth_step_before(session: Session, *, run_id: int, name: str, rank: int, step: int,
                    n: int) -> int | None:
    """The step of the ``n``-th sample of a scalar series before ``step`` (None: fewer)."""
    m = _metric(session, run_id, name)
    q = (select(Frame.step).select_from(Point).join(Frame, Frame.id == Point.frame_id)
         .where(Point.metric_id == m.id, func.length(Point.data) == 4, Frame.rank == rank,
                Frame.step < step)
         .order_by(Frame.step.desc()).offset(max(0, n - 1)).limit(1))
    return session.scalar(prune_join(q, run_bounds(session, run_id)))


def _merge(steps: np.ndarray, values: np.ndarray, how: Merge) -> tuple[np.ndarray, np.ndarray]:
    """One value per step across ranks (``steps`` sorted): their max, min or mean.

    Non-finite values are kept as signals: max and min see inf; a NaN on any rank makes the
    step NaN for ``mean`` and is skipped by max/min unless every rank has NaN.
    """
    if len(steps) == 0:
        return steps, values
    uniq, first = np.unique(steps, return_index=True)
    if len(uniq) == len(steps):
        return steps, values
    if how == "max":
        return uniq, np.fmax.reduceat(values, first)
    if how == "min":
        return uniq, np.fmin.reduceat(values, first)
    counts = np.diff(np.append(first, len(values)))
    return uniq, np.add.reduceat(values, first) / counts


def get_series(
    session: Session,
    *,
    run_id: int,
    name: str,
    rank: int | None = 0,
    merge: Merge | None = None,
    layer: int | None = None,
    head: int | None = None,
    start: int | None = None,
    end: int | None = None,
    start_time: float | None = None,
    end_time: float | None = None,
    max_points: int = 2000,
) -> SeriesOut:
    """One series over a step (and/or time) range, min/max-preserving downsampled (one
    rank's long series in SQL, :mod:`.buckets`).

    For a per-head metric, ``layer`` and ``head`` pick one head (only its 4 bytes of each
    stored matrix leave the database); without them the series is the maximum over all
    layers and heads at each step (the run's envelope). ``merge`` (``max``, ``min``,
    ``mean``) reads every rank and reduces them per step; otherwise one ``rank`` is read.
    """
    m = _metric(session, run_id, name)
    if m.layers and ((layer is None) != (head is None)):
        raise BadRequest("bad-selector", "give both layer and head, or neither")
    one_head = bool(m.layers) and layer is not None and head is not None
    if one_head and not (0 <= layer < m.layers and 0 <= head < m.heads):  # type: ignore[operator]
        raise BadRequest("bad-selector", f"{name!r} has {m.layers} layers x {m.heads} heads")
    data: Any = Point.data
    source, scalar = m, not m.layers
    if one_head:
        data = func.substr(Point.data, (layer * m.heads + head) * 4 + 1, 4)  # type: ignore[operator]
    elif m.layers:
        env = session.scalar(select(Metric).where(Metric.run_id == run_id,
                                                  Metric.name == name + ENVELOPE))
        if env is not None:  # the stored rollup: one scalar per frame
            source, scalar = env, True
    bounds = run_bounds(session, run_id, start_time, end_time)
    if not merge and (scalar or one_head):  # a long series: min/max buckets in SQL
        got = bucketed(session, run_id=run_id, metric_id=source.id, data=Point.data,
                       byte=(layer * m.heads + head) * 4 if one_head else 0,  # type: ignore[operator]
                       scalar=scalar, rank=rank, bounds=bounds, max_points=max_points,
                       where=lambda q: _where_frames(q, rank, start, end, start_time, end_time))
        if got is not None:
            return SeriesOut(name=name, rank=rank, merge=None, layer=layer, head=head,
                             total=got[2], steps=got[0].tolist(), values=got[1].tolist())
    steps, blobs = _read_series(session, source.id, data, scalar=scalar,
                                rank=None if merge else rank, start=start, end=end,
                                start_time=start_time, end_time=end_time, bounds=bounds)
    blob = b"".join(blobs)
    if not blobs:
        values = np.zeros(0, dtype=np.float64)
    elif scalar or one_head:
        values = np.frombuffer(blob, dtype="<f4").astype(np.float64)
    else:
        mat = np.frombuffer(blob, dtype="<f4").reshape(len(blobs), m.layers * m.heads)
        values = _envelope(mat).astype(np.float64)
    if merge:
        steps, values = _merge(steps, values, merge)
    total = len(values)
    s, v = minmax_downsample(steps, values, max_points)
    return SeriesOut(name=name, rank=None if merge else rank, merge=merge, layer=layer,
                     head=head, total=total, steps=s.tolist(), values=v.tolist())


def _envelope(mat: np.ndarray) -> np.ndarray:
    """Per-row max; a row with a NaN anywhere is NaN (a non-finite head is news)."""
    with np.errstate(invalid="ignore"):
        return np.max(mat, axis=1)  # type: ignore[no-any-return]


#: Values (matrices x layers x heads) read and reduced at a time by a read over a run's
#: per-head matrices (an aggregated heatmap, heads over steps): ~10 MB of working arrays,
#: whatever the run's length and the model's number of heads.
CHUNK_VALUES = 250_000


def chunk_rows(width: int) -> int:
    """How many matrices of ``width`` values one chunk holds (at least one)."""
    return max(1, CHUNK_VALUES // max(1, width))


def get_heatmap(
    session: Session,
    *,
    run_id: int,
    name: str,
    rank: int = 0,
    step: int | None = None,
    agg: Agg | None = None,
    start: int | None = None,
    end: int | None = None,
) -> HeatmapOut:
    """The layer x head matrix of ``name``.

    Without ``agg``: at ``step`` (the latest at or before it; default the latest). With
    ``agg`` (``max``, ``min``, ``mean``): every stored matrix of the rank between ``start``
    and ``end`` (default: the whole run) reduced per head. NaN is skipped by max and min
    unless a head has nothing else; ``mean`` is over finite values.
    """
    m = _metric(session, run_id, name)
    if not m.layers:
        raise BadRequest("not-per-head", f"{name!r} is a scalar series, not per head")
    bounds = run_bounds(session, run_id)
    if agg is None:
        q = _frames_query([Frame.step, Point.data], m.id, rank, None, step, None, None, bounds)
        row = session.execute(
            q.where(Frame.run_id == run_id)
            .order_by(Frame.step.desc(), Frame.seq.desc()).limit(1)
        ).first()
        if row is None:
            return HeatmapOut(name=name, rank=rank, step=None, values=[], frames=0)
        mat = decode(row[1], m.layers, m.heads).astype(np.float64)
        return HeatmapOut(name=name, rank=rank, step=row[0], values=mat.tolist())
    q = _frames_query([Frame.step, Point.data], m.id, rank, start, end, None, None, bounds)
    # reduced a chunk at a time: a long run's matrices (up to 65,536 values each) are never
    # all in memory at once
    width = m.layers * m.heads
    red: np.ndarray | None = None
    total = np.zeros(width, dtype=np.float64)
    count = np.zeros(width, dtype=np.int64)
    frames, first, last = 0, None, None
    result = session.execute(q.where(Frame.run_id == run_id).execution_options(
        yield_per=chunk_rows(width)))
    for chunk in result.partitions():
        stack = np.frombuffer(b"".join([r[1] for r in chunk]), dtype="<f4").reshape(
            len(chunk), width)
        steps = [r[0] for r in chunk]
        frames += len(chunk)
        first = min(steps) if first is None else min(first, *steps)
        last = max(steps) if last is None else max(last, *steps)
        with np.errstate(invalid="ignore"):
            if agg == "max":
                part = np.fmax.reduce(stack, axis=0)
                red = part if red is None else np.fmax(red, part)
            elif agg == "min":
                part = np.fmin.reduce(stack, axis=0)
                red = part if red is None else np.fmin(red, part)
            else:
                fin = np.isfinite(stack)
                total += np.where(fin, stack, 0).sum(axis=0, dtype=np.float64)
                count += fin.sum(axis=0)
    if not frames:
        return HeatmapOut(name=name, rank=rank, step=None, values=[], agg=agg, frames=0)
    if red is None:  # mean over finite values
        with np.errstate(invalid="ignore", divide="ignore"):
            red = total / count
    return HeatmapOut(
        name=name, rank=rank, step=last, first_step=first, agg=agg, frames=frames,
        values=red.astype(np.float64).reshape(m.layers, m.heads).tolist(),
    )
