"""What the alert engine remembers of a (run, rank) over the whole run.

Why: after a collector restart (or when it forgets an idle run) the engine rebuilds a
(run, rank) by replaying its newest stored frames, 400 of them. Some rules compare with
what the whole run did: the lowest level a series settled to (``level_rise``: the loss and
gradient-norm ramps), the peak the learning rate settled at (``above_peak``), the run's
best loss (a downgrade's loss rise). Rebuilt from 400 frames those differ, and a restart
made alerts resolve and fire again, paging twice, or page hundreds of steps late. The
numbers are small; the engine writes them with each ingest batch that changed them and
reads them back after the replay.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rule_memory",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("rank", sa.Integer(), primary_key=True),
        sa.Column("data", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rule_memory")
