"""PostgreSQL: ``frames`` and ``points`` partitioned by time, a partition a day (0011).

``frames`` is range-partitioned on its ``time`` and ``points`` on its frame's time (its
``time`` column, PostgreSQL only): ``frames_pYYYYMMDD`` / ``points_pYYYYMMDD`` hold
``[day, day + 86400)`` in UTC, ``frames_default`` / ``points_default`` any other time (a
job whose clock is off, frames replayed from long ago). A missing day partition never
fails a write: its rows land in the default partition.

* :func:`ensure_partitions` creates the partitions of yesterday to :data:`AHEAD_DAYS`
  ahead; the collector calls it at start and every hour (:class:`PartitionWorker`).
  Idempotent and safe with several collectors on one database: each partition is created
  in a short transaction of its own, under an advisory lock, as ``CREATE TABLE IF NOT
  EXISTS ... PARTITION OF``, with a lock timeout so that a long read never queues the
  writers behind it for long (a partition not created now is created on the next pass).
* :func:`drop_partitions` drops the day partitions wholly older than a cutoff (``points``
  first, then ``frames``, detached first: the foreign key from ``points`` requires it) and
  deletes the older rows of the default partitions; retention calls it on PostgreSQL.

Lock order: a partition change locks ``runs``, ``metrics``, ``frames``, ``points`` (the order
ingest takes them, ``store/ingest.py``: the run, its metrics, its frames, their values) before
its DDL (:data:`INGEST_ORDER`). The DDL alone takes them in another order (``DETACH`` and
``DROP`` of a frames partition: ``frames`` then ``runs``, the foreign key's triggers; a points
partition made: ``points`` then ``frames``), and deadlocked with an ingest in between.
``runs`` in ``ACCESS EXCLUSIVE`` mode: an ingest reads it first and writes it later, so any
weaker mode would let one in that then waits on the change's later locks. The change thus
waits for the ingests in flight and the next ones wait for it, a few milliseconds. A change
that still loses a lock (timeout, 55P03; deadlock, 40P01) is skipped, logged, and made on the
next pass.

SQLite has no native partitioning: nothing here applies there (:func:`is_partitioned` is
false), and retention deletes rows (``store/retention.py``).
"""

from __future__ import annotations

import logging
import re
import threading
import time as _time
import weakref
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

__all__ = ["AHEAD_DAYS", "DAY", "Partition", "PartitionWorker", "drop_partitions",
           "ensure_partitions", "include_object", "is_lock_error", "is_partitioned",
           "list_partitions", "partition_name"]

log = logging.getLogger("logitwatch.partitions")

DAY = 86400
#: Day partitions kept ready ahead of today.
AHEAD_DAYS = 7
TABLES = ("frames", "points")
#: Advisory lock key held while creating or dropping partitions ("lwpa").
PARTITION_LOCK = 0x6C77_7061
#: How long a partition change waits for the table's lock before giving up for this pass.
LOCK_TIMEOUT = "5s"
#: The tables a partition change locks before its DDL, in the order ingest locks them.
INGEST_ORDER = ("runs", "metrics", "frames", "points")
#: SQLSTATEs of a lock not had: lock_not_available (the timeout), deadlock_detected.
LOCK_ERRORS = frozenset({"55P03", "40P01"})
PARTITION_RE = re.compile(r"^(frames|points)_(p\d{8}|default)$")
_BOUNDS = re.compile(r"FROM \('?([-0-9.e+]+)'?\) TO \('?([-0-9.e+]+)'?\)")

_partitioned: weakref.WeakKeyDictionary[Engine, bool] = weakref.WeakKeyDictionary()


def partition_name(table: str, day: int) -> str:
    """``frames_p20261211`` for day number ``day`` (days since 1970-01-01, UTC)."""
    return f"{table}_p{_time.strftime('%Y%m%d', _time.gmtime(day * DAY))}"


def _engine(bind: Engine | Connection) -> Engine:
    return bind if isinstance(bind, Engine) else bind.engine


def is_partitioned(bind: Engine | Connection) -> bool:
    """Whether ``frames`` is partitioned here (PostgreSQL after 0011). Cached per engine."""
    engine = _engine(bind)
    if engine.dialect.name != "postgresql":
        return False
    known = _partitioned.get(engine)
    if known is None:
        def probe(conn: Connection) -> bool:
            return bool(conn.execute(text(
                "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table t JOIN pg_class c "
                "ON c.oid = t.partrelid WHERE c.relname = 'frames' "
                "AND c.relnamespace = current_schema()::regnamespace)")).scalar())

        if isinstance(bind, Connection):
            known = probe(bind)
        else:
            with engine.connect() as conn:
                known = probe(conn)
        if known:  # a later migration may partition it: only a yes is final
            _partitioned[engine] = known
    return known


@dataclass(frozen=True, slots=True)
class Partition:
    table: str
    name: str
    lower: float | None  # None: the default partition
    upper: float | None


def list_partitions(conn: Connection, table: str) -> list[Partition]:
    """The partitions of ``table``, by lower bound (the default partition last)."""
    rows = conn.execute(text(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = CAST(:t AS regclass)"),
        {"t": table}).all()
    out = []
    for name, bound in rows:
        m = _BOUNDS.search(bound or "")
        out.append(Partition(table, name, float(m.group(1)), float(m.group(2))) if m
                   else Partition(table, name, None, None))
    return sorted(out, key=lambda p: (p.lower is None, p.lower or 0.0))


def _exists(conn: Connection, name: str) -> bool:
    # pg_class read by a query (this statement's snapshot), not to_regclass (the session's
    # catalog cache, which may not have seen another collector's table yet)
    return bool(conn.execute(text(
        "SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = :n "
        "AND relnamespace = current_schema()::regnamespace)"), {"n": name}).scalar())


def _locked(conn: Connection) -> None:
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PARTITION_LOCK})


