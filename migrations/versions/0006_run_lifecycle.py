"""Run lifecycle: running, finished, stopped, diverged.

Why this shape: a run that ended cleanly looked like one that hung (``no_data`` fired ten
minutes after it and it stayed "active"). A job now says that it ended with an end frame
(``"end": "finished"``, see ``logitwatch/wire.py``), and the run keeps what rank 0's last
end frame said: ``ended_at`` (its time), ``end_step`` (the last step), ``end_seq`` (its
sequence number: a later frame of rank 0 means the job was resumed, an older end frame
replayed late is ignored). ``status`` is ``running``, ``finished`` or ``stopped`` (the
``no_data`` alert fired); ``diverged_step`` is the step at which a run-level divergence
alert (a rule with ``inhibits``) fired at its rule's severity, at once or once escalated,
which makes the reported status ``diverged``. Existing runs: ``diverged_step`` from their
critical ``loss_nonfinite``/``loss_jump`` alerts (the default rules that inhibit),
``stopped`` where a ``no_data`` alert is open.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("status", sa.String(16), nullable=False,
                                     server_default=sa.text("'running'")))
    op.add_column("runs", sa.Column("ended_at", sa.Float(), nullable=True))
    op.add_column("runs", sa.Column("end_step", sa.BigInteger(), nullable=True))
    op.add_column("runs", sa.Column("end_seq", sa.BigInteger(), nullable=True))
    op.add_column("runs", sa.Column("diverged_step", sa.BigInteger(), nullable=True))
    op.execute(
        "UPDATE runs SET diverged_step = (SELECT MIN(alerts.fired_step) FROM alerts "
        "WHERE alerts.run_id = runs.id AND alerts.rule IN ('loss_nonfinite', 'loss_jump') "
        "AND alerts.severity = 'critical')"
    )
    op.execute(
        "UPDATE runs SET status = 'stopped' WHERE EXISTS (SELECT 1 FROM alerts "
        "WHERE alerts.run_id = runs.id AND alerts.rule = 'no_data' "
        "AND alerts.state = 'firing')"
    )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("diverged_step")
        batch.drop_column("end_seq")
        batch.drop_column("end_step")
        batch.drop_column("ended_at")
        batch.drop_column("status")
