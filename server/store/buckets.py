"""Min/max bucketing in SQL for long series: the database returns ~2 rows a bucket.

A whole-run (or wide-zoom) chart of an every-step series would otherwise read every row into
Python before :func:`.downsample.minmax_downsample` keeps ~2,000 of them. Here the query
groups the rows by step bucket and returns, per bucket, its minimum and its maximum with
their steps; every non-finite value is its own group, so each NaN and Inf comes back as
today. The contract is the downsampler's: per bucket the first point (in step order)
holding the finite minimum and the first holding the finite maximum, every non-finite point
kept, at most about ``max_points`` points in step order.

Buckets are ``max_points // 2`` equal step ranges over the selected frames' steps: a row at
step offset ``o`` of ``n`` steps is in bucket ``((o + 1) * B - 1) // n``, which is exactly
the downsampler's equal-count bucket when every step has one value (an every-step series);
on a sparser series the buckets are equal in steps rather than in points.

Values are little-endian float32 blobs. Each row's 4 bytes become their unsigned integer
``u`` (SQLite: ``int.from_bytes``, registered on the connection, a C builtin; PostgreSQL:
``get_byte``), then an order-preserving key ``k`` (``u`` for a positive float,
``2**31 - 1 - u`` for a negative one; ``-0.0`` sorts just below ``+0.0``), and
``min(k * 2**32 + offset)`` / ``max(k * 2**32 + 2**32 - 1 - offset)`` give each bucket's
extreme with its first step in one integer; Python turns the key back into the exact float.
Only reads of one rank (no cross-rank merge) of a 4-byte value (a scalar, a stored envelope
or one head's value) take this path; :func:`bucketed` answers None otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from sqlalchemy import BigInteger, case, cast, func, literal, select
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Point
from logitwatch.server.store.pruning import Bounds, prune_frames, prune_join

__all__ = ["BUCKET_FACTOR", "bucketed", "key_to_f32"]

#: A series is bucketed in SQL only when its step range holds more than this many times
#: ``max_points`` steps and it has more than that many rows; smaller ones are read whole.
BUCKET_FACTOR = 4

_W = 4294967296  # 2**32: the composite's offset field
_FINITE = 2139095040  # 0x7f800000: |bits| at and above it is Inf or NaN
Where = Callable[[Any], Any]


def _u32_sqlite(session: Session, data: Any, byte: int | None) -> Any:
    raw = session.connection().connection.driver_connection
    raw.create_function("lw_u32", 2, int.from_bytes, deterministic=True)
    blob = data if byte is None else func.substr(data, byte + 1, 4)
    return func.lw_u32(blob, literal("little"))


def _u32_postgresql(data: Any, byte: int | None) -> Any:
    b = [cast(func.get_byte(data, (byte or 0) + i), BigInteger) for i in range(4)]
    return b[0] + b[1] * 256 + b[2] * 65536 + b[3] * 16777216


def key_to_f32(keys: np.ndarray) -> np.ndarray:
    """Order-preserving integer keys back to their float32 values (as float64)."""
    k = keys.astype(np.int64)
    u = np.where(k >= 0, k, 2147483647 - k).astype(np.uint32)
    return u.view("<f4").astype(np.float64)


def _step_range(session: Session, run_id: int, where: Where,
                bounds: Bounds | None) -> tuple[int, int] | None:
    def one(agg: Any) -> Any:
        q = where(select(agg).where(Frame.run_id == run_id))
        return prune_frames(q, bounds).scalar_subquery()

    row = session.execute(select(one(func.min(Frame.step)), one(func.max(Frame.step)))).first()
    if row is None or row[0] is None:
        return None
    return int(row[0]), int(row[1])


def bucketed(
    session: Session, *, run_id: int, metric_id: int, data: Any, byte: int, scalar: bool,
    rank: int | None, where: Where, bounds: Bounds | None, max_points: int,
) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(steps, values, total) of one rank's 4-byte series bucketed in SQL, or None when the
    series is short enough (or the read unsuited) to be read whole and downsampled.

    ``where`` restricts a query over ``Frame`` to the read's rank and step/time ranges;
    ``data`` is ``points.data`` and ``byte`` the value's offset in it."""
    budget = BUCKET_FACTOR * max_points
    if rank is None or max_points < 4:
        return None
    span = _step_range(session, run_id, where, bounds)
    if span is None:
        return None
    s0, s1 = span
    n = s1 - s0 + 1
    if n <= budget or n >= 2**31:
        return None
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        u_expr = _u32_sqlite(session, data, None if scalar else byte)
    elif dialect == "postgresql":
        u_expr = _u32_postgresql(data, None if scalar else byte)
    else:
        return None
    inner = (
        select(u_expr.label("u"), (Frame.step - s0).label("o"))
        .select_from(Point)
        .join(Frame, Frame.id == Point.frame_id)
        .where(Point.metric_id == metric_id)
    )
    if scalar:
        inner = inner.where(func.length(Point.data) == 4)  # the partial index's condition
    inner = prune_join(where(inner), bounds)
    # Not flattened into the grouping query, so that each row's bytes are decoded once.
    inner = (inner.limit(-1) if dialect == "sqlite" else inner.offset(0)).subquery()
    u, o = inner.c.u, inner.c.o
    k = case((u < 2147483648, u), else_=2147483647 - u)
    buckets = max_points // 2
    bucket = ((o + 1) * buckets - 1) // n
    # Non-finite values group by bucket and kind (sign, NaN or Inf): each bucket keeps the
    # first of each kind, as minmax_downsample does: a run logging NaN for its last million
    # steps stays a few points a bucket.
    kind = case((u >= 2147483648, 2), else_=0) + case(
        (u.op("&")(2147483647) > _FINITE, 1), else_=0)
    group = case((u.op("&")(2147483647) < _FINITE, bucket), else_=-1 - (bucket * 4 + kind))
    q = select(func.min(k * _W + o), func.max(k * _W + (_W - 1) - o),
               func.count()).group_by(group)
    rows = session.connection().execute(q).all()
    total = sum(r[2] for r in rows)
    if total <= budget:
        return None
    lo = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    hi = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
    lo_step, hi_step = (lo & (_W - 1)) + s0, (_W - 1) - (hi & (_W - 1)) + s0
    lo_val, hi_val = key_to_f32(lo >> 32), key_to_f32(hi >> 32)
    same = (lo_step == hi_step) & (lo >> 32 == hi >> 32)
    steps = np.concatenate([lo_step, hi_step[~same]])
    values = np.concatenate([lo_val, hi_val[~same]])
    order = np.argsort(steps, kind="stable")
    return steps[order], values[order], int(total)
