"""An index of ``points`` by ``frame_id``.

Why: ``points`` is keyed ``(metric_id, frame_id)``, and its foreign key to ``frames`` is
checked (and cascaded) on every frame deleted, by ``frame_id``: without an index that is a
scan of the whole table per frame. Deleting a run of 600 frames from a store of 409,527
values took 31 s on SQLite, holding the write lock (other jobs' ingests got 503 after 30 s);
retention's drop of old frames and ``logitwatch runs delete`` did the same. With the index
each lookup is a search (``bench/bench_run_delete.py``). On a partitioned PostgreSQL the
index is made on ``points`` and on each of its partitions, and on every partition made
later.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_points_frame", "points", ["frame_id"])


def downgrade() -> None:
    op.drop_index("ix_points_frame", table_name="points")
