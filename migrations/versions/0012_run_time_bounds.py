"""A run's time bounds: the least and greatest time of its stored frames.

Why: on PostgreSQL ``frames`` and ``points`` are partitioned by day (0011). A read that
joins them on the frame id alone plans and probes every partition; with the run's bounds
as constants (``frames.time`` and ``points.time`` between them, and the two times equal in
the join) the planner keeps only the partitions of the run's days
(``server/store/pruning.py``). Kept by ingest (``LEAST``/``GREATEST`` of what it stores),
filled here from the stored frames. Bounds of dropped rows are kept: a wider range is
still right, only less narrow.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-12
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("time_min", sa.Float(), nullable=True))
    op.add_column("runs", sa.Column("time_max", sa.Float(), nullable=True))
    op.execute(
        "UPDATE runs SET "
        "time_min = (SELECT min(f.time) FROM frames f WHERE f.run_id = runs.id), "
        "time_max = (SELECT max(f.time) FROM frames f WHERE f.run_id = runs.id)"
    )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("time_max")
        batch.drop_column("time_min")
