"""The write path: frames in, deduplicated on (run, rank, seq), stored in one transaction.

Safe with several collector processes on one database: runs, metrics and frames are
inserted with ``ON CONFLICT DO NOTHING`` (SQLite and PostgreSQL), so two collectors that
receive the same batch (a client's resend after a lost answer) store each frame once, and
the one that loses the race counts it as a duplicate instead of failing. Frames are
inserted in (rank, step, seq) order, a fixed order of their keys, so two transactions never
wait on each other in opposite orders (no deadlock), and a run's ``last_step`` only moves
forward, in one UPDATE.

A frame's ``history`` (the scalars of the unsampled steps before it, see
``logitwatch.wire``) is stored as one scalars-only frame row per step, ``seq = -(step +
1)`` (a client's own seqs are >= 0) and the carrying frame's time, so series queries,
retention and the alert engine's restore read those steps like any other. The dedup key
then makes a resent frame's history a duplicate too. A job restarted from an earlier
checkpoint that sends a step's history again keeps the first values stored for that step
(the restarted job's own sampled frames are new frames, as always). Null values are not
stored; a step without any value stores no row. History rows count neither as accepted
nor as duplicate frames and never move the run's ``last_step``/``last_time``.
"""

from __future__ import annotations

import math
import time as _time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import (
    Boolean,
    and_,
    case,
    column,
    func,
    insert,
    literal,
    or_,
    select,
    table,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from logitwatch.server.db.models import Frame, Metric, Point, Run
from logitwatch.server.db.partitions import is_partitioned
from logitwatch.server.errors import BadRequest
from logitwatch.server.schemas import FrameIn
from logitwatch.server.store.pruning import run_bounds

_F32 = np.dtype("<f4")
#: Suffix of the hidden scalar metric that holds a per-head metric's max over heads per
#: frame ("attn.logit_max#max"); '#' is outside the name alphabet, so it cannot collide.
ENVELOPE = "#max"

__all__ = ["ENVELOPE", "IngestResult", "NewFrame", "ingest_frames"]


@dataclass(slots=True)
class NewFrame:
    """A frame that was stored by this call (duplicates are not), for the alert engine."""

    run_id: int
    rank: int
    step: int
    time: float
    scalars: dict[str, float]
    heads: dict[str, list[list[float]]]
    #: the ``seq`` the job sent it under (a history step: its carrying frame's), which
    #: follows the job's clock: an old spool pushed late is numbered before what came
    seq: int = 0


@dataclass(slots=True)
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    run_ids: set[int] = field(default_factory=set)
    new_frames: list[NewFrame] = field(default_factory=list)


def _insert(session: Session, table: Any) -> Any:
    """``INSERT`` of the session's dialect, which knows ``ON CONFLICT DO NOTHING``."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database {dialect!r}: use SQLite or PostgreSQL")


def _run_id(session: Session, project: str, name: str) -> int:
    q = select(Run.id).where(Run.project == project, Run.name == name)
    rid = session.scalar(q)
    if rid is not None:
        return rid
    # Another collector may create the same run at the same moment: whoever loses the
    # race reads the winner's row.
    session.execute(
        _insert(session, Run)
        .values(project=project, name=name, created_at=_time.time())
        .on_conflict_do_nothing(index_elements=["project", "name"])
    )
    return session.execute(q).scalar_one()


def _metric_ids(
    session: Session, run_id: int, shapes: dict[str, tuple[int, int]], limit: int | None
) -> dict[str, int]:
    def stored() -> dict[str, int]:
        rows = session.execute(
            select(Metric.name, Metric.id, Metric.layers, Metric.heads).where(
                Metric.run_id == run_id, Metric.name.in_(list(shapes))
            )
        ).all()
        for r in rows:
            if (r.layers, r.heads) != shapes[r.name]:
                raise BadRequest(
                    "shape-mismatch",
                    f"metric {r.name!r} of this run is {_kind((r.layers, r.heads))} since "
                    f"the run's first frame of it, this batch sends "
                    f"{_kind(shapes[r.name])}: the model's shape changed. Nothing of this "
                    "batch was stored. A new model needs a new run: use a new run name "
                    "(a different run= in the client)",
                )
        return {r.name: r.id for r in rows}

    ids = stored()
    new = [name for name in shapes if name not in ids]
    if not new:
        return ids
    visible = [name for name in new if ENVELOPE not in name]
    if limit is not None and visible:
        new = visible
        have = session.scalar(
            select(func.count()).where(Metric.run_id == run_id,
                                       Metric.name.not_like(f"%{ENVELOPE}"))
        ) or 0
        if have + len(new) > limit:
            raise BadRequest(
                "too-many-metrics",
                f"frames: this batch would give the run {have + len(new)} metric names "
                f"({have} stored, {len(new)} new, e.g. {new[0]!r}); at most {limit} per run "
                "(max_metrics_per_run). Nothing was stored.",
                field="frames",
            )
    missing = sorted(name for name in shapes if name not in ids)
    session.execute(
        _insert(session, Metric).on_conflict_do_nothing(index_elements=["run_id", "name"]),
        [{"run_id": run_id, "name": n, "layers": shapes[n][0], "heads": shapes[n][1]}
         for n in missing],
    )
    return stored()


def _want(shapes: dict[str, tuple[int, int]], name: str, shape: tuple[int, int]) -> None:
    """Note that the batch stores ``name`` with ``shape``; one name, one shape."""
    have = shapes.setdefault(name, shape)
    if have != shape:
        raise BadRequest(
            "shape-mismatch",
            f"metric {name!r} is sent as {_kind(have)} and as {_kind(shape)} in this batch; "
            "nothing was stored: send one shape per name (another name for the other)",
        )


def _kind(s: tuple[int, int]) -> str:
    return f"a {s[0]}x{s[1]} (layers x heads) matrix" if s[0] else "a scalar"


def _shape(m: Any) -> tuple[int, int]:
    return (len(m), len(m[0]))


#: The largest finite float32: values are stored as float32.
F32_MAX = float(np.finfo(np.float32).max)


def _saturated(a: np.ndarray) -> np.ndarray | None:
    """``a`` with its finite values beyond float32's range set to ±F32_MAX, or None when
    it has none. float32 would store them as ±Infinity: a finite 1e39 (a gradient norm
    blowing up in a float64 job) would read back as an overflow, and fire the rules for
    non-finite values; saturated, it stays a finite, enormous value."""
    with np.errstate(invalid="ignore"):
        big = np.isfinite(a) & (np.abs(a) > F32_MAX)
    if not big.any():
        return None
    return np.where(big, np.copysign(F32_MAX, a), a)


def _as_lists(m: Any) -> list[list[float]]:
    return m.tolist() if isinstance(m, np.ndarray) else m  # type: ignore[no-any-return]


@dataclass(slots=True)
class _Step:
    """One history step of a frame, stored as a scalars-only frame of its own."""

    rank: int
    seq: int
    step: int
    time: float
    scalars: dict[str, float]
    heads: dict[str, Any] = field(default_factory=dict)
    sent_seq: int = 0  # the seq of the frame that carried it


def history_seq(step: int) -> int:
    """The ``seq`` of a history step's frame row: negative, so it never meets a client's."""
    return -(step + 1)


def _history_steps(f: FrameIn) -> list[_Step]:
    """``f``'s history as frame rows, steps without any value left out."""
    h = f.history
    if h is None or not h.steps:
        return []
    series = list(h.scalars.items())
    out = []
    for i, step in enumerate(h.steps):
        values = {k: float(v[i]) for k, v in series if v[i] is not None}  # type: ignore[arg-type]
        if values:
            out.append(_Step(f.rank, history_seq(step), step, f.time, values, sent_seq=f.seq))
    return out


_R = TypeVar("_R")

#: ``points`` with its ``time`` column, which only the partitioned PostgreSQL store has.
TIMED_POINTS = table("points", column("metric_id"), column("frame_id"), column("time"),
                     column("data"))


def _unstored(session: Session, run_id: int, rows: dict[tuple[int, int], _R],
              bounds: tuple[float, float] | None = None) -> dict[tuple[int, int], _R]:
    """``rows`` (keyed by rank and seq) without those stored already. With time in the
    dedup key, a frame sent again with another time (a client's retry re-stamped, a spool
    pushed again) or a history step sent again by a later frame (a job restarted from a
    checkpoint) would not conflict with its first row: the first values stored are kept,
    as on SQLite. Two collectors storing one seq from two different sends at the same
    instant may both keep it (a series then shows that step twice). ``bounds``: the run's
    least and greatest stored frame time (``runs.time_min``/``time_max``), which every
    stored frame of the run lies within: the lookup then reads the partitions of the run's
    days only, not one per day kept (50 ms a batch at 410 partitions against 6 ms at 50)."""
    by_rank: dict[int, list[int]] = defaultdict(list)
    for rank, seq in sorted(rows):
        by_rank[rank].append(seq)
    stored: set[tuple[int, int]] = set()
    for rank, seqs in by_rank.items():  # (run, rank, seq...): the dedup index's prefix
        for i in range(0, len(seqs), 5000):
            q = select(Frame.seq).where(Frame.run_id == run_id, Frame.rank == rank,
                                        Frame.seq.in_(seqs[i:i + 5000]))
            if bounds is not None:
                q = q.where(Frame.time >= bounds[0], Frame.time <= bounds[1])
            stored.update((rank, s) for s in session.scalars(q))
    return {k: r for k, r in rows.items() if k not in stored}


#: The metric whose last value (rank 0) the runs list and the inbox read from ``runs``.
LOSS = "loss"


def _last_frame_and_loss(top_id: int, loss: tuple[int, int, float] | None,
                         greatest: Any) -> dict[str, Any]:
    """The UPDATE's values that keep ``runs.last_frame_id`` (the newest frame id) and the
    run's last loss (0016: rank 0's loss at its newest (step, seq), NaN and inf as they
    are). Conditional in SQL, so that an older batch stored after a newer one (another
    collector, a spool pushed late) leaves the newer loss in place."""
    out: dict[str, Any] = {"last_frame_id": greatest(func.coalesce(Run.last_frame_id, 0),
                                                     top_id)}
    if loss is None:
        return out
    step, seq, value = loss
    newer = or_(Run.last_loss_step.is_(None), Run.last_loss_step < step,
                and_(Run.last_loss_step == step, Run.last_loss_seq < seq))
    finite = literal(math.isfinite(value), Boolean())
    for col, new in (("last_loss", value), ("last_loss_finite", finite),
                     ("last_loss_step", step), ("last_loss_seq", seq)):
        out[col] = case((newer, new), else_=getattr(Run, col))
    return out


def ingest_frames(
    session: Session, frames: Sequence[FrameIn], *, max_metrics_per_run: int | None = None,
    now: float | None = None,
) -> IngestResult:
    """Store ``frames``; frames already stored (same run, rank and seq) are counted, skipped.

    A per-head matrix may be a list of lists or a 2-D ``numpy`` array (the fast parser's).
    A batch that would give a run more than ``max_metrics_per_run`` metric names raises
    :class:`BadRequest` (``too-many-metrics``); the caller's transaction then stores nothing.
    Each history step becomes a frame row of its own (module docstring); those that are
    new are in :attr:`IngestResult.new_frames` too, in (rank, step) order with the rest.
    Every run with a frame in the batch, new or resent, gets ``seen_at = now`` (the
    collector's clock, ``time.time()`` unless given): what the ``no_data`` rule reads.
    Each run keeps its newest frame id and rank 0's last loss (:func:`_last_frame_and_loss`,
    migration 0016): what the runs list and the alerts inbox read instead of its frames.
    """
    result = IngestResult()
    seen = _time.time() if now is None else now
    # PostgreSQL partitioned by time (server/db/partitions.py): the dedup key carries the
    # frame's time, and each value row its frame's time.
    by_time = is_partitioned(session.connection())
    dedup_key = ["run_id", "rank", "seq", *(["time"] if by_time else [])]
    by_run: dict[tuple[str, str], list[FrameIn]] = defaultdict(list)
    for f in frames:
        by_run[(f.project, f.run)].append(f)
    for (project, name), group in sorted(by_run.items()):
        run_id = _run_id(session, project, name)
        result.run_ids.add(run_id)
        unique: dict[tuple[int, int], FrameIn] = {}
        for f in group:
            unique.setdefault((f.rank, f.seq), f)
        result.duplicates += len(group) - len(unique)
        # The history of every frame, new or resent: a frame stored by a collector that did
        # not keep histories yet gets them now. The first frame of the batch to carry a step
        # wins, as the first one stored does across batches.
        history: dict[tuple[int, int], _Step] = {}
        for f in unique.values():
            for h in _history_steps(f):
                history.setdefault((h.rank, h.seq), h)
        shapes: dict[str, tuple[int, int]] = {}
        for f in unique.values():
            for k in f.scalars:
                _want(shapes, k, (0, 0))
            for k, m in f.heads.items():
                _want(shapes, k, _shape(m))
                shapes[k + ENVELOPE] = (0, 0)
        for h in history.values():
            for k in h.scalars:
                _want(shapes, k, (0, 0))
        metric_ids = _metric_ids(session, run_id, shapes, max_metrics_per_run)
        sent = unique
        if by_time:  # the time in the dedup key would let a resent frame in again
            bounds = run_bounds(session, run_id)  # None for a run with no frame yet
            sent = _unstored(session, run_id, unique, bounds)
            history = _unstored(session, run_id, history, bounds) if history else history
        rows: list[FrameIn | _Step] = [*sent.values(), *history.values()]
        rows.sort(key=lambda f: (f.rank, f.step, f.seq))
        inserted = session.execute(
            _insert(session, Frame)
            .on_conflict_do_nothing(index_elements=dedup_key)
            .returning(Frame.id, Frame.rank, Frame.seq),
            [{"run_id": run_id, "rank": f.rank, "seq": f.seq, "step": f.step, "time": f.time}
             for f in rows],
        ).all() if rows else []
        ids = {(r.rank, r.seq): r.id for r in inserted}
        fresh_rows = [f for f in rows if (f.rank, f.seq) in ids]
        fresh = [f for f in fresh_rows if isinstance(f, FrameIn)]
        result.duplicates += len(unique) - len(fresh)
        if not fresh_rows:  # all resent: the job is still heard from
            session.execute(update(Run).where(Run.id == run_id).values(seen_at=seen))
            continue
        points = []
        loss: tuple[int, int, float] | None = None  # rank 0's newest (step, seq, loss)
        for f in fresh_rows:
            fid = ids[(f.rank, f.seq)]
            n_before = len(points)
            scalars = dict(f.scalars)
            if scalars:
                values = _saturated(np.array(list(scalars.values()), dtype=np.float64))
                if values is not None:
                    scalars = dict(zip(scalars, values.tolist(), strict=True))
                if f.rank == 0 and LOSS in scalars and (loss is None
                                                        or (f.step, f.seq) > loss[:2]):
                    loss = (f.step, f.seq, float(np.float32(scalars[LOSS])))  # as stored
                blob = np.array(list(scalars.values()), dtype=_F32).tobytes()
                for i, k in enumerate(scalars):
                    points.append({"metric_id": metric_ids[k], "frame_id": fid,
                                   "data": blob[4 * i:4 * i + 4]})
            heads = {}
            for k, m in f.heads.items():
                big = _saturated(np.asarray(m, dtype=np.float64))
                heads[k] = m if big is None else big
                a = np.asarray(heads[k], dtype=_F32)
                points.append({"metric_id": metric_ids[k], "frame_id": fid,
                               "data": a.tobytes()})
                # The envelope (max over heads; NaN if any head is NaN), a scalar rollup
                # that the envelope series reads instead of every matrix.
                points.append({"metric_id": metric_ids[k + ENVELOPE], "frame_id": fid,
                               "data": np.max(a).astype(_F32).tobytes()})
            if by_time:
                for p in points[n_before:]:
                    p["time"] = f.time
            result.new_frames.append(
                NewFrame(run_id, f.rank, f.step, f.time, scalars,
                         {k: _as_lists(m) for k, m in heads.items()},
                         f.sent_seq if isinstance(f, _Step) else f.seq)
            )
        if points:
            # Matrices first, then the small rows: both databases fill pages in insertion
            # order, so ~1.5 KB rows pack densely (PostgreSQL: 5 per 8 KiB page, SQLite: 10
            # per 16 KiB) instead of leaving a matrix-sized hole at the end of each frame,
            # and a batch's scalars end up side by side.
            points.sort(key=lambda p: (len(p["data"]) <= 4, p["metric_id"], p["frame_id"]))
            session.execute(insert(TIMED_POINTS if by_time else Point), points)
        result.accepted += len(fresh)
        # The run's time bounds (the reads prune time partitions with them, pruning.py).
        lo, hi = min(f.time for f in fresh_rows), max(f.time for f in fresh_rows)
        pg = session.get_bind().dialect.name == "postgresql"
        least, greatest = (func.least, func.greatest) if pg else (func.min, func.max)
        bounds = {"time_min": least(func.coalesce(Run.time_min, lo), lo),
                  "time_max": greatest(func.coalesce(Run.time_max, hi), hi),
                  "seen_at": seen,  # the collector's clock, not the job's
                  **_last_frame_and_loss(max(ids.values()), loss, greatest)}
        if not fresh:
            session.execute(update(Run).where(Run.id == run_id).values(**bounds))
            continue
        last = max(fresh, key=lambda f: (f.step, f.time))
        moves = or_(Run.last_step.is_(None), Run.last_step <= last.step)
        session.execute(
            update(Run).where(Run.id == run_id)
            .values(last_step=case((moves, last.step), else_=Run.last_step),
                    last_time=case((moves, last.time), else_=Run.last_time), **bounds)
        )
    return result
