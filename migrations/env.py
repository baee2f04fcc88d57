"""Alembic environment for logitwatch.

The URL comes from, in order: a connection passed in ``config.attributes["connection"]``
(how the collector migrates at start), the ``sqlalchemy.url`` main option, or the
``LOGITWATCH_DB_URL`` environment variable (for the ``alembic`` command line).
``render_as_batch`` keeps ALTERs workable on SQLite; ``include_object`` leaves out what time
partitioning adds on PostgreSQL (``server/db/partitions.py``), which the models do not say.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

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
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url())
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True,
                          include_object=include_object(conn.dialect.name))
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
