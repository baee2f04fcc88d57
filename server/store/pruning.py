"""Reads that prune PostgreSQL's time partitions (0011): the run's time bounds in the query.

``frames`` and ``points`` are partitioned by day on PostgreSQL (``server/db/partitions.py``).
A read that joins ``points`` to ``frames`` on the frame id alone makes the planner plan,
and the executor probe, every partition of both tables: yesterday to a week ahead plus the
default one at least, whatever days the run covers. With the run's time bounds as
constants (``runs.time_min``/``time_max``, kept by ingest, 0012) on both tables' ``time``,
only the partitions of the run's days are planned and probed. Not ``points.time =
frames.time`` in the join as well: PostgreSQL then takes the two equalities as independent,
expects about no rows, and picks plans that read every row of the metric (the latest
heatmap went from 0.3 to 5-8 ms of execution; ``bench/bench_partitions.py``); a point's
partition is pruned by constants where the frames are known first (the worst heads).

``points.time`` exists on PostgreSQL only (the models describe the SQLite schema): on
SQLite, and on a PostgreSQL store that is not partitioned, :func:`run_bounds` is None and
every helper here returns the query unchanged.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float, literal_column, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Run
from logitwatch.server.db.partitions import is_partitioned

__all__ = ["POINT_TIME", "Bounds", "prune_frames", "prune_join", "prune_points", "run_bounds"]

#: ``points.time`` (PostgreSQL, partitioned store only), for queries that name ``points``
#: unaliased.
POINT_TIME = literal_column("points.time", Float)

Bounds = tuple[float, float]


def run_bounds(session: Session, run_id: int, start_time: float | None = None,
               end_time: float | None = None) -> Bounds | None:
    """The run's ``(least, greatest)`` frame time, narrowed to ``start_time``/``end_time``
    when given; None where the store is not partitioned by time (nothing to prune) or the
    run's bounds are unknown."""
    if not is_partitioned(session.connection()):
        return None
    row = session.execute(select(Run.time_min, Run.time_max).where(Run.id == run_id)).first()
    if row is None or row[0] is None or row[1] is None:
        return None
    lo, hi = float(row[0]), float(row[1])
    if start_time is not None:
        lo = max(lo, start_time)
    if end_time is not None:
        hi = min(hi, end_time)
    return lo, hi


def prune_frames(q: Any, bounds: Bounds | None) -> Any:
    """``q`` (over ``frames``) with ``frames.time`` within ``bounds``."""
    if bounds is None:
        return q
    return q.where(Frame.time >= bounds[0], Frame.time <= bounds[1])


def prune_points(q: Any, bounds: Bounds | None) -> Any:
    """``q`` (over ``points``, unaliased) with ``points.time`` within ``bounds``."""
    if bounds is None:
        return q
    return q.where(POINT_TIME >= bounds[0], POINT_TIME <= bounds[1])


def prune_join(q: Any, bounds: Bounds | None) -> Any:
    """``q`` (``points`` joined to ``frames`` on the frame id) with both times within
    ``bounds``."""
    return prune_points(prune_frames(q, bounds), bounds)
