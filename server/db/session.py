"""Engine construction, schema migration at start, and the one transaction scope."""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from importlib.resources import files
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.errors import Conflict, ServiceUnavailable

__all__ = [
    "RETRY_AFTER",
    "SQLITE_BUSY_TIMEOUT",
    "SQLITE_PAGE_SIZE",
    "SchemaTooNew",
    "alembic_config",
    "make_engine",
    "migrate",
    "schema_revision",
    "session_scope",
]

log = logging.getLogger("logitwatch.server")


#: SQLite page size of new databases: a 24 x 16 float32 matrix (1,536 bytes) fits ten to a
#: 16 KiB page, where a 4 KiB page wastes a quarter of itself (two such rows per page).
SQLITE_PAGE_SIZE = 16384
#: Seconds a SQLite write waits for another transaction's lock before 503: longer than the
#: longest ingest transaction (one writer at a time; a 256-frame batch with its alerts).
SQLITE_BUSY_TIMEOUT = 30.0


def make_engine(
    url: str, *, pool_size: int = 5, max_overflow: int = 5, pool_timeout: float = 5.0
) -> Engine:
    """Build an engine with a pool sized on purpose (see ``Settings.pool_size``).

    Both backends get a ``QueuePool`` of ``pool_size`` connections plus ``max_overflow``
    under bursts; a request that waits longer than ``pool_timeout`` for one fails fast
    (answered 503 with Retry-After by :func:`session_scope`) instead of hanging.

    SQLite gets WAL, ``synchronous=NORMAL``, foreign keys, a busy timeout of
    :data:`SQLITE_BUSY_TIMEOUT`, and, on a new file, 16 KiB pages and incremental
    auto-vacuum (so that deleting a run gives the space back); its parent folder is
    created. PostgreSQL connections are pre-pinged, so a restarted server costs one retry,
    not errors.
    """
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        memory = not u.database or u.database == ":memory:"
        if not memory:
            Path(str(u.database)).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT},
            **({} if memory else {"pool_size": pool_size, "max_overflow": max_overflow,
                                  "pool_timeout": pool_timeout}),
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _: Any) -> None:
            cur = dbapi_conn.cursor()
            # Both only take effect on a new, empty file (before WAL is switched on), and
            # only there are they set: setting auto_vacuum on a file in use waits for
            # SQLite's write lock, so a connection the pool opened while a writer held it (a
            # long ingest batch, a retention chunk) waited for that writer before its first
            # read (WAL readers otherwise never wait for a writer)
            if cur.execute("PRAGMA page_count").fetchone()[0] == 0:
                cur.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
                cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "checkin")
        def _foreign_keys(dbapi_conn: Any, record: Any) -> None:
            # a migration turned them off on this connection (migrations/env.py) and could
            # not turn them on inside the caller's transaction: on again, now it is over
            if record.info.pop("foreign_keys_off", False):
                dbapi_conn.execute("PRAGMA foreign_keys=ON")

        return engine
    return create_engine(
        url, pool_size=pool_size, max_overflow=max_overflow, pool_timeout=pool_timeout,
        pool_pre_ping=True,
    )


def alembic_config() -> Config:
    """An Alembic config pointing at the packaged ``logitwatch.migrations`` scripts."""
    cfg = Config()
    cfg.set_main_option("script_location", str(files("logitwatch.migrations")))
    return cfg