def _lock_tables(conn: Connection) -> None:
    """Lock the tables a partition change touches, in ingest's order (module docstring;
    ``LOCK TABLE`` takes them in the order listed). ``ONLY``: the parents; the DDL locks the
    partitions it touches after them, as ingest does."""
    conn.execute(text("LOCK TABLE " + ", ".join(
        f"ONLY {t}" for t in INGEST_ORDER) + " IN ACCESS EXCLUSIVE MODE"))


def _sqlstate(e: DBAPIError) -> str | None:
    return getattr(e.orig, "sqlstate", None)


def is_lock_error(e: BaseException) -> bool:
    """Whether ``e`` is a lock not had (timeout or deadlock): the next pass tries again."""
    return isinstance(e, DBAPIError) and _sqlstate(e) in LOCK_ERRORS


def ensure_partitions(engine: Engine, *, now: float | None = None,
                      ahead_days: int = AHEAD_DAYS) -> list[str]:
    """Create the day partitions of yesterday to ``ahead_days`` ahead that are missing;
    return their names. A no-op off PostgreSQL or before migration 0011."""
    if not is_partitioned(engine):
        return []
    today = int((_time.time() if now is None else now) // DAY)
    created = []
    for day in range(today - 1, today + ahead_days + 1):
        for table in TABLES:
            name = partition_name(table, day)
            try:
                with engine.begin() as conn:
                    if _exists(conn, name):
                        continue
                    _locked(conn)
                    if _exists(conn, name):  # another collector made it meanwhile
                        continue
                    _lock_tables(conn)
                    conn.execute(text(
                        f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {table} "
                        f"FOR VALUES FROM ({day * DAY}) TO ({(day + 1) * DAY})"))
                created.append(name)
            except DBAPIError as e:
                # 23514: the default partition holds rows of that day (they stay there);
                # 55P03, 40P01: a lock not had, the next pass creates it.
                if _sqlstate(e) != "23514" and not is_lock_error(e):
                    raise
                log.info("partition %s not created now: %s", name,
                         str(e.orig).splitlines()[0])
    if created:
        log.info("created partitions %s", ", ".join(created))
    return created


@dataclass(slots=True)
class DropResult:
    partitions: list[str]
    default_frames: int = 0  # rows deleted from frames_default


def drop_partitions(engine: Engine, *, cutoff: float) -> DropResult:
    """Drop the day partitions that end at or before ``cutoff`` (unix seconds), ``points``
    before ``frames``, and delete the rows of the default partitions older than it."""
    out = DropResult([])
    with engine.begin() as conn:
        _locked(conn)
        # Values first: the foreign key cascades, but stating it keeps the order plain.
        conn.execute(text("DELETE FROM points_default WHERE time < :c"), {"c": cutoff})
        out.default_frames = conn.execute(
            text("DELETE FROM frames_default WHERE time < :c"), {"c": cutoff}).rowcount
        parts = {t: [p for p in list_partitions(conn, t)
                     if p.upper is not None and p.upper <= cutoff] for t in TABLES}
    for p in parts["points"]:
        try:
            with engine.begin() as conn:
                _locked(conn)
                if not _exists(conn, p.name):
                    continue
                _lock_tables(conn)
                conn.execute(text(f"DROP TABLE IF EXISTS {p.name}"))
            out.partitions.append(p.name)
        except DBAPIError as e:
            if not is_lock_error(e):
                raise
            log.info("partition %s not dropped now: %s", p.name, str(e.orig).splitlines()[0])
    for p in parts["frames"]:
        try:
            with engine.begin() as conn:
                _locked(conn)
                if not _exists(conn, p.name):
                    continue
                _lock_tables(conn)
                conn.execute(text(f"ALTER TABLE frames DETACH PARTITION {p.name}"))
                conn.execute(text(f"DROP TABLE {p.name}"))
            out.partitions.append(p.name)
        except DBAPIError as e:
            if not is_lock_error(e):
                raise
            log.info("partition %s not dropped now: %s", p.name, str(e.orig).splitlines()[0])
    return out


class PartitionWorker:
    """Calls :func:`ensure_partitions` every ``interval`` seconds in a daemon thread."""

    def __init__(self, engine: Engine, *, interval: float = 3600.0) -> None:
        self.engine, self.interval = engine, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="logitwatch-partitions",
                                        daemon=True)

    def start(self) -> PartitionWorker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                ensure_partitions(self.engine)
            except Exception:  # the database may be down: try again next time
                log.warning("creating partitions ahead failed", exc_info=True)


def include_object(dialect: str) -> Any:
    """An Alembic ``include_object`` hook that leaves out what partitioning adds on
    PostgreSQL and the models do not say (they describe the SQLite schema too): the
    partitions, ``points.time``, and the keys that carry ``time``."""
    def include(obj: Any, name: str | None, type_: str, reflected: bool,
                compare_to: Any) -> bool:
        if dialect != "postgresql":
            return True
        if type_ == "table":
            return not PARTITION_RE.match(name or "")
        table = getattr(getattr(obj, "table", None), "name", "")
        if PARTITION_RE.match(table or ""):
            return False
        if type_ == "column" and table == "points" and name == "time":
            return False
        if type_ == "unique_constraint" and table == "frames":
            return False
        return not (type_ == "foreign_key_constraint" and table == "points"
                    and obj.referred_table.name.startswith("frames"))

    return include
