"""Retention: thin the per-head matrices of old frames, keeping every spike.

A frame's per-head matrices are ~99.7 % of its values (4 x 24 x 16 against a handful of
scalars). After ``older_than`` seconds, :func:`thin_old_frames` keeps them for one frame per
``bucket_steps`` steps of each (run, rank, metric): the frame whose matrix holds the
bucket's largest value (smallest for entropy, which collapses toward 0; a non-finite value
counts as the worst), so a spike seen once is still there a year later. Scalars (loss, grad
norm, lr, ...) are never thinned, and frames themselves stay, so step counts and series stay
whole.

A pass is idempotent and safe to run from several collectors at once: it only deletes, and
the frame it keeps in a bucket is the same every time. The worker keeps :class:`ThinMarks`
between its passes (in memory): a pass reads again only the buckets of frames that were not
old at the previous one or were stored since, so a pass with nothing new to thin reads no
matrix (it read every old frame's: 1.2 s for 300k frames on SQLite, 1.6 s on PostgreSQL;
``bench/bench_retention.py``). Each chunk of its deletions, as of :func:`drop_old_frames`
and :func:`vacuum`, is a transaction under the engine's write lock.

After ``drop_older_than`` seconds (:func:`drop_old_frames`), frames go whole, with every
value: on PostgreSQL, where ``frames`` and ``points`` are partitioned by day
(``server/db/partitions.py``), a day's partitions are dropped once the whole day is older
than that (and the default partitions' older rows deleted); on SQLite the rows are deleted.
"""

from __future__ import annotations

import logging
import math
import threading
import time as _time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.db.models import Frame, Metric, Point, Run
from logitwatch.server.db.partitions import drop_partitions, is_partitioned
from logitwatch.server.db.session import session_scope, write_lock
from logitwatch.server.errors import ApiError
from logitwatch.server.store.pruning import Bounds, prune_join, run_bounds
from logitwatch.server.store.views import lower_is_worse

__all__ = ["DropResult", "RetentionResult", "RetentionWorker", "ThinMark", "ThinMarks",
           "drop_old_frames", "thin_old_frames", "vacuum"]

log = logging.getLogger("logitwatch.retention")


@dataclass(slots=True)
class RetentionResult:
    """What one pass did."""

    metrics: int = 0
    matrices_kept: int = 0
    matrices_deleted: int = 0
    values_deleted: int = 0


def _score(data: bytes, lowest: bool) -> float:
    """How much a matrix is its bucket's peak: its largest value, or for a metric whose
    lowest values are the worst (entropy) its smallest, negated; non-finite beats all."""
    a = np.frombuffer(data, dtype="<f4")
    if not np.isfinite(a).all():
        return float("inf")
    if not a.size:
        return float("-inf")
    return -float(a.min()) if lowest else float(a.max())


#: Matrices whose deletion is one transaction: writers (ingest) wait at most that long.
THIN_CHUNK = 2000
#: Step ranges a run's new buckets may make before its pass reads all its old frames
#: instead (one read per range and metric: a few late frames scattered over a run's steps).
MAX_RANGES = 64


@dataclass(slots=True, frozen=True)
class ThinMark:
    """What the passes so far thinned of one run: the buckets of ``bucket_steps`` steps of
    every frame older than ``cutoff`` and numbered (``frames.id``) up to ``upto``."""

    cutoff: float
    upto: int
    bucket_steps: int


class ThinMarks(dict[int, ThinMark]):
    """Where the thinning passes over one database got to, by run id: what the next pass
    need not read again (:func:`thin_old_frames`). Kept in memory by the process that runs
    the passes (the :class:`RetentionWorker`): a restarted collector reads every old frame
    once, on its first pass."""


#: A run's new buckets: by rank, the inclusive step ranges, whole buckets, in order.
Ranges = dict[int, list[tuple[int, int]]]


def _ranges(keys: set[tuple[int, int]], bucket_steps: int) -> Ranges:
    """The step ranges of the buckets ``keys`` (rank, step // bucket_steps), neighbours
    merged."""
    out: Ranges = {}
    for rank, b in sorted(keys):
        spans = out.setdefault(rank, [])
        if spans and spans[-1][1] == b * bucket_steps - 1:
            spans[-1] = (spans[-1][0], (b + 1) * bucket_steps - 1)
        else:
            spans.append((b * bucket_steps, (b + 1) * bucket_steps - 1))
    return out


