"""Initial schema: runs, frames, metrics, per-frame float32 points, alerts.

Why this shape: frames carry the (run, rank, seq) dedup key, so retries and replays of a
batch never double-count; the values of a metric in a frame are one float32 blob, so a
per-head matrix costs one row, not layers x heads rows.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=True),
        sa.Column("last_time", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.UniqueConstraint("project", "name", name="uq_runs_project"),
    )
    op.create_table(
        "frames",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        # 64-bit: clients number frames from the wall clock in microseconds.
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_frames_run_id_runs",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_frames"),
        sa.UniqueConstraint("run_id", "rank", "seq", name="uq_frames_run_id"),
    )
    op.create_index("ix_frames_run_step", "frames", ["run_id", "step"])
    op.create_table(
        "metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("layers", sa.Integer(), nullable=False),
        sa.Column("heads", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_metrics_run_id_runs",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_metrics"),
        sa.UniqueConstraint("run_id", "name", name="uq_metrics_run_id"),
    )
    op.create_table(
        "points",
        sa.Column("metric_id", sa.Integer(), nullable=False),
        sa.Column("frame_id", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["metric_id"], ["metrics.id"],
                                name="fk_points_metric_id_metrics", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["frame_id"], ["frames.id"], name="fk_points_frame_id_frames",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("metric_id", "frame_id", name="pk_points"),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(64), nullable=False),
        sa.Column("metric", sa.String(128), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("layer", sa.Integer(), nullable=True),
        sa.Column("head", sa.Integer(), nullable=True),
        sa.Column("started_step", sa.Integer(), nullable=False),
        sa.Column("fired_step", sa.Integer(), nullable=False),
        sa.Column("fired_at", sa.Float(), nullable=False),
        sa.Column("resolved_step", sa.Integer(), nullable=True),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("baseline", sa.Float(), nullable=True),
        sa.Column("threshold", sa.Float(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("remedies", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_alerts_run_id_runs",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
    )
    op.create_index("ix_alerts_run_state", "alerts", ["run_id", "state"])


def downgrade() -> None:
    op.drop_index("ix_alerts_run_state", table_name="alerts")
    op.drop_table("alerts")
    op.drop_table("points")
    op.drop_table("metrics")
    op.drop_index("ix_frames_run_step", table_name="frames")
    op.drop_table("frames")
    op.drop_table("runs")
