"""Every step column is 64 bits, as the API's steps are (up to 2**62).

Why: ``runs.last_step`` and the alert steps (``started_step``, ``fired_step``,
``resolved_step``) were 32-bit integers while the API accepts steps up to 2**62: on
PostgreSQL a frame of step 2**31 or more failed its whole batch with a 500
(NumericValueOutOfRange), and a client resent it for ever. SQLite stores every integer in
64 bits whatever the declared type, so there the columns only change their declared type
(no table rewrite, which on SQLite would copy ``runs`` and let its foreign keys cascade).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

COLUMNS = (("runs", "last_step", True), ("alerts", "started_step", False),
           ("alerts", "fired_step", False), ("alerts", "resolved_step", True))


def _retype(old: sa.types.TypeEngine, new: sa.types.TypeEngine) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite: INTEGER is already 64 bits; the models say BigInteger there too
    for table, column, nullable in COLUMNS:
        op.alter_column(table, column, type_=new, existing_type=old,
                        existing_nullable=nullable)


def upgrade() -> None:
    _retype(sa.Integer(), sa.BigInteger())


def downgrade() -> None:
    _retype(sa.BigInteger(), sa.Integer())