def _new_buckets(session: Session, run_id: int, mark: ThinMark, *, cutoff: float,
                 bounds: tuple[float | None, float | None]) -> set[tuple[int, int]]:
    """The buckets (rank, step // bucket_steps) of ``run_id`` holding a frame older than
    ``cutoff`` that the passes of ``mark`` did not see old: numbered after ``mark.upto``
    (stored since; or late, with an older time), or stamped from ``mark.cutoff`` on (it was
    not old yet). ``bounds``: the run's least and greatest frame time (``runs.time_min`` /
    ``time_max``, which ingest widens with every frame it stores), read after the pass's
    ``upto``: they tell without reading frames that no frame was stamped between the two
    cutoffs (a run that ended before the previous one, or started after this one), and
    bound both reads (PostgreSQL plans the partitions of the run's days only; a frame
    stored since, outside them, is numbered after this pass's ``upto``: new to the next
    pass). Both reads are of frame rows by the run's index: no matrix is read."""
    bs = mark.bucket_steps
    lo, hi = bounds
    within = [] if lo is None or hi is None else [Frame.time >= lo, Frame.time <= hi]
    keys = {(rank, step // bs) for rank, step in session.execute(
        select(Frame.rank, Frame.step).where(Frame.run_id == run_id, Frame.id > mark.upto,
                                             Frame.time < cutoff, *within))}
    if cutoff > mark.cutoff and (lo is None or hi is None or (hi >= mark.cutoff
                                                              and lo < cutoff)):
        keys.update((rank, step // bs) for rank, step in session.execute(
            select(Frame.rank, Frame.step).where(
                Frame.run_id == run_id, Frame.time >= mark.cutoff, Frame.time < cutoff)))
    return keys


