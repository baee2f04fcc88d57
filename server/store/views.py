"""Dashboard read views: summaries that keep thousands of per-head series readable.

Built on the public read path (``queries``) and, where a view needs the stored blobs, on
``Frame``/``Metric``/``Point`` read the way ``queries`` reads them. Nothing here writes.

* :class:`SparklineCache` and :func:`runs_overview` (from ``runs_view``): the runs list.
* :func:`worst_heads`: the k heads with the most extreme value now, with their recent trend.
* :func:`heads_over_time`: steps x heads of one layer (or steps x layers, the per-layer
  envelope), bucketed over steps keeping each bucket's extreme so spikes survive.
* :func:`clip_rate`: the clip-rate series, or one derived from ``grad.clipped``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, Field
from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Metric, Point
from logitwatch.server.errors import BadRequest, NotFound
from logitwatch.server.schemas import AlertOut, SeriesOut, WireFloat
from logitwatch.server.store import queries
from logitwatch.server.store.downsample import minmax_downsample
from logitwatch.server.store.incidents import locus
from logitwatch.server.store.pruning import prune_frames, prune_join, prune_points, run_bounds
from logitwatch.server.store.runs_view import (
    RunSummaryOut,
    SparklineCache,
    runs_overview,
)

__all__ = [
    "CLIP_RATE_NAMES",
    "HeadRow",
    "HeadsTimeOut",
    "RunSummaryOut",
    "SparklineCache",
    "WorstHeadsOut",
    "clip_rate",
    "heads_over_time",
    "last_finite_step",
    "lower_is_worse",
    "ranks",
    "runs_overview",
    "worst_heads",
]

#: Scalar names a job may log its clip rate under; otherwise it is derived from grad.clipped.
CLIP_RATE_NAMES = ("grad.clip_rate", "clip_rate")


def lower_is_worse(name: str) -> bool:
    """Entropy collapses toward 0: for it the lowest heads are the worst (and a bucket keeps
    its minimum); for logits, norms and log Z the highest are."""
    return "entropy" in name

# --- per-head summaries ---------------------------------------------------------------------


def _heads_metric(session: Session, run_id: int, name: str) -> Metric | None:
    """The per-head metric ``name`` of the run; None when the run has not logged it (yet)."""
    queries.get_run(session, run_id)
    m = session.scalar(select(Metric).where(Metric.run_id == run_id, Metric.name == name))
    if m is not None and not m.layers:
        raise BadRequest("not-per-head", f"{name!r} is a scalar series, not per head",
                         field="name")
    return m


@dataclass(slots=True)
class _Row:
    step: int
    data: bytes


class HeadRow(BaseModel):
    layer: int
    head: int
    value: WireFloat
    before: WireFloat | None = Field(description="the value at the window's first sample")
    change: WireFloat | None
    ratio_to_median: WireFloat | None = Field(description="value / median of all heads now")
    alert: str | None = Field(description="state of the newest alert on this head, if any")
    trend_steps: list[int]
    trend_values: list[WireFloat]


class WorstHeadsOut(BaseModel):
    name: str
    rank: int
    step: int | None
    layers: int
    heads: int
    order: str = Field(description="'highest' or 'lowest' first")
    median: WireFloat | None
    window: int = Field(description="samples in each trend")
    rows: list[HeadRow]
    latest_step: int | None = Field(None, description="the newest sample's step")
    nonfinite_from: int | None = Field(
        None, description="after a NaN/Inf: the first step with a non-finite value; the rows "
        "are then those of `step`, the last step where every head was finite")


def _worst_key(v: np.ndarray, low: bool) -> np.ndarray:
    """Sort keys, smallest = worst: non-finite values first (they are the loudest signal)."""
    return np.where(np.isfinite(v), v if low else -v, -np.inf)


def worst_heads(
    session: Session, *, run_id: int, name: str, rank: int = 0, k: int = 10, window: int = 50,
    alerts: list[AlertOut] | None = None,
) -> WorstHeadsOut:
    """The ``k`` heads with the highest value of ``name`` now (lowest, for entropy), each
    with its value ``window`` samples ago and its trend over those samples."""
    low = lower_is_worse(name)
    m = _heads_metric(session, run_id, name)
    empty = WorstHeadsOut(name=name, rank=rank, step=None, layers=0, heads=0,
                          order="lowest" if low else "highest", median=None, window=window,
                          rows=[])
    if m is None:
        return empty
    # The newest frames through the (run, step) index first, then their points by key: a
    # join ordered by step would visit every point of the metric. Sampled frames only: the
    # history steps between them (seq < 0, store/ingest.py) carry no matrices.
    size = m.layers * m.heads
    rows = _newest_rows(session, run_id, m.id, rank, window)[::-1]
    if not rows:
        return empty
    mat = np.frombuffer(b"".join(r.data for r in rows), dtype="<f4").reshape(len(rows), size)
    mat = mat.astype(np.float64)
    latest_step, nonfinite_from = rows[-1].step, None
    if not np.isfinite(mat[-1]).all():
        # Diverged: the heads at the last step where every value was finite, and since when.
        good = last_finite_step(session, run_id=run_id, metric_id=m.id, rank=rank, size=size)
        if good is not None:
            later = [r.step for r in rows if r.step > good]
            nonfinite_from = later[0] if later else None
            rows = _newest_rows(session, run_id, m.id, rank, window, until=good)[::-1]
            mat = np.frombuffer(b"".join(r.data for r in rows), dtype="<f4")
            mat = mat.reshape(len(rows), size).astype(np.float64)
            if nonfinite_from is None:
                nonfinite_from = next_sample(session, run_id, rank, good, m.id)
    steps = [r.step for r in rows]
    now = mat[-1]
    finite_now = now[np.isfinite(now)]
    median = float(np.median(finite_now)) if finite_now.size else None
    order = np.argsort(_worst_key(now, low), kind="stable")[:k]
    newest: dict[tuple[int, int], str] = {}  # firing wins over any other state
    for a in alerts or ():
        layer, head, heads = locus(a)  # over: max alerts name the head that held the max
        if layer is None or a.rank != rank:
            continue
        for one in heads or ([head] if head is not None else []):
            if newest.get((layer, one)) != "firing":
                newest[(layer, one)] = a.state
    out = []
    for idx in order.tolist():
        layer, head = divmod(idx, m.heads)
        v, b = float(now[idx]), float(mat[0, idx])
        change = v - b if len(rows) > 1 and math.isfinite(v) and math.isfinite(b) else None
        ratio = (v / median if median and math.isfinite(v) else None)
        out.append(HeadRow(
            layer=layer, head=head, value=v, before=b if len(rows) > 1 else None,
            change=change, ratio_to_median=ratio, alert=newest.get((layer, head)),
            trend_steps=steps, trend_values=mat[:, idx].tolist(),
        ))
    return WorstHeadsOut(name=name, rank=rank, step=steps[-1], layers=m.layers, heads=m.heads,
                         order="lowest" if low else "highest", median=median,
                         window=len(rows), rows=out, latest_step=latest_step,
                         nonfinite_from=nonfinite_from)


#: Look-back queries :func:`_newest_rows` makes at most.
ROWS_CHUNKS = 8


def _newest_rows(session: Session, run_id: int, metric_id: int, rank: int, n: int,
                 until: int | None = None) -> list[_Row]:
    """The ``n`` newest matrices of the metric (at or before step ``until``), newest first.
    Frame ids through the (run, step) index first, then their points by key: a join
    ordered by step would visit every point of the metric. Frames without the metric are
    passed over: the history steps (seq < 0, store/ingest.py), and the scalars-only frames
    a job sends between samples (a history flush every 10 steps, a closing frame), so the
    frames are read newest first in chunks until ``n`` matrices are found (at most
    :data:`ROWS_CHUNKS` queries)."""
    bounds = run_bounds(session, run_id)
    out: list[_Row] = []
    for _ in range(ROWS_CHUNKS):
        limit = max(64, 2 * (n - len(out)))
        q = (select(Frame.id, Frame.step, Frame.time)
             .where(Frame.run_id == run_id, Frame.rank == rank, Frame.seq >= 0)
             .order_by(Frame.step.desc(), Frame.seq.desc()).limit(limit))
        if until is not None:
            q = q.where(Frame.step <= until)
        recent = session.execute(prune_frames(q, bounds)).all()
        if not recent:
            break
        times = [f.time for f in recent]  # their points lie in those frames' days only
        data = dict(session.execute(prune_points(
            select(Point.frame_id, Point.data)
            .where(Point.metric_id == metric_id, Point.frame_id.in_([f.id for f in recent])),
            (min(times), max(times)) if bounds else None)
        ).all())
        out.extend(_Row(f.step, data[f.id]) for f in recent if f.id in data)
        if len(out) >= n or len(recent) < limit:
            break
        until = recent[-1].step - 1
        if until < 0:
            break
    return out[:n]


def next_sample(session: Session, run_id: int, rank: int, step: int,
                metric_id: int) -> int | None:
    """The first step after ``step`` with a matrix of the metric (a scalars-only frame
    between samples has none)."""
    return session.scalar(prune_frames(select(func.min(Frame.step)).where(
        Frame.run_id == run_id, Frame.rank == rank, Frame.seq >= 0, Frame.step > step,
        exists().where(Point.frame_id == Frame.id, Point.metric_id == metric_id)),
        run_bounds(session, run_id)))


#: Frames read per query while looking back for the last finite matrix, and at most.
FINITE_CHUNK = 512
FINITE_MAX = 50_000


def last_finite_step(session: Session, *, run_id: int, metric_id: int, rank: int,
                     size: int) -> int | None:
    """The newest step at which every value of a per-head metric was finite (None: none in
    the newest :data:`FINITE_MAX` samples): what the heads looked like before a NaN."""
    until: int | None = None
    seen = 0
    while seen < FINITE_MAX:
        rows = _newest_rows(session, run_id, metric_id, rank, FINITE_CHUNK, until=until)
        if not rows:
            return None
        mat = np.frombuffer(b"".join(r.data for r in rows), dtype="<f4").reshape(len(rows), size)
        ok = np.isfinite(mat).all(axis=1)
        if ok.any():
            return rows[int(np.argmax(ok))].step
        seen += len(rows)
        until = rows[-1].step - 1
        if until < 0:
            return None
    return None


def ranks(session: Session, run_id: int) -> list[int]:
    """The ranks that sent frames for the run, in order."""
    return list(session.scalars(prune_frames(
        select(Frame.rank).where(Frame.run_id == run_id).distinct().order_by(Frame.rank),
        run_bounds(session, run_id))))


class HeadsTimeOut(BaseModel):
    """A heatmap over time: rows are the heads of one layer (or the layers, each the extreme
    over its heads), columns are step buckets."""

    name: str
    rank: int
    layer: int | None
    layers: int
    heads: int
    reduce: str = Field(description="'max' or 'min': what each bucket (and envelope) keeps")
    total: int = Field(description="samples in the range")
    bucket: int = Field(description="samples per column (1 = full resolution)")
    steps: list[int] = Field(description="first step of each column")
    values: list[list[WireFloat | None]] = Field(description="rows x columns")


def _bucket_reduce(mat: np.ndarray, edges: np.ndarray, low: bool) -> np.ndarray:
    """Reduce (n, rows) to (buckets, rows) keeping each bucket's extreme; NaN only when a
    bucket holds nothing else, +/-Inf kept (it is the extreme)."""
    starts = edges[:-1]
    nan = np.isnan(mat)
    if low:
        filled = np.where(nan, np.inf, mat)
        red = np.minimum.reduceat(filled, starts, axis=0)
    else:
        filled = np.where(nan, -np.inf, mat)
        red = np.maximum.reduceat(filled, starts, axis=0)
    all_nan = np.logical_and.reduceat(nan, starts, axis=0)
    red[all_nan] = np.nan
    return red


def _layers_worst(per: np.ndarray, low: bool) -> np.ndarray:
    """(n, layers, heads) to (n, layers): each layer's worst head (NaN only when all are)."""
    nan = np.isnan(per)
    if low:
        env = np.where(nan, np.inf, per).min(axis=2)
    else:
        env = np.where(nan, -np.inf, per).max(axis=2)
    env[nan.all(axis=2)] = np.nan
    return env


