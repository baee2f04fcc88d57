"""What the live stream needs: frames stored after a given frame id.

The stream polls this about once a second per open run page. On a PostgreSQL store
partitioned by day (``server/db/partitions.py``) a read by ``run_id``, ``rank`` and
``id > after`` alone made the planner plan every partition of ``frames`` (and ``points``
by frame id) on every poll: 42 ms of planning a poll at 410 partitions. The reads carry
time bounds as constants, so only the partitions of the relevant days are planned:

* ``frames``: the run's time bounds (``runs.time_min``/``time_max``, :func:`run_bounds`).
  Not a bound taken from what the stream already sent (the time of its last frame): the
  frames of one run do not arrive in time order (a job resumed on a host whose clock is
  behind, a spool pushed late, a history row stamped with its carrier's time), and a frame
  stored after the last one sent, but stamped before it, would be skipped for good. Every
  stored frame of the run lies within the run's bounds, which ingest widens in the same
  transaction that stores the frame (``store/ingest.py``).
* ``points``: the times of the frames just read (a point carries its frame's time).

The bounds are read in one statement and the frames in the next, and a frame stored in
between may lie outside bounds read before it: the frames statement reads the run's bounds
again, in its own snapshot, and is run again with them when they grew (a frame skipped
while later ones are sent would never be sent). A poll that finds nothing sends nothing
and moves nothing: the next poll reads the bounds afresh.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Metric, Point, Run
from logitwatch.server.db.partitions import is_partitioned
from logitwatch.server.store.pruning import Bounds, prune_frames, prune_points, run_bounds
from logitwatch.wire import encode_float

__all__ = ["frames_since"]

#: Reads of a page whose run's bounds keep growing under it (an ingest committing between
#: the bounds' read and the page's, each time) before the page is read without bounds.
BOUNDED_TRIES = 3


def _page(session: Session, *, run_id: int, rank: int, after_id: int, limit: int,
          bounds: Bounds | None) -> list[Any]:
    """The frames of the page: up to ``limit`` of ``run_id``'s ``rank`` after ``after_id``,
    in id order. With ``bounds``: read within them, and read again within the run's bounds
    as the page's own statement saw them while those are wider (module docstring)."""
    base = (select(Frame.id, Frame.step, Frame.seq, Frame.time)
            .where(Frame.run_id == run_id, Frame.rank == rank, Frame.id > after_id)
            .order_by(Frame.id).limit(limit))
    if bounds is None:
        return list(session.execute(base).all())
    now_min = select(Run.time_min).where(Run.id == run_id).scalar_subquery()
    now_max = select(Run.time_max).where(Run.id == run_id).scalar_subquery()
    for _ in range(BOUNDED_TRIES):
        rows = session.execute(prune_frames(base.add_columns(now_min, now_max), bounds)).all()
        if not rows:  # nothing sent, after_id unmoved: nothing can be skipped for good
            return []
        lo, hi = rows[0][4], rows[0][5]
        if lo is None or hi is None:  # the run's bounds gone (cannot be: read unbounded)
            break
        if lo >= bounds[0] and hi <= bounds[1]:  # every frame of the run was in reach
            return list(rows)
        bounds = (min(lo, bounds[0]), max(hi, bounds[1]))
    return list(session.execute(base).all())


def frames_since(
    session: Session, *, run_id: int, after_id: int, rank: int = 0, limit: int = 1000
) -> tuple[int, list[dict[str, Any]], dict[str, Any] | None]:
    """Return (last frame id, new frames' scalars, latest per-head matrices).

    Each frame is ``{"step", "scalars": {name: value}}`` with non-finite values encoded as
    on the wire; the steps of a frame's history (scalars-only rows, ``seq < 0``) come as
    frames too. The matrices are those of the newest frame with attention matrices,
    ``{"step", name: matrix}`` (only ``{"step"}`` when the page holds none: history steps,
    a history flush or a closing frame only). On a partitioned PostgreSQL every read is
    bounded by time (module docstring); the answer is the same.
    """
    frames = _page(session, run_id=run_id, rank=rank, after_id=after_id, limit=limit,
                   bounds=run_bounds(session, run_id))
    if not frames:
        return after_id, [], None
    ids = [f.id for f in frames]
    # the points of these frames lie within these frames' times
    partitioned = is_partitioned(session.connection())
    times: Bounds | None = ((min(f.time for f in frames), max(f.time for f in frames))
                            if partitioned else None)
    metrics = {m.id: m for m in session.scalars(select(Metric).where(Metric.run_id == run_id))
               if "#" not in m.name}  # hidden rollups (store/ingest.py ENVELOPE)
    scalar_ids = [i for i, m in metrics.items() if not m.layers]
    matrix_ids = [i for i, m in metrics.items() if m.layers]
    attn_ids = [i for i in matrix_ids if metrics[i].name.startswith("attn.")]
    out: dict[int, dict[str, Any]] = {f.id: {"step": f.step, "scalars": {}} for f in frames}
    # the page's scalars only: a page of 1,000 sampled frames holds 1,000 frames' matrices,
    # of which only the newest frame's are sent
    if scalar_ids:
        for fid, mid, data in session.execute(prune_points(
            select(Point.frame_id, Point.metric_id, Point.data)
            .where(Point.metric_id.in_(scalar_ids), Point.frame_id.in_(ids)), times)
        ):
            arr = np.frombuffer(data, dtype="<f4")
            out[fid]["scalars"][metrics[mid].name] = encode_float(float(arr[0]))
    # the newest frame with per-head matrices: a history flush or a closing frame after a
    # sampled one in the same page carries scalars (or q/k norms) only
    with_heads = set(session.scalars(prune_points(
        select(Point.frame_id).where(Point.metric_id.in_(attn_ids), Point.frame_id.in_(ids))
        .distinct(), times)
    )) if attn_ids else set()
    sampled = [f for f in frames if f.seq >= 0]
    newest = next((f for f in reversed(frames) if f.id in with_heads),
                  sampled[-1] if sampled else frames[-1])
    latest: dict[str, Any] = {"step": newest.step}
    if matrix_ids:
        for mid, data in session.execute(prune_points(
            select(Point.metric_id, Point.data)
            .where(Point.metric_id.in_(matrix_ids), Point.frame_id == newest.id),
            (newest.time, newest.time) if partitioned else None)
        ):
            m = metrics[mid]
            arr = np.frombuffer(data, dtype="<f4").astype(np.float64)
            latest[m.name] = [
                [encode_float(x) for x in row] for row in arr.reshape(m.layers, m.heads).tolist()
            ]
    return ids[-1], [out[i] for i in ids], latest
