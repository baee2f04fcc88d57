"""A SQLite connection the pool opens while a writer holds the write lock reads at once.

Every new connection set ``PRAGMA auto_vacuum=INCREMENTAL``, which on a file in use waits
for SQLite's write lock: a dashboard read that needed one more pooled connection while an
ingest batch or a retention chunk was writing waited for that writer (up to the busy
timeout, then ``database is locked``), though WAL lets readers read beside a writer. The
page size and auto-vacuum are now set on a new, empty file only, where they take effect.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from logitwatch.server.db import session as db_session
from logitwatch.server.db.session import make_engine, migrate


def test_a_new_connection_reads_beside_a_writer_holding_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "lw.db"
    engine = make_engine(f"sqlite:///{path}")
    migrate(engine)
    with engine.connect() as conn:  # the file as the collector made it
        assert conn.exec_driver_sql("PRAGMA auto_vacuum").scalar() == 2  # INCREMENTAL
        assert conn.exec_driver_sql("PRAGMA page_size").scalar() == db_session.SQLITE_PAGE_SIZE
    engine.dispose()

    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # SQLite's write lock, held as an ingest holds it
    writer.execute("INSERT INTO runs (project, name, created_at) VALUES ('p', 'r', 0)")
    try:
        # a busy timeout of 0.3 s: a connection that waits for the writer fails, not hangs
        monkeypatch.setattr(db_session, "SQLITE_BUSY_TIMEOUT", 0.3)
        reader = make_engine(f"sqlite:///{path}")
        with reader.connect() as conn:  # a new pooled connection, its PRAGMAs first
            assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 0
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        reader.dispose()
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_new_file_still_gets_its_page_size_and_incremental_auto_vacuum(
        tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'new.db'}")
    with engine.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x)")
        conn.commit()
    engine.dispose()
    raw = sqlite3.connect(tmp_path / "new.db")
    try:
        assert raw.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        assert raw.execute("PRAGMA page_size").fetchone()[0] == db_session.SQLITE_PAGE_SIZE
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()