def _thin_metric(session: Session, m: Any, *, cutoff: float, bucket_steps: int,
                 ranges: Ranges | None, bounds: Bounds | None,
                 lock: AbstractContextManager[Any], out: RetentionResult,
                 progress: Callable[[str], None] | None) -> None:
    """Thin metric ``m``'s matrices of frames older than ``cutoff``: in the step ranges of
    ``ranges`` (whole buckets), or every one (None). ``bounds``: the run's time bounds on
    a partitioned PostgreSQL (``pruning.run_bounds``), which the read carries. Each chunk
    of deletions is a transaction under ``lock``."""
    lowest = lower_is_worse(m.name)
    drop: list[int] = []
    kept = 0
    bucket: tuple[int, int] | None = None
    best, best_fid, members = -math.inf, -1, []  # the open bucket
    base = prune_join(select(Frame.id, Frame.rank, Frame.step, Point.data)
                      .join(Point, (Point.frame_id == Frame.id) & (Point.metric_id == m.id))
                      .where(Frame.run_id == m.run_id, Frame.time < cutoff)
                      .order_by(Frame.rank, Frame.step, Frame.id), bounds)
    reads = [base] if ranges is None else [
        base.where(Frame.rank == rank, Frame.step >= lo, Frame.step <= hi)
        for rank, spans in sorted(ranges.items()) for lo, hi in spans]
    for q in reads:  # in (rank, step) order, the ranges being whole buckets, in order
        rows = session.execute(q.execution_options(yield_per=1000))
        for fid, rank, step, data in rows:
            key = (rank, step // bucket_steps)
            if key != bucket:
                if bucket is not None:
                    drop += [f for f in members if f != best_fid]
                    kept += 1
                bucket, best, best_fid, members = key, -math.inf, -1, []
            members.append(fid)
            score = _score(data, lowest)
            if best_fid < 0 or score > best:
                best, best_fid = score, fid
        rows.close()
    if bucket is None:
        return
    drop += [f for f in members if f != best_fid]
    kept += 1
    out.metrics += 1
    for i in range(0, len(drop), THIN_CHUNK):
        with lock:  # a transaction of its own, in turn with the ingest requests
            for j in range(i, min(i + THIN_CHUNK, len(drop)), 500):
                session.execute(delete(Point).where(
                    Point.metric_id == m.id,
                    Point.frame_id.in_(drop[j:min(j + 500, i + THIN_CHUNK)])))
            session.commit()
    out.matrices_kept += kept
    out.matrices_deleted += len(drop)
    out.values_deleted += len(drop) * m.layers * m.heads
    if progress is not None and drop:
        progress(f"run {m.run_id} {m.name}: kept {kept} matrices, deleted {len(drop)}")


def thin_old_frames(
    session: Session,
    *,
    older_than: float,
    bucket_steps: int,
    now: float | None = None,
    run_id: int | None = None,
    progress: Callable[[str], None] | None = None,
    marks: ThinMarks | None = None,
    lock: AbstractContextManager[Any] | None = None,
) -> RetentionResult:
    """Delete the per-head matrices of frames older than ``older_than`` seconds, except one
    per ``bucket_steps`` steps of each (run, rank, metric): the bucket's peak (its minimum
    for entropy, which collapses toward 0).

    Matrices are read as a stream, holding one bucket's scores and the ids to delete, never
    a metric's matrices at once; the deletions are committed every :data:`THIN_CHUNK`
    matrices, each chunk a transaction under ``lock``, by default the engine's
    :func:`~logitwatch.server.db.session.write_lock` (as :func:`drop_old_frames`): on
    SQLite a pass never holds the write lock for longer than one chunk, and an ingest
    waiting in that queue gets its turn between two chunks (a pass is idempotent: one cut
    short leaves the store consistent).

    ``marks`` (the worker's, kept between its passes): a run thinned by an earlier pass
    with these ``bucket_steps`` has only the buckets of its frames that were not old then
    read again (:func:`_new_buckets`: frame rows by the run's index, then those buckets'
    matrices), not every old frame: a pass with nothing new to thin reads no matrix. The
    marks are kept up to date here, a run's once its deletions are committed. A frame
    numbered at or below a mark but stored after it (on PostgreSQL, an ingest in flight
    while the pass began; on SQLite, a row id given again after the newest frames were
    deleted) and stamped older than the cutoff is left whole until the marks are lost:
    thinning keeps too much then, never too little. Without ``marks`` every old frame is
    read, and ``matrices_kept`` counts every bucket; with them, the buckets read."""
    if bucket_steps < 1:
        raise ValueError("bucket_steps must be >= 1")
    cutoff = (_time.time() if now is None else now) - older_than
    if lock is None:
        bind = session.get_bind()
        lock = write_lock(bind if isinstance(bind, Engine) else bind.engine)
    out = RetentionResult()
    # before any frame is read: a frame numbered after it is new to the next pass
    upto = int(session.scalar(select(func.max(Frame.id))) or 0)
    q = select(Metric.id, Metric.run_id, Metric.name, Metric.layers, Metric.heads).where(
        Metric.layers > 0).order_by(Metric.run_id, Metric.id)
    if run_id is not None:
        q = q.where(Metric.run_id == run_id)
    by_run: dict[int, list[Any]] = {}
    for m in session.execute(q).all():
        by_run.setdefault(m.run_id, []).append(m)
    bounds = {r.id: (r.time_min, r.time_max) for r in session.execute(
        select(Run.id, Run.time_min, Run.time_max))} if marks is not None else {}
    if marks is not None and run_id is None:  # runs deleted since: forgotten
        for gone in set(marks) - set(by_run):
            del marks[gone]
    for rid, metrics in by_run.items():
        mark = marks.get(rid) if marks is not None else None
        ranges: Ranges | None = None
        lo, hi = bounds.get(rid, (None, None))
        if marks is not None and mark is None and lo is not None and lo >= cutoff:
            marks[rid] = ThinMark(cutoff, upto, bucket_steps)  # no frame old yet
            continue
        if mark is not None and mark.bucket_steps == bucket_steps:
            keys = _new_buckets(session, rid, mark, cutoff=cutoff, bounds=(lo, hi))
            ranges = _ranges(keys, bucket_steps)
            if sum(len(v) for v in ranges.values()) > MAX_RANGES:
                ranges = None
        if ranges is None or ranges:
            pruned = run_bounds(session, rid)  # None off a partitioned PostgreSQL
            for m in metrics:
                _thin_metric(session, m, cutoff=cutoff, bucket_steps=bucket_steps,
                             ranges=ranges, bounds=pruned, lock=lock, out=out,
                             progress=progress)
        if marks is not None:
            marks[rid] = ThinMark(cutoff, upto, bucket_steps)
    return out


@dataclass(slots=True)
class DropResult:
    """What :func:`drop_old_frames` did: partitions dropped (PostgreSQL), rows deleted
    (SQLite; on PostgreSQL the default partition's)."""

    partitions: list[str]
    frames_deleted: int = 0


#: Frames deleted per statement on the row-wise path.
DROP_CHUNK = 2000


def drop_old_frames(engine: Engine, *, older_than: float, now: float | None = None,
                    lock: AbstractContextManager[Any] | None = None) -> DropResult:
    """Delete frames older than ``older_than`` seconds with all their values: whole day
    partitions on a partitioned PostgreSQL, rows elsewhere (in chunks, each a transaction
    of its own, so that writers are never held up for long). Each chunk takes ``lock``
    first, by default the engine's :func:`~logitwatch.server.db.session.write_lock`, the
    one ingest requests take: on SQLite, a writer waiting in that queue gets its turn
    between two chunks, where one polling SQLite's lock could miss every gap."""
    cutoff = (_time.time() if now is None else now) - older_than
    if is_partitioned(engine):
        got = drop_partitions(engine, cutoff=cutoff)
        return DropResult(got.partitions, got.default_frames)
    lock = write_lock(engine) if lock is None else lock
    out = DropResult([])
    sessions = sessionmaker(engine)
    while True:
        with lock, session_scope(sessions) as s:
            rows = s.execute(select(Frame.id, Frame.run_id).where(Frame.time < cutoff)
                             .limit(DROP_CHUNK)).all()
            if not rows:
                return out
            ids = [r.id for r in rows]
            # Points are keyed (metric, frame): the chunk's runs' metrics, one lookup each.
            metric_ids = s.scalars(select(Metric.id).where(
                Metric.run_id.in_({r.run_id for r in rows}))).all()
            for mid in metric_ids:
                s.execute(delete(Point).where(Point.metric_id == mid,
                                              Point.frame_id.in_(ids)))
            s.execute(delete(Frame).where(Frame.id.in_(ids)))
            out.frames_deleted += len(ids)


#: Pages an incremental vacuum step gives back per transaction (16 KiB pages: 16 MiB, tens
#: of milliseconds of the write lock).
VACUUM_CHUNK = 1024


def vacuum(session: Session, *, lock: AbstractContextManager[Any] | None = None) -> int:
    """Give freed pages back to the file system (SQLite: incremental vacuum; PostgreSQL's
    autovacuum does this itself); returns the pages given back.

    ``PRAGMA incremental_vacuum`` frees one page per step of its statement, and
    ``execute`` of Python's sqlite3 steps a statement without result columns once (one
    page a pass; ``fetchall`` does not step it further): ``executescript`` steps it to the
    end, here :data:`VACUUM_CHUNK` pages per transaction, each under ``lock``, by default
    the engine's :func:`~logitwatch.server.db.session.write_lock` (as
    :func:`drop_old_frames`), until the free list is empty."""
    bind = session.get_bind()
    if bind.dialect.name != "sqlite":
        return 0
    ctx = write_lock(bind) if lock is None else lock  # type: ignore[arg-type]
    session.commit()  # the caller's writes first: nothing of theirs in the chunks below
    raw = session.connection().connection.driver_connection
    cur = raw.cursor()
    try:
        if cur.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:  # not INCREMENTAL
            return 0
        freed = 0
        left = cur.execute("PRAGMA freelist_count").fetchone()[0]
        while left > 0:
            with ctx:  # a transaction of its own (executescript commits first)
                raw.executescript(f"PRAGMA incremental_vacuum({int(VACUUM_CHUNK)})")
            now_left = cur.execute("PRAGMA freelist_count").fetchone()[0]
            if now_left >= left:  # gave nothing back: do not spin
                break
            freed += left - now_left
            left = now_left
        return freed
    finally:
        cur.close()


class RetentionWorker:
    """Runs :func:`thin_old_frames` (with ``older_than``) and :func:`drop_old_frames` (with
    ``drop_older_than``) every ``interval`` seconds in a daemon thread."""

    def __init__(self, sessions: sessionmaker[Session], *, older_than: float | None,
                 bucket_steps: int, interval: float,
                 drop_older_than: float | None = None) -> None:
        self.sessions = sessions
        self.older_than, self.bucket_steps, self.interval = older_than, bucket_steps, interval
        self.drop_older_than = drop_older_than
        #: where the thinning passes got to (in memory: a restart reads all old frames once)
        self.marks = ThinMarks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="logitwatch-retention",
                                        daemon=True)

    def start(self) -> RetentionWorker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def run_once(self) -> RetentionResult:
        frames_deleted = 0
        if self.drop_older_than is not None:
            dropped = drop_old_frames(self.sessions.kw["bind"],
                                      older_than=self.drop_older_than)
            frames_deleted = dropped.frames_deleted
            if dropped.partitions or dropped.frames_deleted:
                log.info("retention: dropped partitions %s, deleted %d old frames",
                         ", ".join(dropped.partitions) or "none", dropped.frames_deleted)
        result = RetentionResult()
        if self.older_than is not None:
            with session_scope(self.sessions) as s:
                result = thin_old_frames(s, older_than=self.older_than,
                                         bucket_steps=self.bucket_steps, marks=self.marks)
        if result.matrices_deleted or frames_deleted:
            with session_scope(self.sessions) as s:
                vacuum(s)  # the pages the deletes freed, under the collector's write lock
        if result.matrices_deleted:
            log.info("retention: deleted %d old matrices (%d values), kept %d peaks",
                     result.matrices_deleted, result.values_deleted, result.matrices_kept)
        return result

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_once()
            except ApiError as e:  # database unavailable: try again next time
                log.warning("retention pass skipped: %s", e.message)
            except Exception:  # never let the thread die silently
                log.exception("retention pass failed")
