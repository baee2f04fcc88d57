"""A frame's values are found by ``frame_id`` (migration 0015): the foreign key from
``points`` to ``frames`` is checked and cascaded on every frame deleted (a run deleted,
retention's drop of old frames), and without an index that was a scan of the whole
``points`` table per frame: 31 s for a run of 600 frames in a store of 409,527 values,
holding SQLite's write lock while other jobs' ingests waited and got 503."""

from __future__ import annotations

import time

from sqlalchemy import text

from logitwatch.server.db.partitions import ensure_partitions, is_partitioned
from logitwatch.server.db.session import make_engine, migrate

DAY = 86400


def test_a_frames_values_are_searched_not_scanned_on_sqlite(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    with engine.connect() as conn:
        plan = " | ".join(str(r[-1]) for r in conn.execute(
            text("EXPLAIN QUERY PLAN SELECT 1 FROM points WHERE frame_id = 7")))
    engine.dispose()
    assert "ix_points_frame" in plan, plan
    assert "SCAN points" not in plan, plan


def test_every_points_partition_has_the_frame_index(db_url: str) -> None:
    """PostgreSQL: on ``points``, on each day partition the migration made, and on one the
    collector makes later (a partitioned table's index is made on each new partition);
    SQLite: on ``points``."""
    engine = make_engine(db_url)
    try:
        migrate(engine)
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                names = {r[1] for r in conn.execute(text("PRAGMA index_list(points)"))}
                assert "ix_points_frame" in names
                return
            assert is_partitioned(engine)
        ensure_partitions(engine, now=time.time() + 30 * DAY)  # a month ahead: new ones
        with engine.connect() as conn:
            tables = set(conn.scalars(text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'points'")))
            indexed = {t for t, d in conn.execute(text(
                "SELECT tablename, indexdef FROM pg_indexes WHERE tablename LIKE 'points%'"))
                if d.rstrip().endswith("(frame_id)")}
        assert len(tables) > 8, tables
        assert indexed >= tables | {"points"}, sorted((tables | {"points"}) - indexed)
    finally:
        engine.dispose()
