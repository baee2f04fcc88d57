"""SQLAlchemy tables. The schema itself is owned by Alembic (``migrations/``).

Per-head statistics are stored as one float32 blob per (frame, metric): a 24 x 16 matrix is
one row of 1,536 x 4 bytes instead of 1,536 rows, which keeps storage near 4 bytes a value.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Alert", "Base", "Frame", "Metric", "Point", "Run", "RunTag", "Token"]

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


#: A step column created 32-bit and widened by migration 0007: BIGINT on PostgreSQL;
#: INTEGER, which is 64 bits already, on SQLite (no table rewrite there).
STEP = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("project", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float)
    last_step: Mapped[int | None] = mapped_column(STEP, nullable=True)
    last_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    # 0006: lifecycle (store/lifecycle.py): running, finished (rank 0's job said it ended:
    # ended_at/end_step/end_seq of that end frame), stopped (the no_data alert fired);
    # diverged_step: the first step a run-level divergence alert (a rule with `inhibits`)
    # fired at its rule's severity (or was escalated to it): the reported status "diverged"
    status: Mapped[str] = mapped_column(String(16), default="running",
                                        server_default=text("'running'"))
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    end_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    diverged_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # 0009: what its job says about itself (hyperparameters, model, data): a JSON object
    config: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)
    # 0010: its fuses: what people asked, what the job says (store/fuses.py)
    control: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)
    # 0012: the least and greatest time of its stored frames (ingest keeps them): the
    # bounds that let PostgreSQL prune time partitions in the reads (store/pruning.py)
    time_min: Mapped[float | None] = mapped_column(Float, nullable=True)
    time_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    # 0013: when the collector last received a frame of it, by the collector's clock (the
    # no_data rule and `active` read this, not last_time, which is the job's clock)
    seen_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # 0016: what the runs list and the alerts inbox read of its frames, kept by ingest so
    # that they never read frames: its newest frame's id (the live stream's `after`), and
    # rank 0's loss at its newest (step, seq) with a loss, as stored (float32), with that
    # step and seq (a later batch replaces it only with a newer one). last_loss_finite is
    # null before the first loss; SQLite stores NaN as NULL, so a NaN reads back from
    # (last_loss NULL, last_loss_finite false) there (store/runs.py: last_loss).
    last_frame_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_loss_finite: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    last_loss_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_loss_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class RunTag(Base):
    """A label of a run (``GET /api/v1/runs?tag=``); set with ``logitwatch runs tag``."""

    __tablename__ = "run_tags"
    __table_args__ = (Index("ix_run_tags_tag", "tag"),)

    run_id: Mapped[int] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)


class RuleMemory(Base):
    """What the alert engine remembers of a (run, rank) over the whole run and a replay of
    its newest frames cannot rebuild (the lowest level a series settled to, the peak the
    LR settled at, the run's best loss): written with each ingest batch that changed it,
    read back when the engine rebuilds that (run, rank) after a restart
    (``server/alerts/rule_memory.py``, 0014)."""

    __tablename__ = "rule_memory"

    run_id: Mapped[int] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[str] = mapped_column(Text)


class Frame(Base):
    """One sampled step of one rank; (run, rank, seq) is the deduplication key."""

    __tablename__ = "frames"
    __table_args__ = (
        UniqueConstraint("run_id", "rank", "seq"),
        Index("ix_frames_run_rank_step", "run_id", "rank", "step"),
        Index("ix_frames_run_id", "run_id", "id"),  # a run's newest frame (last_frame_id)
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(BigInteger)
    step: Mapped[int] = mapped_column(BigInteger)
    time: Mapped[float] = mapped_column(Float)


class Metric(Base):
    """A named series of a run; ``layers``/``heads`` are 0 for scalars."""

    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("run_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    layers: Mapped[int] = mapped_column(Integer)
    heads: Mapped[int] = mapped_column(Integer)


class Point(Base):
    """The values of one metric in one frame: little-endian float32, row-major.

    ``ix_points_scalar`` is a partial covering index of the scalar rows (4-byte blobs):
    a scalar series is read from it alone, without touching the pages of the matrices
    stored between its rows. ``ix_points_frame`` finds a frame's values: the foreign key's
    check (and cascade) on every frame deleted looks them up by ``frame_id``, which the
    primary key does not lead with (migration 0015).
    """

    __tablename__ = "points"
    __table_args__ = (
        Index("ix_points_scalar", "metric_id", "frame_id", "data",
              sqlite_where=text("length(data) = 4"),
              postgresql_where=text("length(data) = 4")),
        Index("ix_points_frame", "frame_id"),
    )

    metric_id: Mapped[int] = mapped_column(
        ForeignKey("metrics.id", ondelete="CASCADE"), primary_key=True
    )
    frame_id: Mapped[int] = mapped_column(
        ForeignKey("frames.id", ondelete="CASCADE"), primary_key=True
    )
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Alert(Base):
    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_run_state", "run_id", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rule: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(128))
    severity: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    rank: Mapped[int] = mapped_column(Integer)
    layer: Mapped[int | None] = mapped_column(Integer, nullable=True)
    head: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_step: Mapped[int] = mapped_column(STEP)
    fired_step: Mapped[int] = mapped_column(STEP)
    fired_at: Mapped[float] = mapped_column(Float)
    resolved_step: Mapped[int | None] = mapped_column(STEP, nullable=True)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    baseline: Mapped[float | None] = mapped_column(Float, nullable=True)
    threshold: Mapped[float | None] = mapped_column(Float, nullable=True)
    message: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, object]] = mapped_column(JSON)
    remedies: Mapped[list[str]] = mapped_column(JSON)
    # 0004: grouping, suppression (inhibited/silenced), acknowledgement
    heads: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    suppressed: Mapped[str | None] = mapped_column(String(16), nullable=True)
    acked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    acked_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # 0005: the step at which it first became warning or critical (fired so, or escalated)
    paged_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class AlertRule(Base):
    """A rule set through the API (overrides the default or file rule of the same name)."""

    __tablename__ = "alert_rules"
    __table_args__ = (UniqueConstraint("name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, object]] = mapped_column(JSON)
    updated_at: Mapped[float] = mapped_column(Float)


class Silence(Base):
    """Alerts matching (project, run, rule, rank, layer) fire silenced until ``ends_at``;
    a null field matches anything."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str | None] = mapped_column(String(128), nullable=True)
    run: Mapped[str | None] = mapped_column(String(128), nullable=True)
    rule: Mapped[str | None] = mapped_column(String(64), nullable=True)
    rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    layer: Mapped[int | None] = mapped_column(Integer, nullable=True)
    starts_at: Mapped[float] = mapped_column(Float)
    ends_at: Mapped[float] = mapped_column(Float)
    comment: Mapped[str] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(128))


class OutboxItem(Base):
    """A webhook notification not yet delivered; survives a collector restart."""

    __tablename__ = "alert_outbox"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    body: Mapped[dict[str, object]] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer)
    next_at: Mapped[float] = mapped_column(Float)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class Token(Base):
    """An API token of one project and one scope (``ingest`` or ``read``).

    Only the SHA-256 of the secret is stored (``token_hash``); ``prefix`` is its first
    characters, shown by ``logitwatch token list`` so people can tell tokens apart.
    """

    __tablename__ = "tokens"
    __table_args__ = (
        UniqueConstraint("token_hash"),
        CheckConstraint("scope IN ('ingest', 'read')", name="scope"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(128))
    scope: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128))
    token_hash: Mapped[str] = mapped_column(String(64))
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
