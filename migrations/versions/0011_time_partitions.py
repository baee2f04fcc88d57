"""PostgreSQL: ``frames`` and ``points`` partitioned by time, one partition a day.

Why: a team store grows by a job's frames every day, and retention that deletes old rows
one by one leaves a table that must be vacuumed and rewritten; with the rows of a day in a
table of their own, retention drops that table (``server/db/partitions.py``). ``frames``
is range-partitioned on its ``time`` (unix seconds, the frame's); ``points`` gains a
``time`` column, its frame's time, and is partitioned the same way, so a day's frames and
values go together. PostgreSQL requires the partition key in every unique key:

* ``frames``: primary key ``(id, time)`` (ids still come from one sequence, so ``id``
  alone stays unique); the dedup key ``(run_id, rank, seq, time)``: a resent frame carries
  its time, so it is still one row (store/ingest.py adds a check for history steps).
* ``points``: primary key ``(metric_id, frame_id, time)``; its foreign key to ``frames`` is
  ``(frame_id, time) -> (id, time)``.

Partitions are ``frames_pYYYYMMDD`` / ``points_pYYYYMMDD`` for ``[day, day + 86400)`` in
UTC, and ``frames_default`` / ``points_default`` for any other time (a job whose clock is
off, a replay of old frames). This migration creates one for every day the stored frames
cover (at most ``MAX_DAYS``, the newest) and for yesterday to a week ahead; the collector
creates the next ones ahead of time (``ensure_partitions``). Existing rows are copied into
new partitioned tables, which then take the old tables' names, keys and indexes.

SQLite: nothing changes (no native partitioning; retention deletes rows there).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-11
"""

from __future__ import annotations

import time

from alembic import op
from sqlalchemy import text

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

DAY = 86400
AHEAD_DAYS = 7
#: Partitions made for the days that existing frames cover, at most (the newest days);
#: older rows go to the default partitions.
MAX_DAYS = 3660


def _exec(sql: str, **params: object) -> None:
    op.get_bind().execute(text(sql), params)


def _partition(table: str, day: int) -> None:
    name = f"{table}_p{time.strftime('%Y%m%d', time.gmtime(day * DAY))}"
    _exec(f"CREATE TABLE {name} PARTITION OF {table} "
          f"FOR VALUES FROM ({day * DAY}) TO ({(day + 1) * DAY})")