def heads_over_time(
    session: Session, *, run_id: int, name: str, rank: int = 0, layer: int | None = None,
    start: int | None = None, end: int | None = None, max_cols: int = 300,
) -> HeadsTimeOut:
    """Steps x heads of ``layer`` (or, without a layer, steps x layers with each layer's
    max over its heads: the per-layer envelope), bucketed to at most ``max_cols`` columns.

    A single layer is read as a byte slice of each stored matrix (``substr``), so the cost
    does not grow with the number of layers.
    """
    low = lower_is_worse(name)
    reduce = "min" if low else "max"
    m = _heads_metric(session, run_id, name)

    def empty(layers: int = 0, heads: int = 0) -> HeadsTimeOut:
        return HeadsTimeOut(name=name, rank=rank, layer=layer, layers=layers, heads=heads,
                            reduce=reduce, total=0, bucket=1, steps=[], values=[])

    if m is None:
        return empty()
    if layer is not None and not 0 <= layer < m.layers:
        raise BadRequest("bad-selector", f"layer: {name!r} has layers 0..{m.layers - 1}",
                         field="layer")
    width = m.heads if layer is not None else m.layers * m.heads
    data = (func.substr(Point.data, layer * m.heads * 4 + 1, m.heads * 4)
            if layer is not None else Point.data)
    q = (select(Frame.step, data.label("data"))
         .join(Frame, Frame.id == Point.frame_id)
         .where(Point.metric_id == m.id, Frame.rank == rank)
         .order_by(Frame.step, Frame.seq))
    if start is not None:
        q = q.where(Frame.step >= start)
    if end is not None:
        q = q.where(Frame.step <= end)
    bounds = run_bounds(session, run_id)
    n = session.scalar(prune_join(q.with_only_columns(func.count()).order_by(None), bounds))
    if not n:
        return empty(m.layers, m.heads)
    cols = max(1, max_cols)
    edges = np.unique(np.linspace(0, n, cols + 1).astype(np.int64)) if n > cols \
        else np.arange(n + 1, dtype=np.int64)
    bucket = math.ceil(n / cols) if n > cols else 1
    # Read and reduce a chunk of rows at a time (the columns' edges are known from the
    # count): the cost in memory is a chunk and the columns, not the run's every matrix.
    done: list[np.ndarray] = []
    first_steps: list[int] = []
    carry: tuple[int, np.ndarray] | None = None  # the column still open, partly reduced
    i = 0
    chunk = queries.chunk_rows(m.layers * m.heads)
    result = session.execute(prune_join(q.limit(n), bounds).execution_options(yield_per=chunk))
    for part in result.partitions(chunk):
        k = len(part)
        mat = np.frombuffer(b"".join(bytes(r.data) for r in part), dtype="<f4")
        mat = mat.reshape(k, width).astype(np.float64)
        if layer is None:
            mat = _layers_worst(mat.reshape(k, m.layers, m.heads), low)
        b0 = int(np.searchsorted(edges, i, "right")) - 1
        b1 = int(np.searchsorted(edges, i + k - 1, "right")) - 1
        local = np.clip(edges[b0:b1 + 2], i, i + k) - i
        red = _bucket_reduce(mat, local, low)
        for b in range(b0, b1 + 1):
            if edges[b] >= i:
                first_steps.append(int(part[int(edges[b]) - i].step))
        if carry is not None:
            if carry[0] == b0:
                red[0] = _bucket_reduce(np.vstack([carry[1], red[0]]), np.array([0, 2]),
                                        low)[0]
            else:
                done.append(carry[1])
        done.extend(red[:-1])
        carry = (b1, red[-1])
        i += k
    result.close()
    if carry is None:  # deleted since the count
        return empty(m.layers, m.heads)
    done.append(carry[1])
    mat = np.vstack(done)
    steps = np.asarray(first_steps, dtype=np.int64)
    n = i
    values = [[x if math.isfinite(x) else None for x in row] for row in mat.T.tolist()]
    return HeadsTimeOut(name=name, rank=rank, layer=layer, layers=m.layers, heads=m.heads,
                        reduce=reduce, total=n, bucket=bucket, steps=steps.tolist(),
                        values=values)


