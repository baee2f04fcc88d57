"""Thinning (``store/retention.py``) remembers what its passes thinned (``ThinMarks``, the
worker's, in memory): a pass reads again only the buckets of frames that were not old at
the previous pass (or stored since), so a pass with nothing new to thin reads no matrix
(it read every old frame's, 1.6 s for 300k frames, every pass), and the store ends as full
passes leave it, late frames with an older time included. Each chunk of deletions takes
the engine's write lock, the one ingest requests queue in, as ``drop_old_frames`` does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.db.models import Frame, Metric, Point, Run
from logitwatch.server.db.session import make_engine, migrate, session_scope, write_lock
from logitwatch.server.schemas import IngestIn
from logitwatch.server.store import retention
from logitwatch.server.store.ingest import ingest_frames
from logitwatch.server.store.retention import RetentionResult, thin_old_frames
from tests.pg import pg_database

T0 = 100_000.0
BUCKET = 100  # steps: ten frames a bucket (a step every 10)


@contextmanager
def matrix_reads(engine: Engine) -> Iterator[list[str]]:
    """The statements ``engine`` runs meanwhile that read values (``points.data``)."""
    seen: list[str] = []

    def note(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "points.data" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", note)


def _frame(rank: int, seq: int, step: int, t: float, rng: np.random.Generator,
           peak: float | None = None) -> dict[str, Any]:
    logits = rng.uniform(0, 10, (2, 3))
    if peak is not None:
        logits[1, 2] = peak
    return {"run": "r", "rank": rank, "seq": seq, "step": step, "time": t,
            "scalars": {"loss": 2.0},
            "heads": {"attn.logit_max": logits.tolist(),
                      "attn.entropy": rng.uniform(1, 3, (2, 3)).tolist()}}


def _ingest(sessions: sessionmaker[Session], frames: list[dict[str, Any]]) -> None:
    with session_scope(sessions) as s:
        ingest_frames(s, IngestIn.model_validate({"frames": frames}).frames)


def _matrices(sessions: sessionmaker[Session]) -> list[tuple[int, int, str, bytes]]:
    """Every per-head matrix stored: (rank, step, metric, data)."""
    with sessions() as s:
        return sorted((r.rank, r.step, r.name, bytes(r.data)) for r in s.execute(
            select(Frame.rank, Frame.step, Metric.name, Point.data)
            .join(Point, Point.frame_id == Frame.id)
            .join(Metric, Metric.id == Point.metric_id).where(Metric.layers > 0)))


@pytest.fixture
def twin(db_url: str, tmp_path: Any) -> Iterator[tuple[sessionmaker[Session], ...]]:
    """Two new stores on ``db_url``'s backend: one thinned with marks, one without."""
    urls = [db_url]
    more = None
    if db_url.startswith("sqlite"):
        urls.append(f"sqlite:///{tmp_path / 'twin.db'}")
    else:
        more = pg_database()
        urls.append(next(more))
    engines = [make_engine(u) for u in urls]
    for e in engines:
        migrate(e)
    try:
        yield tuple(sessionmaker(e, expire_on_commit=False) for e in engines)
    finally:
        for e in engines:
            e.dispose()
        if more is not None:
            next(more, None)


def test_passes_with_marks_read_only_the_new_buckets_and_thin_as_full_passes(
        twin: tuple[sessionmaker[Session], sessionmaker[Session]]) -> None:
    """Two ranks, 60 frames each; passes as time goes on, the cutoff inside a bucket, and
    between them frames stored late, stamped long before (a new peak of an old bucket, a
    non-finite matrix in another). The store thinned with marks ends each pass as the one
    thinned by full passes; a pass with nothing new reads no matrix, and one that finds
    new frames reads their buckets only."""
    marked, full = twin
    marks = retention.ThinMarks()
    frames = [_frame(r, seq, 10 * seq, T0 + seq, np.random.default_rng(seq + 100 * r))
              for r in (0, 1) for seq in range(60)]

    def both(fn: Any) -> None:
        for sessions in twin:
            fn(sessions)

    def thin(now: float) -> tuple[RetentionResult, int]:
        """A pass on each store at ``now`` (everything before it is old); what the marked
        one did, and how many reads of matrices it made."""
        with session_scope(full) as s:
            thin_old_frames(s, older_than=0, bucket_steps=BUCKET, now=now)
        with matrix_reads(marked.kw["bind"]) as reads, session_scope(marked) as s:
            out = thin_old_frames(s, older_than=0, bucket_steps=BUCKET, now=now, marks=marks)
        assert _matrices(marked) == _matrices(full)
        return out, len(reads)

    both(lambda s: _ingest(s, frames))
    first, reads = thin(T0 + 24.5)  # seqs 0-24 old: buckets 0 and 1, and half of 2
    assert (first.matrices_kept, first.matrices_deleted) == (2 * 2 * 3, 2 * 2 * (9 + 9 + 4))
    assert reads == 2  # the first pass reads every old frame, metric by metric
    again, reads = thin(T0 + 24.5)
    assert (reads, again.matrices_kept, again.matrices_deleted) == (0, 0, 0)
    rng = np.random.default_rng(7)
    late = [_frame(0, 100, 45, T0 + 3, rng, peak=1e6),  # bucket 0's new peak
            _frame(1, 101, 205, T0 - 5000, rng, peak=float("nan"))]  # bucket 2's
    both(lambda s: _ingest(s, late))
    second, reads = thin(T0 + 44.5)  # seqs 25-44 old now, and the late frames
    # read again: bucket 0 of rank 0 (the late frame), 2 to 4 of each rank (the cutoff
    # moved over them; rank 1's bucket 2 holds a late frame too), in one read a range
    assert reads == 2 * 3
    assert second.matrices_kept == 2 * (1 + 3 + 3)
    # each metric: rank 0's buckets 0, 2, 3, 4 drop 1 (the first pass's peak), 5, 9, 4;
    # rank 1's 2 (with the late frame), 3, 4 drop 6, 9, 4
    assert second.matrices_deleted == 2 * ((1 + 5 + 9 + 4) + (6 + 9 + 4))
    with marked() as s:
        kept = s.scalars(select(Frame.step).join(Point, Point.frame_id == Frame.id).join(
            Metric, Metric.id == Point.metric_id).where(
            Metric.name == "attn.logit_max", Frame.rank == 0, Frame.step < BUCKET)).all()
    assert kept == [45]  # the late peak, not the first pass's
    third, reads = thin(T0 + 44.5)
    assert (reads, third.matrices_deleted) == (0, 0)
    last, reads = thin(T0 + 1000)  # every frame old
    assert last.matrices_deleted > 0 and reads == 2 * 2
    assert len(_matrices(marked)) == 2 * 2 * 6  # one a bucket of each rank and metric
    restarted = retention.ThinMarks()  # a restarted collector: one pass reads all again
    with matrix_reads(marked.kw["bind"]) as reads_all, session_scope(marked) as s:
        thin_old_frames(s, older_than=0, bucket_steps=BUCKET, now=T0 + 1000, marks=restarted)
    with matrix_reads(marked.kw["bind"]) as reads_none, session_scope(marked) as s:
        thin_old_frames(s, older_than=0, bucket_steps=BUCKET, now=T0 + 1000, marks=restarted)
    assert (len(reads_all), len(reads_none)) == (2, 0)