def _sequence(table: str) -> str:
    seq = op.get_bind().execute(
        text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": table}).scalar()
    if not seq:
        raise RuntimeError(f"{table}.id has no sequence")
    return str(seq)


def _days() -> list[int]:
    today = int(time.time() // DAY)
    stored = [int(r[0]) for r in op.get_bind().execute(text(
        "SELECT DISTINCT floor(time / 86400)::bigint AS d FROM frames_old "
        "WHERE time >= 0 AND time < :hi ORDER BY d DESC LIMIT :n"),
        {"hi": (today + AHEAD_DAYS + 1) * DAY, "n": MAX_DAYS})]
    return sorted(set(stored) | set(range(today - 1, today + AHEAD_DAYS + 1)))


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _exec("LOCK TABLE frames, points IN ACCESS EXCLUSIVE MODE")
    seq = _sequence("frames")
    _exec("ALTER TABLE points RENAME TO points_old")
    _exec("ALTER TABLE frames RENAME TO frames_old")
    _exec(f"ALTER SEQUENCE {seq} OWNED BY NONE")
    _exec(f"CREATE TABLE frames (id INTEGER NOT NULL DEFAULT nextval('{seq}'::regclass), "
          "run_id INTEGER NOT NULL, rank INTEGER NOT NULL, seq BIGINT NOT NULL, "
          "step BIGINT NOT NULL, time DOUBLE PRECISION NOT NULL) PARTITION BY RANGE (time)")
    _exec("CREATE TABLE points (metric_id INTEGER NOT NULL, frame_id INTEGER NOT NULL, "
          "time DOUBLE PRECISION NOT NULL, data BYTEA NOT NULL) PARTITION BY RANGE (time)")
    for table in ("frames", "points"):
        _exec(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT")
        for day in _days():
            _partition(table, day)
    _exec("INSERT INTO frames (id, run_id, rank, seq, step, time) "
          "SELECT id, run_id, rank, seq, step, time FROM frames_old")
    # Matrices first, then the scalars, as ingest writes them (dense pages).
    _exec("INSERT INTO points (metric_id, frame_id, time, data) "
          "SELECT p.metric_id, p.frame_id, f.time, p.data FROM points_old p "
          "JOIN frames_old f ON f.id = p.frame_id "
          "ORDER BY length(p.data) <= 4, p.metric_id, p.frame_id")
    _exec("DROP TABLE points_old")
    _exec("DROP TABLE frames_old")
    _exec(f"ALTER SEQUENCE {seq} OWNED BY frames.id")
    _exec("ALTER TABLE frames ADD CONSTRAINT pk_frames PRIMARY KEY (id, time)")
    _exec("ALTER TABLE frames ADD CONSTRAINT uq_frames_run_id UNIQUE (run_id, rank, seq, time)")
    _exec("ALTER TABLE frames ADD CONSTRAINT fk_frames_run_id_runs FOREIGN KEY (run_id) "
          "REFERENCES runs (id) ON DELETE CASCADE")
    _exec("CREATE INDEX ix_frames_run_rank_step ON frames (run_id, rank, step)")
    _exec("CREATE INDEX ix_frames_run_id ON frames (run_id, id)")
    _exec("ALTER TABLE points ADD CONSTRAINT pk_points PRIMARY KEY (metric_id, frame_id, time)")
    _exec("ALTER TABLE points ADD CONSTRAINT fk_points_metric_id_metrics FOREIGN KEY "
          "(metric_id) REFERENCES metrics (id) ON DELETE CASCADE")
    _exec("ALTER TABLE points ADD CONSTRAINT fk_points_frame_id_frames FOREIGN KEY "
          "(frame_id, time) REFERENCES frames (id, time) ON DELETE CASCADE")
    _exec("CREATE INDEX ix_points_scalar ON points (metric_id, frame_id, data) "
          "WHERE length(data) = 4")
    _exec("ANALYZE frames")
    _exec("ANALYZE points")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _exec("LOCK TABLE frames, points IN ACCESS EXCLUSIVE MODE")
    seq = _sequence("frames")
    _exec("ALTER TABLE points RENAME TO points_old")
    _exec("ALTER TABLE frames RENAME TO frames_old")
    for old in ("pk_points", "fk_points_metric_id_metrics", "fk_points_frame_id_frames"):
        _exec(f"ALTER TABLE points_old DROP CONSTRAINT {old}")
    for old in ("pk_frames", "uq_frames_run_id", "fk_frames_run_id_runs"):
        _exec(f"ALTER TABLE frames_old DROP CONSTRAINT {old}")
    for old in ("ix_points_scalar", "ix_frames_run_rank_step", "ix_frames_run_id"):
        _exec(f"DROP INDEX {old}")
    _exec(f"ALTER SEQUENCE {seq} OWNED BY NONE")
    _exec(f"CREATE TABLE frames (id INTEGER NOT NULL DEFAULT nextval('{seq}'::regclass), "
          "run_id INTEGER NOT NULL, rank INTEGER NOT NULL, seq BIGINT NOT NULL, "
          "step BIGINT NOT NULL, time DOUBLE PRECISION NOT NULL)")
    _exec("CREATE TABLE points (metric_id INTEGER NOT NULL, frame_id INTEGER NOT NULL, "
          "data BYTEA NOT NULL)")
    # One row per (run, rank, seq) again: the first stored, should a history step have
    # been stored twice with two times (two collectors at once, store/ingest.py).
    _exec("INSERT INTO frames SELECT DISTINCT ON (run_id, rank, seq) id, run_id, rank, seq, "
          "step, time FROM frames_old ORDER BY run_id, rank, seq, id")
    _exec("INSERT INTO points SELECT p.metric_id, p.frame_id, p.data FROM points_old p "
          "JOIN frames f ON f.id = p.frame_id AND f.time = p.time "
          "ORDER BY length(p.data) <= 4, p.metric_id, p.frame_id")
    _exec("DROP TABLE points_old")
    _exec("DROP TABLE frames_old")
    _exec(f"ALTER SEQUENCE {seq} OWNED BY frames.id")
    _exec("ALTER TABLE frames ADD CONSTRAINT pk_frames PRIMARY KEY (id)")
    _exec("ALTER TABLE frames ADD CONSTRAINT uq_frames_run_id UNIQUE (run_id, rank, seq)")
    _exec("ALTER TABLE frames ADD CONSTRAINT fk_frames_run_id_runs FOREIGN KEY (run_id) "
          "REFERENCES runs (id) ON DELETE CASCADE")
    _exec("CREATE INDEX ix_frames_run_rank_step ON frames (run_id, rank, step)")
    _exec("CREATE INDEX ix_frames_run_id ON frames (run_id, id)")
    _exec("ALTER TABLE points ADD CONSTRAINT pk_points PRIMARY KEY (metric_id, frame_id)")
    _exec("ALTER TABLE points ADD CONSTRAINT fk_points_metric_id_metrics FOREIGN KEY "
          "(metric_id) REFERENCES metrics (id) ON DELETE CASCADE")
    _exec("ALTER TABLE points ADD CONSTRAINT fk_points_frame_id_frames FOREIGN KEY "
          "(frame_id) REFERENCES frames (id) ON DELETE CASCADE")
    _exec("CREATE INDEX ix_points_scalar ON points (metric_id, frame_id, data) "
          "WHERE length(data) = 4")
