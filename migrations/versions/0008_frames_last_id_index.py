"""An index of each run's frame ids: a run's newest frame id in one lookup.

Why: the live stream resumes after a frame id (``after``), and ``GET /runs`` and ``GET
/runs/{run}`` give each run's ``last_frame_id`` for it. ``max(frames.id)`` of one run had
to walk all of that run's rows of ``ix_frames_run_rank_step`` (one per step, history
included); ``ix_frames_run_id`` (run_id, id) answers it from the end of the run's range,
on SQLite and PostgreSQL alike, so the list's value costs one lookup per run.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-08
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_frames_run_id", "frames", ["run_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_frames_run_id", table_name="frames")
