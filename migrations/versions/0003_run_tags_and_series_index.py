"""Run tags, a frames index for per-rank step ranges, a covering index of scalar values.

Why this shape: runs are found by project, tag, status and time (``GET /api/v1/runs``);
a tag is a row of ``run_tags`` (run, tag), so "runs with tag X" is an indexed lookup on
SQLite and PostgreSQL alike, with no dialect-specific JSON operators. Series are read per
(run, rank) over a step range: ``ix_frames_run_rank_step`` walks them in step order
without a sort, and replaces ``ix_frames_run_step`` (a prefix of no query any more).
Scalar values (4-byte blobs) sit between the matrices of their frame in ``points``, so
reading a scalar series touched one page per frame; ``ix_points_scalar``, a partial index
of those rows that includes the value, serves a scalar series from the index alone (7x
faster over 10,000 frames) for ~15 bytes per scalar value.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_tags",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_tags_run_id_runs",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "tag", name="pk_run_tags"),
    )
    op.create_index("ix_run_tags_tag", "run_tags", ["tag"])
    op.create_index("ix_frames_run_rank_step", "frames", ["run_id", "rank", "step"])
    op.drop_index("ix_frames_run_step", table_name="frames")
    op.create_index("ix_points_scalar", "points", ["metric_id", "frame_id", "data"],
                    sqlite_where=sa.text("length(data) = 4"),
                    postgresql_where=sa.text("length(data) = 4"))


def downgrade() -> None:
    op.drop_index("ix_points_scalar", table_name="points")
    op.create_index("ix_frames_run_step", "frames", ["run_id", "step"])
    op.drop_index("ix_frames_run_rank_step", table_name="frames")
    op.drop_index("ix_run_tags_tag", table_name="run_tags")
    op.drop_table("run_tags")
