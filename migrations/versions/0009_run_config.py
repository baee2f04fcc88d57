"""A run's configuration: what its job says about itself (hyperparameters, model, data).

Why: the runs list shows each run's configuration beside its status, so runs can be told
apart and compared by what they were, not only by name. A JSON object, null until set
(``PUT /api/v1/runs/{run}/config``).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("config", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("config")
