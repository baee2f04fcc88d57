"""Store work that must not grow with what is stored, nor shut writers out (the store audit):

* the ``no_data`` check reads and writes only the runs that need work: a pass over N runs
  already stopped with their open alert issues as many statements for N = 3 as for 40, and
  no UPDATE (on SQLite, no write lock every 30 s);
* retention's vacuum gives back every free page, not one per pass;
* ``drop_old_frames`` takes the collector's write lock (the one ingest requests queue in)
  for each chunk;
* deleting a run deletes its points once, by its metrics (not again by its frames, which
  probes every partition per frame on a partitioned PostgreSQL).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.db.models import Alert, Frame, Metric, Point, Run
from logitwatch.server.db.session import make_engine, migrate, session_scope, write_lock
from logitwatch.server.schemas import IngestIn
from logitwatch.server.store import retention
from logitwatch.server.store.ingest import ingest_frames
from logitwatch.server.store.retention import drop_old_frames, vacuum
from logitwatch.server.store.run_edits import delete_run

HOUR = 3600.0


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    """The SQL statements ``engine`` runs meanwhile."""
    seen: list[str] = []

    def note(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", note)


def _store(sessions: sessionmaker[Session], runs: list[str], frames: int = 3, *,
           start: int = 0, heads: bool = False, t0: float = 1000.0) -> None:
    """``frames`` frames (steps 10 i) of each of ``runs``, received when stamped."""
    body = [{"run": r, "rank": 0, "seq": i + 1, "step": 10 * i, "time": t0 + i,
             "scalars": {"loss": 2.0 + 0.01 * i, "lr": 1e-3},
             "heads": ({"attn.logit_max": [[5.0 + h + 0.1 * i for h in range(16)]
                                           for _ in range(24)],
                        "attn.entropy": [[1.0 + 0.01 * h for h in range(16)]
                                         for _ in range(24)]} if heads else {})}
            for r in runs for i in range(start, start + frames)]
    for k in range(0, len(body), 64):
        with session_scope(sessions) as s:
            ingest_frames(s, IngestIn.model_validate({"frames": body[k:k + 64]}).frames,
                          now=t0 + frames)


def _stale_pass(sessions: sessionmaker[Session], eng: AlertEngine,
                now: float) -> tuple[list[Alert], Counter[str]]:
    """One ``check_stale`` pass; what it fired, and its statements by verb."""
    with statements(sessions.kw["bind"]) as seen, session_scope(sessions) as s:
        fired = eng.check_stale(s, now=now)
    return fired, Counter(st.split()[0].upper() for st in seen)


def _stopped_runs(sessions: sessionmaker[Session], eng: AlertEngine, n: int,
                  prefix: str) -> None:
    """``n`` more runs that fell silent, were alerted and are stopped (crashed jobs)."""
    _store(sessions, [f"{prefix}{i}" for i in range(n)], frames=2)
    fired, _ = _stale_pass(sessions, eng, now=1002.0 + HOUR)
    assert len(fired) == n


def test_the_no_data_check_does_not_grow_with_the_stopped_runs(
        sessions: sessionmaker[Session]) -> None:
    """The audit's case: 3,000 stopped runs cost 3,002 SELECTs and 3,000 no-op UPDATEs
    (1.2 s of SQLite's write lock) every 30 s; now one SELECT per rule, and no write."""
    eng = AlertEngine()
    _stopped_runs(sessions, eng, 3, "a")
    _, few = _stale_pass(sessions, eng, now=1002.0 + 2 * HOUR)
    _stopped_runs(sessions, eng, 37, "b")
    _, many = _stale_pass(sessions, eng, now=1002.0 + 3 * HOUR)
    assert few == many, (few, many)
    assert "UPDATE" not in many and "INSERT" not in many
    assert sum(many.values()) <= 4, many
    with sessions() as s:  # nothing changed: still stopped, one open alert each
        assert set(s.scalars(select(Run.status))) == {"stopped"}
        assert s.scalar(select(func.count()).select_from(Alert)
                        .where(Alert.state == "firing")) == 40


def test_the_no_data_check_still_fires_and_repairs_among_stopped_runs(
        sessions: sessionmaker[Session]) -> None:
    """Among stopped runs: a newly silent run fires (once), a run alerted but stored
    ``running`` (before statuses were stored) is stopped without a second alert, and a
    stopped run whose alert was resolved by hand is not alerted again for that silence."""
    eng = AlertEngine()
    _stopped_runs(sessions, eng, 5, "a")
    _store(sessions, ["fresh"], frames=3, t0=1002.0 + HOUR)  # silent from now on
    with session_scope(sessions) as s:
        s.execute(update(Run).where(Run.name == "a0").values(status="running"))
        s.execute(update(Alert).where(Alert.run_id == select(Run.id).where(
            Run.name == "a1").scalar_subquery()).values(state="resolved"))
    fired, _ = _stale_pass(sessions, eng, now=1004.0 + 2 * HOUR)
    assert [a.message.split(":")[0] for a in fired] == ["fresh"]
    with sessions() as s:
        status = {r.name: r.status for r in s.execute(select(Run.name, Run.status))}
        assert set(status.values()) == {"stopped"}, status
        per_run = Counter(s.scalars(select(Run.name).join(Alert, Alert.run_id == Run.id)))
        assert per_run == Counter({f"a{i}": 1 for i in range(5)} | {"fresh": 1})
    fired, verbs = _stale_pass(sessions, eng, now=1004.0 + 3 * HOUR)
    assert fired == [] and "UPDATE" not in verbs  # a1 was alerted for this silence


# -- retention ---------------------------------------------------------------------------


@pytest.fixture
def sqlite_sessions(sqlite_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(sqlite_url)
    migrate(engine)
    yield sessionmaker(engine, expire_on_commit=False)
    engine.dispose()


def _pragma(sessions: sessionmaker[Session], name: str) -> int:
    with sessions() as s:
        return int(s.execute(text(f"PRAGMA {name}")).scalar_one())


def test_vacuum_gives_back_every_free_page(sqlite_sessions: sessionmaker[Session],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's sqlite3 stepped ``PRAGMA incremental_vacuum`` once: one page given back
    per pass (the audit: 5,585 free pages, 5,584 after). Now all, a chunk at a time."""
    monkeypatch.setattr(retention, "VACUUM_CHUNK", 16)  # several chunks
    assert _pragma(sqlite_sessions, "auto_vacuum") == 2  # INCREMENTAL, as make_engine sets
    _store(sqlite_sessions, ["r", "s"], frames=150, heads=True)
    pages = _pragma(sqlite_sessions, "page_count")
    drop_old_frames(sqlite_sessions.kw["bind"], older_than=0, now=2000.0)
    free = _pragma(sqlite_sessions, "freelist_count")
    assert free > 50, free
    with session_scope(sqlite_sessions) as s:
        assert vacuum(s) == free
    assert _pragma(sqlite_sessions, "freelist_count") == 0
    assert _pragma(sqlite_sessions, "page_count") <= pages - free


def test_the_retention_worker_gives_back_the_pages_its_drop_freed(
        sqlite_sessions: sessionmaker[Session]) -> None:
    """A pass that only drops old frames (no thinning) vacuums too: the worker vacuumed
    after thinning alone, and a store kept by ``retention_drop_days`` never shrank."""
    _store(sqlite_sessions, ["r", "s"], frames=150, heads=True)
    worker = retention.RetentionWorker(sqlite_sessions, older_than=None, bucket_steps=10,
                                       interval=3600.0, drop_older_than=60.0)
    worker.run_once()
    assert _pragma(sqlite_sessions, "freelist_count") == 0
    with sqlite_sessions() as s:
        assert s.scalar(select(func.count()).select_from(Frame)) == 0


class CountingLock:
    def __init__(self) -> None:
        self.taken = 0
        self.held = False

    def __enter__(self) -> CountingLock:
        assert not self.held
        self.taken += 1
        self.held = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.held = False


def test_vacuum_chunks_take_the_write_lock(sqlite_sessions: sessionmaker[Session],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "VACUUM_CHUNK", 16)
    _store(sqlite_sessions, ["r"], frames=150, heads=True)
    drop_old_frames(sqlite_sessions.kw["bind"], older_than=0, now=2000.0)
    free = _pragma(sqlite_sessions, "freelist_count")
    lock = CountingLock()
    with session_scope(sqlite_sessions) as s:
        vacuum(s, lock=lock)
    assert lock.taken == -(-free // 16) and not lock.held
    assert _pragma(sqlite_sessions, "freelist_count") == 0


def test_drop_old_frames_queues_in_the_collectors_write_lock(
        sqlite_sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its 2,000-frame chunks were committed back to back without the lock ingest requests
    queue in: a writer polling SQLite's lock missed the gaps (waited 2.56 s while 300k
    frames went). Each chunk takes the engine's write lock now."""
    monkeypatch.setattr(retention, "DROP_CHUNK", 10)
    engine = sqlite_sessions.kw["bind"]
    _store(sqlite_sessions, ["r", "s"], frames=25)
    counting = CountingLock()
    assert drop_old_frames(engine, older_than=0, now=1010.0,
                           lock=counting).frames_deleted == 20  # frames 0-9 of each
    assert counting.taken == 3  # two chunks, then the one that finds nothing left
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(
        drop_old_frames(engine, older_than=0, now=2000.0).frames_deleted))
    with write_lock(engine):  # an ingest request holds it
        worker.start()
        time.sleep(0.5)
        waited = worker.is_alive()
        with sqlite_sessions() as s:
            left = s.scalar(select(func.count()).select_from(Frame))
    worker.join(30)
    assert waited and left == 30, (waited, left)
    assert done == [30]


def test_the_collectors_write_lock_is_the_engines(app_client: Any) -> None:
    """The ingest route's lock (``app.state.write_lock``) is the one ``write_lock`` gives
    for the collector's engine, which retention takes by default."""
    state = app_client.app.state
    assert state.write_lock is write_lock(state.db)


# -- deleting a run ----------------------------------------------------------------------


def test_delete_run_deletes_its_points_once(sessions: sessionmaker[Session]) -> None:
    """Every point of a run's frames is one of its metrics' (ingest takes both from the
    run): a second DELETE by frame id found nothing, after probing every partition."""
    _store(sessions, ["gone", "kept"], frames=5, heads=True)
    with sessions() as s:
        gone, kept = (s.scalar(select(Run.id).where(Run.name == n)) for n in ("gone", "kept"))
        before = s.scalar(select(func.count()).select_from(Point))
    with statements(sessions.kw["bind"]) as seen, session_scope(sessions) as s:
        out = delete_run(s, gone)
    assert (out.frames, out.points) == (5, before // 2)
    deletes = [st for st in seen if st.lstrip().upper().startswith("DELETE FROM POINTS")]
    assert len(deletes) == 1, deletes
    with sessions() as s:
        assert s.get(Run, gone) is None
        assert s.scalar(select(func.count()).select_from(Point)) == before // 2
        assert s.scalar(select(func.count()).select_from(Point).join(
            Metric, Metric.id == Point.metric_id).where(Metric.run_id == kept)) == before // 2
        for table in (Frame, Metric, Alert):
            assert s.scalar(select(func.count()).select_from(table).where(
                table.run_id == gone)) == 0  # type: ignore[attr-defined]
