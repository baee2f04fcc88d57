"""API tokens: per project, in two scopes (ingest, read), stored as SHA-256 hashes.

Why this shape: a shared collector holds several teams' unpublished runs, so every request
names a token, and a token grants one scope on one project. The secret itself is never
stored, only its SHA-256 (``token_hash``, unique: the lookup key) and a short ``prefix``
for people to tell tokens apart. Revocation sets ``revoked_at`` instead of deleting the row,
so ``logitwatch token list`` keeps the history.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.Column("last_used_at", sa.Float(), nullable=True),
        sa.CheckConstraint("scope IN ('ingest', 'read')", name="ck_tokens_scope"),
        sa.PrimaryKeyConstraint("id", name="pk_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_tokens_token_hash"),
    )


def downgrade() -> None:
    op.drop_table("tokens")