def schema_revision(engine: Engine) -> str | None:
    """The revision the database is at (``None`` when empty)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


#: PostgreSQL advisory lock key held while migrating, so collectors that start together
#: migrate one after the other (the second finds the schema at head).
MIGRATION_LOCK = 0x6C77_6D69  # "lwmi"


class SchemaTooNew(RuntimeError):
    """The database is at a schema revision this logitwatch does not know: a newer
    logitwatch wrote it (``revision``: the database's). Nothing was changed."""

    def __init__(self, revision: str, head: str | None) -> None:
        self.revision, self.head = revision, head
        super().__init__(
            f"the database is at schema revision {revision!r}, which this logitwatch does "
            f"not know (it was written by a newer version; this one knows up to {head!r}). "
            "Nothing was changed. Upgrade logitwatch to the version that wrote it (or a "
            "later one), or use another store (--db, LOGITWATCH_DB_URL)."
        )


#: Called by :func:`migrate` just before it upgrades a database that has a schema, with
#: the revision it is at and the one it goes to.
OnUpgrade = Callable[[str, str], None]


def migrate(engine: Engine, *, on_upgrade: OnUpgrade | None = None) -> None:
    """Bring the schema to head (``alembic upgrade head``); refuse a database from the future
    (:class:`SchemaTooNew`, before anything is changed).

    On PostgreSQL the check and the upgrade run under an advisory lock: several collectors
    starting at once against one database migrate it once. ``on_upgrade(current, head)``
    is called just before a database that already has a schema is upgraded (not for a new,
    empty one, nor by a collector that finds another already did it): the command line
    says so, since an older logitwatch refuses the store afterwards.
    """
    cfg = alembic_config()
    script = ScriptDirectory.from_config(cfg)
    head = script.get_current_head()
    if schema_revision(engine) == head:
        return
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
        current = MigrationContext.configure(conn).get_current_revision()
        if current == head:
            return
        known = {s.revision for s in script.walk_revisions()}
        if current is not None and current not in known:
            raise SchemaTooNew(current, head)
        log.info("migrating database schema %s -> %s", current, head)
        if current is not None and head is not None and on_upgrade is not None:
            on_upgrade(current, head)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """Commit on success, roll back on error, and map DB failures to domain errors."""
    session = factory()
    try:
        yield session
        session.commit()
    except IntegrityError as e:
        session.rollback()
        raise Conflict("conflict", f"the write conflicts with stored data: {e.orig}") from e
    except PoolTimeout as e:
        session.rollback()
        raise _unavailable(
            "db-busy", "every database connection of this collector is in use (pool_size, "
            "pool_max_overflow); nothing was stored, retry after Retry-After seconds"
        ) from e
    except (OperationalError, InterfaceError) as e:
        _rollback_quietly(session)
        _log_unavailable(e)
        raise _unavailable(
            "db-unavailable", "the database is unavailable or busy; nothing was stored, retry "
            "after Retry-After seconds"
        ) from e
    except DBAPIError as e:
        _rollback_quietly(session)
        if e.connection_invalidated:
            raise _unavailable(
                "db-unavailable", "the database connection was lost; nothing was stored, "
                "retry after Retry-After seconds"
            ) from e
        raise
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


class FifoLock:
    """A lock taken in arrival order. SQLite lets one writer in at a time, and the others
    wait in its busy handler, which sleeps and polls: under a dozen concurrent ingest
    requests, whoever polls at the right moment wins, and the unlucky one waited past a
    client's 10 s timeout (p99 7 s, max 11 s with 16 senders). Queued here instead, in
    order, a request waits for those ahead of it only.

    Not re-entrant: the thread that holds it and asks again gets a :class:`RuntimeError`
    at once (it would wait for itself for ever; e.g. ``check_stale`` without ``runs``, which
    takes the lock, called inside an ingest's transaction, which holds it)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0
        self._serving = 0
        self._owner: int | None = None  # the thread holding it

    def __enter__(self) -> FifoLock:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                raise RuntimeError(
                    "this thread already holds the store's write lock: taking it again "
                    "would wait for ever (pass the caller's lock, or runs=, to stay in the "
                    "caller's transaction)")
            ticket = self._next
            self._next += 1
            while ticket != self._serving:
                self._cond.wait()
            self._owner = me
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._owner = None
            self._serving += 1
            self._cond.notify_all()


_write_locks: weakref.WeakKeyDictionary[Engine, FifoLock] = weakref.WeakKeyDictionary()
_write_locks_guard = threading.Lock()


def write_lock(engine: Engine) -> AbstractContextManager[Any]:
    """What ingest transactions take first: a :class:`FifoLock` on SQLite (one writer at a
    time anyway), nothing on PostgreSQL (row locks, many writers). The same lock for every
    call with one engine: retention's chunks (``store/retention.py``) queue in it with the
    ingest requests."""
    if engine.dialect.name != "sqlite":
        return nullcontext()
    with _write_locks_guard:
        lock = _write_locks.get(engine)
        if lock is None:
            lock = _write_locks[engine] = FifoLock()
        return lock


#: Seconds a client is asked to wait after a 503 (its spool keeps the frames meanwhile).
RETRY_AFTER = 2

_logged: dict[str, float] = {}  # database error -> when it was last logged


def _log_unavailable(e: Exception) -> None:
    """Say why the database refused (a full disk, a lock, a lost server): once a minute per
    cause, so an outage shows in the log without flooding it."""
    why = str(getattr(e, "orig", None) or e).strip().splitlines()[0][:300]
    now = time.monotonic()
    if now - _logged.get(why, -math.inf) < 60:
        return
    if len(_logged) > 100:
        _logged.clear()
    _logged[why] = now
    log.warning("the database refused a request, answered 503 db-unavailable (clients retry): "
                "%s", why)


def _unavailable(code: str, message: str) -> ServiceUnavailable:
    err = ServiceUnavailable(code, message)
    err.headers["Retry-After"] = str(RETRY_AFTER)
    return err


def _rollback_quietly(session: Session) -> None:
    """Roll back after a lost connection, where the rollback itself may fail."""
    try:
        session.rollback()
    except DBAPIError:
        log.debug("rollback after a database error failed too", exc_info=True)
