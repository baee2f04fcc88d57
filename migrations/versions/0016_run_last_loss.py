"""What the dashboard's lists read of a run's frames, kept on the run: its newest frame's id
and rank 0's last loss.

Why: the runs list's ``diverged`` also covers a run whose last loss (rank 0) is not finite,
which only its loss series knew, so filtering by status built a sparkline for every stored
run (0.45-1.19 s on 3,000 runs, warm cache); the alerts inbox read each run's last loss the
same way, one run at a time; and ``GET /runs`` read ``max(frames.id)`` per run (the live
stream's ``after``), a correlated subquery that on a partitioned PostgreSQL plans every
partition (72 ms at 410 partitions). Ingest now keeps them on ``runs``
(``server/store/ingest.py``): ``last_frame_id``; ``last_loss`` with ``last_loss_step``
and ``last_loss_seq``, the rank 0 frame it came from (its newest with a loss, by step then
seq, what the sparkline ends at), and ``last_loss_finite`` (null before the first loss;
SQLite stores NaN as NULL, so NaN is ``(NULL, false)`` there). Filled here from the stored
frames: a run's newest loss is found through the ``(run_id, rank, step)`` index, then its
stored float32 is decoded here.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-14
"""

from __future__ import annotations

import math
import struct

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

#: Runs filled per UPDATE batch.
CHUNK = 500


def upgrade() -> None:
    op.add_column("runs", sa.Column("last_frame_id", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("last_loss", sa.Float(), nullable=True))
    op.add_column("runs", sa.Column("last_loss_finite", sa.Boolean(), nullable=True))
    op.add_column("runs", sa.Column("last_loss_step", sa.BigInteger(), nullable=True))
    op.add_column("runs", sa.Column("last_loss_seq", sa.BigInteger(), nullable=True))
    bind = op.get_bind()
    bind.execute(sa.text(
        "UPDATE runs SET last_frame_id = (SELECT max(f.id) FROM frames f WHERE f.run_id = runs.id)"
    ))
    # Each run's newest rank 0 frame with a loss: one index walk per run, newest first.
    newest = bind.execute(sa.text(
        "SELECT m.run_id, m.id, (SELECT f.id FROM frames f JOIN points p ON p.frame_id = f.id "
        "WHERE p.metric_id = m.id AND f.run_id = m.run_id AND f.rank = 0 "
        "ORDER BY f.step DESC, f.seq DESC LIMIT 1) FROM metrics m WHERE m.name = 'loss'"
    )).all()
    found = [(run_id, mid, fid) for run_id, mid, fid in newest if fid is not None]
    read = sa.text(
        "SELECT f.id, f.step, f.seq, p.data FROM frames f JOIN points p ON p.frame_id = f.id "
        "WHERE p.metric_id IN :mids AND f.id IN :fids"
    ).bindparams(sa.bindparam("mids", expanding=True), sa.bindparam("fids", expanding=True))
    write = sa.text(
        "UPDATE runs SET last_loss = :value, last_loss_finite = :finite, "
        "last_loss_step = :step, last_loss_seq = :seq WHERE id = :id"
    ).bindparams(sa.bindparam("finite", type_=sa.Boolean()))
    for i in range(0, len(found), CHUNK):
        part = found[i:i + CHUNK]
        # a frame's points are its own run's, whose one loss metric is in mids
        rows = {r[0]: r for r in bind.execute(read, {"mids": [m for _, m, _ in part],
                                                    "fids": [f for _, _, f in part]})}
        params = []
        for run_id, _, fid in part:
            _, step, seq, data = rows[fid]
            (value,) = struct.unpack("<f", bytes(data)[:4])
            params.append({"id": run_id, "value": value, "finite": math.isfinite(value),
                           "step": step, "seq": seq})
        bind.execute(write, params)


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for col in ("last_loss_seq", "last_loss_step", "last_loss_finite", "last_loss",
                    "last_frame_id"):
            batch.drop_column(col)
