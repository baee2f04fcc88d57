"""When the collector last heard from a run, by its own clock.

Why: the ``no_data`` rule and a run's ``active`` flag compared the collector's clock with
``runs.last_time``, the time the job stamps on its frames. A job whose clock runs ten
minutes behind the collector's was then "stopped" at every check while it reported, and
paged again at each new step. ``seen_at`` is set by the collector on every frame it
receives for the run (stored, resent or end frame); the rule and ``active`` read it, and
``last_time`` stays what the job said. Filled here from ``last_time``, the best there is.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("seen_at", sa.Float(), nullable=True))
    op.execute("UPDATE runs SET seen_at = last_time")


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("seen_at")
