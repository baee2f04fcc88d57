"""A run's control: what people asked of its job's fuses, and what the job says of them.

Why: the dashboard applies or undoes a fuse of a run with one click (``POST
/api/v1/runs/{run}/fuses``); the ingest answer hands it to the job in ``control.fuses``.
A JSON object, null until a job sends fuse states or a person asks (``store/fuses.py``).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("control", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("control")
