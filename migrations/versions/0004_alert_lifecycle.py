"""Alert lifecycle: grouping, suppression, acknowledgement, API rules, silences, outbox.

Why this shape: an alert now groups several heads of one layer (``heads``), may be held
back (``suppressed``: ``inhibited`` while the run-level divergence alert fires, or
``silenced``) and acknowledged (``acked_at``/``acked_by``). Rules set through the API live in
``alert_rules`` (a JSON spec per name, overriding the defaults); silences match alerts by
optional project/run/rule/rank/layer until ``ends_at``; webhook notifications wait in
``alert_outbox`` until delivered, so retries survive a collector restart.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("alerts", sa.Column("heads", sa.JSON(), nullable=True))
    op.add_column("alerts", sa.Column("suppressed", sa.String(16), nullable=True))
    op.add_column("alerts", sa.Column("acked_at", sa.Float(), nullable=True))
    op.add_column("alerts", sa.Column("acked_by", sa.String(128), nullable=True))
    op.create_table(
        "alert_rules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_alert_rules"),
        sa.UniqueConstraint("name", name="uq_alert_rules_name"),
    )
    op.create_table(
        "silences",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project", sa.String(128), nullable=True),
        sa.Column("run", sa.String(128), nullable=True),
        sa.Column("rule", sa.String(64), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("layer", sa.Integer(), nullable=True),
        sa.Column("starts_at", sa.Float(), nullable=False),
        sa.Column("ends_at", sa.Float(), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_silences"),
    )
    op.create_table(
        "alert_outbox",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", sa.Float(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_alert_outbox"),
    )


def downgrade() -> None:
    op.drop_table("alert_outbox")
    op.drop_table("silences")
    op.drop_table("alert_rules")
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("acked_by")
        batch.drop_column("acked_at")
        batch.drop_column("suppressed")
        batch.drop_column("heads")
