"""Engine construction, schema migration at start, and the one transaction scope."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from logitwatch.server.errors import Conflict, ServiceUnavailable

__all__ = ["alembic_config", "make_engine", "migrate", "session_scope", "schema_revision"]

log = logging.getLogger("logitwatch.server")


def make_engine(url: str, *, pool_size: int = 5) -> Engine:
    """Build an engine. SQLite gets WAL, foreign keys and a busy timeout; its parent folder is
    created. PostgreSQL gets a sized pool that fails fast (``pool_timeout``) instead of hanging.
    """
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(
        url, pool_size=pool_size, max_overflow=pool_size, pool_timeout=10, pool_pre_ping=True
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


def migrate(engine: Engine) -> None:
    """Bring the schema to head (``alembic upgrade head``); refuse a database from the future."""
    cfg = alembic_config()
    head = ScriptDirectory.from_config(cfg).get_current_head()
    current = schema_revision(engine)
    if current == head:
        return
    known = {s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()}
    if current is not None and current not in known:
        raise RuntimeError(
            f"The database is at schema revision {current!r}, which this logitwatch does not "
            "know (it was written by a newer version). Upgrade logitwatch or use another --db."
        )
    log.info("migrating database schema %s -> %s", current, head)
    with engine.begin() as conn:
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
    except OperationalError as e:
        session.rollback()
        raise ServiceUnavailable(
            "db-unavailable", "the database is unavailable; retry later"
        ) from e
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
