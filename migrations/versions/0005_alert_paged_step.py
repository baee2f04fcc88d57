"""Alerts keep what they showed when they fired; ``paged_step`` says when they paged.

Why this shape: an alert stored as ``info`` (a downgrade) and escalated later kept its
``fired_step``, and the step at which it became a page was only in its evidence
(``escalated_step``), so "when were people paged" needed a JSON lookup that differs per
database. ``paged_step`` is the step at which the alert first became ``warning`` or
``critical``: its ``fired_step`` when it fired so, the escalation step when it was
escalated, null for an ``info`` alert that never was. Existing alerts are filled in from
those same fields (a few rows per run, read and written through SQLAlchemy's JSON type, so
the same code runs on SQLite and PostgreSQL).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_alerts = sa.table(
    "alerts",
    sa.column("id", sa.Integer()),
    sa.column("severity", sa.String()),
    sa.column("fired_step", sa.Integer()),
    sa.column("evidence", sa.JSON()),
    sa.column("paged_step", sa.BigInteger()),
)


def upgrade() -> None:
    op.add_column("alerts", sa.Column("paged_step", sa.BigInteger(), nullable=True))
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(_alerts.c.id, _alerts.c.severity, _alerts.c.fired_step, _alerts.c.evidence)
        .where(_alerts.c.severity.in_(["warning", "critical"]))
    ).all()
    for aid, _, fired, evidence in rows:
        escalated = (evidence or {}).get("escalated_step")
        step = escalated if isinstance(escalated, int) else fired
        conn.execute(sa.update(_alerts).where(_alerts.c.id == aid).values(paged_step=step))


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_column("paged_step")
