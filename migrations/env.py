"""Alembic environment for logitwatch.

The URL comes from, in order: a connection passed in ``config.attributes["connection"]``
(how the collector migrates at start), the ``sqlalchemy.url`` main option, or the
``LOGITWATCH_DB_URL`` environment variable (for the ``alembic`` command line).
``render_as_batch`` keeps ALTERs workable on SQLite; ``include_object`` leaves out what time
partitioning adds on PostgreSQL (``server/db/partitions.py``), which the models do not say.

On SQLite, foreign keys are off while migrating: a batch operation rebuilds a table by
copying it and dropping the old one, and the collector's connections enforce foreign keys
(``PRAGMA foreign_keys=ON``), under which dropping the old ``runs`` cascaded into every
metric, frame and value of every run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from alembic import context
from sqlalchemy import Connection, create_engine

from logitwatch.server.db.models import Base
from logitwatch.server.db.partitions import include_object

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("LOGITWATCH_DB_URL")
    if not url:
        raise SystemExit("Set LOGITWATCH_DB_URL (e.g. the default store, "
                         "sqlite:///$HOME/.local/share/logitwatch/logitwatch.db; "
                         "`logitwatch runs list` prints the one in use).")
    return url


@contextmanager
def _foreign_keys_off(conn: Connection) -> Iterator[None]:
    """SQLite: foreign keys off while migrating (the module's docstring). The pragma is a
    no-op inside a transaction: this runs before the first write, when the driver has not
    begun one yet; and turning them on again must wait until the caller's transaction
    ends: the connection is marked (``info["foreign_keys_off"]``), and the collector's
    engine turns them on when it gets the connection back (``server/db/session.py``)."""
    if conn.dialect.name == "sqlite" and conn.exec_driver_sql("PRAGMA foreign_keys").scalar():
        conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
        conn.info["foreign_keys_off"] = True
    yield


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, render_as_batch=True,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=True,
                          include_object=include_object(connection.dialect.name))
        with _foreign_keys_off(connection), context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url())
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True,
                          include_object=include_object(conn.dialect.name))
        with _foreign_keys_off(conn), context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