# --- derived scalars ------------------------------------------------------------------------


def clip_rate(
    session: Session, *, run_id: int, rank: int = 0, start: int | None = None,
    end: int | None = None, max_points: int = 2000, window: int = 20,
) -> SeriesOut | None:
    """The fraction of clipped steps: the job's own clip-rate series when it logs one,
    else the mean of ``grad.clipped`` over the last ``window`` samples at each sample.
    None when the run has neither."""
    names = {mo.name for mo in queries.list_metrics(session, run_id)}
    for name in CLIP_RATE_NAMES:
        if name in names:
            return queries.get_series(session, run_id=run_id, name=name, rank=rank,
                                      start=start, end=end, max_points=max_points)
    if "grad.clipped" not in names:
        return None
    try:
        # a zoom reads its range and the window before it, not the run (every step, from
        # the history: a million steps were 290 MB and 7 s a request, zoomed or not)
        lower = None  # from the first sample: the whole run, or fewer than a window before
        if start is not None:
            lower = queries.nth_step_before(session, run_id=run_id, name="grad.clipped",
                                            rank=rank, step=start, n=window - 1)
        steps, v = queries.scalar_arrays(session, run_id=run_id, name="grad.clipped",
                                         rank=rank, start=lower, end=end)
    except NotFound:
        return None
    clipped = np.where(np.isfinite(v), v > 0, 0.0).astype(np.float64)
    c = np.concatenate([[0.0], np.cumsum(clipped)])
    idx = np.arange(len(clipped))
    lo = np.maximum(0, idx + 1 - window)
    rate = (c[idx + 1] - c[lo]) / (idx + 1 - lo) if len(clipped) else clipped
    keep = np.ones(len(steps), dtype=bool)
    if start is not None:
        keep &= steps >= start
    if end is not None:
        keep &= steps <= end
    s, r = minmax_downsample(steps[keep], rate[keep], max_points)
    return SeriesOut(name=f"clip rate ({window}-sample mean of grad.clipped)", rank=rank,
                     total=int(keep.sum()), steps=s.tolist(), values=r.tolist())
