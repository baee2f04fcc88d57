"""The store's write lock on SQLite (:class:`FifoLock`): taken in arrival order, and a thread
that holds it and asks again is told so at once instead of waiting for itself for ever (the
no-data check without ``runs`` called inside an ingest's transaction did)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy.orm import sessionmaker
from test_no_data_lock import HOUR, T0, _frames

from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.db.session import FifoLock, make_engine, migrate, session_scope, write_lock
from logitwatch.server.store.ingest import ingest_frames


def test_the_holder_asking_again_gets_an_error_not_a_hang() -> None:
    lock = FifoLock()
    said: list[str] = []

    def again() -> None:  # in a thread of its own: a lock that hangs fails the test
        with lock:
            try:
                with lock:
                    said.append("taken twice")
            except RuntimeError as e:
                said.append(str(e))

    t = threading.Thread(target=again, daemon=True)
    t.start()
    t.join(10)
    assert said and "already holds the store's write lock" in said[0], said
    with lock:  # still usable, in order, after the refusal
        pass


def test_other_threads_still_wait_their_turn_in_order() -> None:
    lock = FifoLock()
    order: list[int] = []
    with lock:
        threads = []
        for i in range(4):
            def take(i: int = i) -> None:
                with lock:
                    order.append(i)
            t = threading.Thread(target=take)
            t.start()
            threads.append(t)
            # each in the queue (its ticket drawn) before the next starts: the order is
            # the one they asked in, whatever the machine's load
            deadline = time.monotonic() + 30
            while lock._next < i + 2 and time.monotonic() < deadline:
                time.sleep(0.001)
        assert order == []  # nobody got in while it was held
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3]


def test_a_no_data_check_inside_an_ingests_transaction_is_refused_not_deadlocked(
        tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'lw.db'}")
    migrate(engine)
    sessions = sessionmaker(engine, expire_on_commit=False)
    alerts = AlertEngine()
    with session_scope(sessions) as s:
        ingest_frames(s, _frames("quiet", 3), now=T0 + 3)  # silent from then on
    done: list[BaseException | None] = []

    def ingest_then_check() -> None:
        try:
            with write_lock(engine), session_scope(sessions) as s:
                # without runs=, the check takes the lock itself: wrong inside an ingest
                alerts.check_stale(s, now=T0 + 2 * HOUR)
            done.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            done.append(e)

    t = threading.Thread(target=ingest_then_check, daemon=True)
    t.start()
    t.join(30)
    assert done, "the check waited for the lock its own thread held"
    assert isinstance(done[0], RuntimeError), done[0]
    with write_lock(engine):  # and the lock was handed back
        pass
    engine.dispose()