def test_the_workers_second_pass_reads_no_matrix(sessions: sessionmaker[Session]) -> None:
    """The retention worker keeps its marks between passes: its second pass, with nothing
    new to thin, reads no matrix (it read every old frame's again); a run stored since is
    read, once."""
    rng = np.random.default_rng(0)
    _ingest(sessions, [_frame(0, i, 10 * i, T0 + i, rng) for i in range(30)])
    worker = retention.RetentionWorker(sessions, older_than=60.0, bucket_steps=BUCKET,
                                       interval=3600.0)
    with matrix_reads(sessions.kw["bind"]) as first:
        assert worker.run_once().matrices_deleted == 2 * 27
    with matrix_reads(sessions.kw["bind"]) as second:
        assert worker.run_once().matrices_deleted == 0
    assert (len(first), len(second)) == (2, 0)
    _ingest(sessions, [{**_frame(0, i, 10 * i, T0 + i, rng), "run": "s"} for i in range(30)])
    with matrix_reads(sessions.kw["bind"]) as third:
        assert worker.run_once().matrices_deleted == 2 * 27
    assert len(third) == 2  # the new run's two metrics; not the first run again
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Run)) == 2


class SpyLock:
    """The engine's write lock, counted: how often it was taken; ``asked`` is set when
    someone asks for it (before it is had)."""

    def __init__(self, real: AbstractContextManager[Any], asked: threading.Event) -> None:
        self.real, self.taken, self.asked = real, 0, asked

    def __enter__(self) -> SpyLock:
        self.asked.set()
        self.real.__enter__()
        self.taken += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.real.__exit__(*exc)


def test_thinning_queues_in_the_collectors_write_lock_per_chunk(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each chunk of deletions takes the engine's write lock (the one ingest requests
    queue in): while an ingest holds it, the pass waits in the queue and deletes nothing;
    then it goes on, a chunk a turn. Its chunks were committed back to back outside the
    queue, where an ingest polling SQLite's lock could miss every gap."""
    engine = make_engine(sqlite_url)
    migrate(engine)
    sessions = sessionmaker(engine, expire_on_commit=False)
    try:
        rng = np.random.default_rng(1)
        _ingest(sessions, [_frame(0, i, 10 * i, T0 + i, rng) for i in range(30)])
        monkeypatch.setattr(retention, "THIN_CHUNK", 4)
        spies: list[SpyLock] = []
        asked = threading.Event()

        def spied(e: Engine) -> AbstractContextManager[Any]:
            spies.append(SpyLock(write_lock(e), asked))
            return spies[-1]

        monkeypatch.setattr(retention, "write_lock", spied)
        done: list[int] = []

        def run() -> None:
            with session_scope(sessions) as s:
                done.append(thin_old_frames(s, older_than=0, bucket_steps=BUCKET,
                                            now=T0 + 100).matrices_deleted)

        before = len(_matrices(sessions))
        worker = threading.Thread(target=run)
        with write_lock(engine):  # an ingest request holds it
            worker.start()
            while worker.is_alive() and not asked.wait(0.05):
                pass  # until the pass asks for the lock, or ends without it
            queued = asked.is_set()
            left = len(_matrices(sessions))
        worker.join(60)
        assert queued and left == before, (queued, left, before)
        assert done == [2 * 27]
        assert spies[0].taken == 2 * -(-27 // 4)  # each metric's 27 deletions, 4 a chunk
    finally:
        engine.dispose()
