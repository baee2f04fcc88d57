"""The no-data checker's writes on SQLite queue in the engine's write lock, the one ingest
requests take (``server/alerts/no_data.py``): they went straight to SQLite's own lock and
waited in its busy handler, so while an ingest held it (a steady stream of them hands it on
from one to the next) the check failed ``database is locked`` after the busy timeout, and
the silent runs went unalerted that pass. Real SQLite, real threads: an ingest holds the
lock with its transaction open while the check runs, as the checker thread calls it."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import sessionmaker

from logitwatch.server.alerts import no_data
from logitwatch.server.alerts.engine import AlertEngine
from logitwatch.server.db import session as db_session
from logitwatch.server.db.models import Alert, Run
from logitwatch.server.db.session import make_engine, migrate, session_scope, write_lock
from logitwatch.server.schemas import IngestIn
from logitwatch.server.store.ingest import ingest_frames

HOUR = 3600.0
T0 = 1000.0


def _frames(run: str, n: int, start: int = 0) -> list[Any]:
    body = [{"run": run, "rank": 0, "seq": i + 1, "step": 10 * i, "time": T0 + i,
             "scalars": {"loss": 2.0}} for i in range(start, start + n)]
    return IngestIn.model_validate({"frames": body}).frames


class AskedLock:
    """The engine's write lock; ``asked`` is set when someone asks for it (before it is
    had)."""

    def __init__(self, real: AbstractContextManager[Any], asked: threading.Event) -> None:
        self.real, self.asked = real, asked

    def __enter__(self) -> AskedLock:
        self.asked.set()
        self.real.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.real.__exit__(*exc)


def test_the_no_data_check_waits_its_turn_behind_an_ingest(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ingest holds the collector's write lock and SQLite's (its transaction open) when
    the check finds a silent run: the check waits in the lock's queue, and fires once the
    ingest has committed. It failed ``database is locked`` (the busy timeout is cut to
    0.3 s here, 30 s in the collector, to fail fast)."""
    monkeypatch.setattr(db_session, "SQLITE_BUSY_TIMEOUT", 0.3)
    engine = make_engine(sqlite_url)
    migrate(engine)
    sessions = sessionmaker(engine, expire_on_commit=False)
    asked = threading.Event()

    def asked_lock(e: Engine) -> AbstractContextManager[Any]:
        return AskedLock(write_lock(e), asked)

    # raising=False: a check that never asks for the lock leaves it unused
    monkeypatch.setattr(no_data, "write_lock", asked_lock, raising=False)
    try:
        with session_scope(sessions) as s:
            ingest_frames(s, _frames("quiet", 3), now=T0 + 3)  # silent from then on
        holding, release = threading.Event(), threading.Event()

        def ingest() -> None:  # as the ingest route: the lock, then its transaction
            with write_lock(engine), session_scope(sessions) as s:
                ingest_frames(s, _frames("busy", 3), now=T0 + 2 * HOUR)
                s.flush()
                holding.set()
                release.wait(60)

        fired: list[str] = []
        errors: list[BaseException] = []

        def check() -> None:  # as the checker thread (alerts/config.py) calls it
            try:
                with session_scope(sessions) as s:
                    fired.extend(a.message.split(":")[0]
                                 for a in AlertEngine().check_stale(s, T0 + 2 * HOUR))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        writer = threading.Thread(target=ingest)
        writer.start()
        assert holding.wait(30)
        checker = threading.Thread(target=check)
        checker.start()
        while checker.is_alive() and not asked.wait(0.05):
            pass  # until the check asks for the lock, or ends without it
        queued = asked.is_set() and checker.is_alive()
        with sessions() as s:  # nothing written meanwhile
            alerts_meanwhile = s.scalar(select(func.count()).select_from(Alert))
        release.set()
        writer.join(30)
        checker.join(30)
        assert errors == [] and queued, ([(e, e.__cause__) for e in errors], queued)
        assert alerts_meanwhile == 0 and fired == ["quiet"]
        with sessions() as s:
            status = {r.name: r.status for r in s.execute(select(Run.name, Run.status))}
        assert status == {"quiet": "stopped", "busy": "running"}
    finally:
        engine.dispose()
