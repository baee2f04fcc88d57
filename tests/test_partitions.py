"""frames and points partitioned by day on PostgreSQL (migration 0011, server/db/partitions.py):
existing rows moved into partitions, ingest and queries on them, partitions made ahead by
several collectors at once, retention dropping whole days. The row-wise drop on SQLite."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError, ProgrammingError

from logitwatch.demo.runner import Collector
from logitwatch.server import app as app_module
from logitwatch.server.app import create_app
from logitwatch.server.db.partitions import (
    DAY,
    drop_partitions,
    ensure_partitions,
    is_partitioned,
    list_partitions,
    partition_name,
)
from logitwatch.server.db.session import alembic_config, make_engine, migrate
from logitwatch.server.settings import Settings
from logitwatch.server.store.retention import RetentionWorker, drop_old_frames
from tests.pg import pg_database

NOW = time.time()
TODAY = int(NOW // DAY)


@pytest.fixture(autouse=True)
def _read_the_clock() -> None:
    """``NOW`` and ``TODAY`` as of each test's start: a suite collected before midnight (UTC)
    and run after it planned yesterday's partitions while the collector made today's."""
    global NOW, TODAY
    NOW = time.time()
    TODAY = int(NOW // DAY)


def _upgrade(engine: Engine, target: str) -> None:
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, target)


def frame(seq: int, t: float, *, rank: int = 0, run: str = "r") -> dict[str, Any]:
    return {"run": run, "rank": rank, "seq": seq, "step": seq * 10, "time": t,
            "scalars": {"loss": 3.0 - seq * 0.01},
            "heads": {"attn.logit_max": [[float(seq + li + hi) for hi in range(3)]
                                         for li in range(2)]}}


def post(c: TestClient, frames: list[dict[str, Any]]) -> Any:
    r = c.post("/api/v1/ingest", json={"frames": frames})
    assert r.status_code == 200, r.text
    return r.json()


def count(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A new PostgreSQL database (skipped without LOGITWATCH_TEST_PG_URL, as elsewhere)."""
    yield from pg_database()


def _engine(url: str) -> Iterator[Engine]:
    e = make_engine(url)
    yield e
    e.dispose()


@pytest.fixture
def pg(pg_url: str) -> Iterator[Engine]:
    yield from _engine(pg_url)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    yield from _engine(db_url)


def test_migration_moves_existing_rows_into_day_partitions(pg_url: str, pg: Engine) -> None:
    _upgrade(pg, "0010")
    times = [NOW - 3 * DAY, NOW - 3 * DAY + 1, NOW, 1000.0]
    with pg.begin() as conn:
        conn.execute(text("INSERT INTO runs (id, project, name, created_at) "
                          "VALUES (1, 'p', 'r', 1.0)"))
        conn.execute(text("INSERT INTO metrics (id, run_id, name, layers, heads) VALUES "
                          "(1, 1, 'loss', 0, 0), (2, 1, 'attn.logit_max', 1, 2)"))
        for i, t in enumerate(times, 1):
            conn.execute(text("INSERT INTO frames (id, run_id, rank, seq, step, time) "
                              "VALUES (:i, 1, 0, :i, :i, :t)"), {"i": i, "t": t})
            conn.execute(text("INSERT INTO points (metric_id, frame_id, data) VALUES "
                              "(1, :i, :a), (2, :i, :b)"),
                         {"i": i, "a": bytes([i] * 4), "b": bytes([i] * 8)})
        conn.execute(text("SELECT setval(pg_get_serial_sequence('frames', 'id'), 4)"))
    migrate(pg)
    assert is_partitioned(pg)
    with pg.connect() as conn:
        got = conn.execute(text("SELECT f.id, f.time, p.metric_id, p.time, p.data FROM frames f "
                                "JOIN points p ON p.frame_id = f.id AND p.time = f.time "
                                "ORDER BY f.id, p.metric_id")).all()
        names = {p.name for p in list_partitions(conn, "frames")}
    assert [(r[0], r[1], r[2], r[3], bytes(r[4])) for r in got] == [
        (i, t, m, t, bytes([i] * (4 * m))) for i, t in enumerate(times, 1) for m in (1, 2)]
    # A partition per day with rows, yesterday to a week ahead, and the default one.
    days = {TODAY - 3, 0, *range(TODAY - 1, TODAY + 8)}
    assert names == {partition_name("frames", d) for d in days} | {"frames_default"}
    assert count(pg, partition_name("frames", TODAY - 3)) == 2
    assert count(pg, partition_name("points", TODAY)) == 2
    assert count(pg, "frames_p19700101") == 1 and count(pg, "frames_default") == 0
    with pg.connect() as conn:  # 0012: the run's time bounds, the reads' pruning
        assert conn.execute(text("SELECT time_min, time_max FROM runs")).one() == (1000.0, NOW)
    with pg.begin() as conn:  # ids go on from the same sequence
        new = conn.execute(text("INSERT INTO frames (run_id, rank, seq, step, time) "
                                "VALUES (1, 0, 99, 99, :t) RETURNING id"), {"t": NOW}).scalar()
    assert new == 5


def test_ingest_and_queries_on_partitions(pg_url: str, pg: Engine) -> None:
    old = (TODAY - 1) * DAY + 100  # yesterday: its partition is made at start
    frames = [frame(i, old + i) for i in range(5)] + [frame(i, NOW - 100 + i)
                                                      for i in range(5, 10)]
    frames.append({**frame(10, NOW - 50), "history": {
        "steps": [91, 92], "scalars": {"loss": [2.5, 2.4]}}})
    with TestClient(create_app(Settings(db_url=pg_url, rate_limit_per_second=0))) as c:
        assert post(c, frames)["accepted"] == 11
        # A resend is stored once, history included; a restarted job's history of the same
        # steps (carried by a frame of another time) keeps the first values.
        assert post(c, frames) == {**post(c, frames), "accepted": 0, "duplicates": 11}
        restarted = {**frame(11, NOW - 10), "history": {"steps": [91, 92, 93],
                                                        "scalars": {"loss": [9.0] * 3}}}
        assert post(c, [restarted])["accepted"] == 1
        loss = c.get("/api/v1/runs/1/series", params={"name": "loss"}).json()
        assert loss["steps"] == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 91, 92, 93, 100, 110]
        assert loss["values"][10:13] == [2.5, pytest.approx(2.4), 9.0]
        one = c.get("/api/v1/runs/1/series",
                    params={"name": "attn.logit_max", "layer": 1, "head": 2}).json()
        assert one["values"] == [float(i + 3) for i in range(12)]
        heat = c.get("/api/v1/runs/1/heatmap", params={"name": "attn.logit_max",
                                                       "agg": "max"}).json()
        assert heat["frames"] == 12 and heat["values"][1][2] == 14.0
        worst = c.get("/api/v1/runs/1/worst_heads", params={"name": "attn.logit_max"})
        assert worst.status_code == 200 and worst.json()["step"] == 110
        assert c.get("/api/v1/runs").json()[0]["last_step"] == 110
        with pg.connect() as conn:  # the run's time bounds, kept by ingest
            assert conn.execute(text("SELECT time_min, time_max FROM runs")).one() == (
                old, NOW - 10)
        # Rows sit in their day's partitions.
        times = [f["time"] for f in frames] + [NOW - 50] * 2 + [NOW - 10] * 2  # + history
        yesterday = sum(int(t // DAY) == TODAY - 1 for t in times)
        assert yesterday >= 5 and count(pg, partition_name("frames", TODAY - 1)) == yesterday
        assert count(pg, partition_name("points", TODAY - 1)) >= 5 * 3
        assert count(pg, "frames_default") == 0
        r = c.delete("/api/v1/runs/1", params={"confirm": "r"})
        assert r.status_code == 200 and r.json()["frames"] == 12 + 3
    assert count(pg, "frames") == 0 and count(pg, "points") == 0


def test_a_frame_resent_with_another_time_is_a_duplicate(db_url: str) -> None:
    """The wire contract deduplicates on (run, rank, seq): a frame sent again with another
    time (a retry re-stamped, a spool pushed after the live send got through) is counted
    as a duplicate on both stores; PostgreSQL's dedup index carries the time, and stored
    the frame twice (the loss series showed step 10 twice)."""
    with TestClient(create_app(Settings(db_url=db_url, rate_limit_per_second=0))) as c:
        assert post(c, [frame(0, NOW - 20), frame(1, NOW - 10)])["accepted"] == 2
        again = post(c, [frame(1, NOW - 5), frame(2, NOW - 4)])
        assert (again["accepted"], again["duplicates"]) == (1, 1)
        loss = c.get("/api/v1/runs/1/series", params={"name": "loss"}).json()
        assert loss["steps"] == [0, 10, 20]


def test_reads_plan_only_the_runs_days(pg_url: str, pg: Engine) -> None:
    """The reads carry the run's time bounds: PostgreSQL plans only the partitions of the
    days the run covers (here yesterday's), not the week ahead nor the default one."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    from logitwatch.server.store.queries import get_heatmap, get_series
    from logitwatch.server.store.views import heads_over_time, worst_heads

    old = (TODAY - 1) * DAY + 100
    with TestClient(create_app(Settings(db_url=pg_url, rate_limit_per_second=0))) as c:
        assert post(c, [frame(i, old + i) for i in range(4)])["accepted"] == 4
    statements: list[tuple[str, Any]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "points" in statement and statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, params))

    event.listen(pg, "before_cursor_execute", seen)
    with Session(pg) as s:
        assert get_series(s, run_id=1, name="loss").total == 4
        assert get_series(s, run_id=1, name="attn.logit_max", layer=1, head=2).total == 4
        assert get_heatmap(s, run_id=1, name="attn.logit_max").step == 30
        assert get_heatmap(s, run_id=1, name="attn.logit_max", agg="max").frames == 4
        assert worst_heads(s, run_id=1, name="attn.logit_max").step == 30
        assert heads_over_time(s, run_id=1, name="attn.logit_max").total == 4
    event.remove(pg, "before_cursor_execute", seen)
    assert len(statements) >= 6
    yesterday = {partition_name(t, TODAY - 1) for t in ("frames", "points")}
    assert_plans_only(pg, statements, yesterday)


def assert_plans_only(pg: Engine, statements: list[tuple[str, Any]], wanted: set[str]) -> None:
    """Each statement's plan (EXPLAIN) reads some partition, and only those of ``wanted``."""
    with pg.connect() as conn:
        for statement, params in statements:
            plan = "\n".join(r[0] for r in conn.exec_driver_sql(
                "EXPLAIN " + statement, params).all())
            scanned = set(re.findall(r"\b(?:frames|points)_(?:p\d{8}|default)\b", plan))
            assert scanned and scanned <= wanted, (statement, plan)


def test_ingests_dedup_lookup_plans_only_the_runs_days(pg_url: str, pg: Engine) -> None:
    """The lookup of the seqs a batch resends carries the run's time bounds: PostgreSQL
    plans only the partitions of the days the run covers, not one per day kept (the
    lookup runs on every batch: 50 ms at 410 partitions against 6 ms at 50). A resend
    with another time is still a duplicate (it lies within the bounds of its first row)."""
    from sqlalchemy import event

    old = (TODAY - 1) * DAY + 100
    statements: list[tuple[str, Any]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT FRAMES.SEQ"):
            statements.append((statement, params))

    with TestClient(create_app(Settings(db_url=pg_url, rate_limit_per_second=0))) as c:
        assert post(c, [frame(i, old + i) for i in range(4)])["accepted"] == 4
        event.listen(c.app.state.db, "before_cursor_execute", seen)
        again = post(c, [frame(3, NOW - 5), frame(4, old + 4)])
        event.remove(c.app.state.db, "before_cursor_execute", seen)
    assert (again["accepted"], again["duplicates"]) == (1, 1)
    assert statements
    assert_plans_only(pg, statements, {partition_name("frames", TODAY - 1)})


def test_no_data_reads_plan_only_the_runs_days(pg_url: str, pg: Engine) -> None:
    """The no-data check's read of a silent run's newest frame, and the reads that tell
    whether a frame after the silence is news, carry the run's time bounds: PostgreSQL
    plans the partitions of the run's days, not one per day kept. They run once when a run
    stops and when it comes back, not per poll, but a stopped run's read should not grow
    with the days the store keeps."""
    from sqlalchemy import event, select

    from logitwatch.server.db.models import Alert
    from logitwatch.server.db.session import session_scope

    old = (TODAY - 1) * DAY + 100
    statements: list[tuple[str, Any]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if re.match(r"\s*SELECT\b.*\bFROM frames\b", statement, re.S | re.I):
            statements.append((statement, params))

    with TestClient(create_app(Settings(db_url=pg_url, rate_limit_per_second=0))) as c:
        assert post(c, [frame(i, old + i) for i in range(4)])["accepted"] == 4
        eng, sessions = c.app.state.alert_engine, c.app.state.sessions
        event.listen(c.app.state.db, "before_cursor_execute", seen)
        with session_scope(sessions) as s:
            fired = eng.check_stale(s, now=time.time() + 3600)
        event.remove(c.app.state.db, "before_cursor_execute", seen)
        assert [(a.rule, a.fired_step) for a in fired] == [("no_data", 30)]
        assert statements  # the newest frame's id
        assert_plans_only(pg, statements, {partition_name("frames", TODAY - 1)})
        statements.clear()
        event.listen(c.app.state.db, "before_cursor_execute", seen)
        post(c, [frame(4, NOW)])  # the job again, today
        event.remove(c.app.state.db, "before_cursor_execute", seen)
        with sessions() as s:
            assert s.scalars(select(Alert.state).where(Alert.rule == "no_data")).all() == [
                "resolved"]
    assert statements
    assert_plans_only(pg, statements, {partition_name("frames", d) for d in (TODAY - 1, TODAY)})


def test_two_collectors_create_partitions_at_once(pg_url: str) -> None:
    engines = [make_engine(pg_url) for _ in range(4)]
    try:
        migrate(engines[0])
        errors: list[BaseException] = []
        made: list[list[str]] = []
        start = threading.Barrier(len(engines))

        def create(e: Engine, day: int) -> None:
            try:
                start.wait(10)
                made.append(ensure_partitions(e, now=day * DAY, ahead_days=5))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        for day in (TODAY + 30, TODAY + 60):
            threads = [threading.Thread(target=create, args=(e, day)) for e in engines]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        assert not errors, errors
        names = [n for m in made for n in m]
        want = {partition_name(t, d) for base in (TODAY + 30, TODAY + 60)
                for d in range(base - 1, base + 6) for t in ("frames", "points")}
        assert sorted(names) == sorted(want)  # each made once, by one of them
        with engines[0].connect() as conn:
            have = {p.name for t in ("frames", "points") for p in list_partitions(conn, t)}
        assert want <= have
        assert ensure_partitions(engines[1], now=(TODAY + 30) * DAY, ahead_days=5) == []
    finally:
        for e in engines:
            e.dispose()


def test_two_real_collectors_start_at_once_and_share_todays_partition(pg_url: str,
                                                                      pg: Engine) -> None:
    """Two uvicorn collectors starting together on a new database: one migrates, both make
    partitions ahead at start; frames sent to either land once in today's partition."""
    a, b = Collector(pg_url), Collector(pg_url)
    errors: list[BaseException] = []

    def start(c: Collector) -> None:
        try:
            c.__enter__()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(c,)) for c in (a, b)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        t0 = TODAY * DAY + 10  # today, whatever the hour
        batch = [frame(i, t0 + i, rank=r) for r in range(2) for i in range(5)]
        for url in (a.url, b.url, a.url):
            r = httpx.post(f"{url}/api/v1/ingest", json={"frames": batch}, timeout=30)
            assert r.status_code == 200, r.text
        assert count(pg, partition_name("frames", TODAY)) == 10
        assert count(pg, "frames_default") == 0
        with pg.connect() as conn:
            names = {p.name for p in list_partitions(conn, "points")}
        assert {partition_name("points", d) for d in range(TODAY - 1, TODAY + 8)} <= names
    finally:
        for c in (a, b):
            c.__exit__(None, None, None)


def test_retention_drops_whole_day_partitions(pg_url: str, pg: Engine) -> None:
    migrate(pg)
    assert ensure_partitions(pg, now=NOW - 10 * DAY, ahead_days=0)
    frames = ([frame(i, NOW - 10 * DAY + i) for i in range(4)] + [frame(4, 1000.0)]
              + [frame(i, NOW - 60 + i) for i in range(5, 8)])
    with TestClient(create_app(Settings(db_url=pg_url, rate_limit_per_second=0))) as c:
        post(c, frames)
        worker = RetentionWorker(c.app.state.sessions, older_than=None, bucket_steps=100,
                                 interval=3600, drop_older_than=5 * DAY)
        worker.run_once()
        with pg.connect() as conn:
            names = {p.name for t in ("frames", "points") for p in list_partitions(conn, t)}
        for t in ("frames", "points"):  # days 11 and 10 ago gone, today's and the rest kept
            assert partition_name(t, TODAY - 10) not in names
            assert partition_name(t, TODAY - 11) not in names
            assert {partition_name(t, TODAY), f"{t}_default"} <= names
        loss = c.get("/api/v1/runs/1/series", params={"name": "loss"}).json()
        assert loss["steps"] == [50, 60, 70]
        assert count(pg, "frames") == 3 and count(pg, "points") == 9
        again = drop_partitions(pg, cutoff=NOW - 5 * DAY)  # idempotent
        assert again.partitions == [] and again.default_frames == 0


def test_drop_old_frames_deletes_rows_off_partitions(db_url: str, engine: Engine) -> None:
    """SQLite (rows) and PostgreSQL (partitions) alike: old frames go with their values."""
    frames = [frame(i, NOW - 10 * DAY + i) for i in range(4)] + [frame(i, NOW - 60 + i)
                                                                 for i in range(4, 7)]
    with TestClient(create_app(Settings(db_url=db_url, rate_limit_per_second=0))) as c:
        post(c, frames)
        post(c, [frame(0, NOW - 9 * DAY, run="other")])
        out = drop_old_frames(engine, older_than=5 * DAY)
        if db_url.startswith("sqlite"):
            assert out.frames_deleted == 5 and not out.partitions
        else:  # the days were not made ahead: those frames sat in the default partition
            assert out.frames_deleted == 5
        assert drop_old_frames(engine, older_than=5 * DAY).frames_deleted == 0
        loss = c.get("/api/v1/runs/1/series", params={"name": "loss"}).json()
        assert loss["steps"] == [40, 50, 60]
        assert count(engine, "frames") == 3 and count(engine, "points") == 3 * 3


def test_partition_changes_never_deadlock_with_ingest(pg_url: str, pg: Engine) -> None:
    """Creating and dropping partitions while ingest runs: ingest locks runs, metrics,
    frames, points in that order; a partition change that took ``frames`` or ``points``
    first and then ``runs`` (the drop of a frames partition: its foreign key) or ``frames``
    (the creation of a points partition) deadlocked with it: the ingest answered 503 or the
    retention pass failed with 40P01. Every change is done, every frame stored, no error."""
    rounds, batch, old = 3, 20, TODAY - 20
    errors: list[str] = []
    stored = [0, 0]  # frames accepted, batches answered
    stop, started = threading.Event(), threading.Event()

    with TestClient(create_app(Settings(db_url=pg_url, rate_limit_per_second=0))) as c:

        def ingest() -> None:
            try:
                for k in range(5000):  # bounded; stopped when the changes are done
                    if stop.is_set():
                        return
                    t0 = TODAY * DAY + 1 + k * batch * 1e-3  # today's partition
                    # Two runs a batch, one of them new: runs and metrics inserted too.
                    frames = ([frame(k * batch + i, t0 + i * 1e-3, rank=i % 2, run="a")
                               for i in range(batch - 4)]
                              + [frame(i, t0 + i * 1e-3, run=f"n{k}") for i in range(4)])
                    r = c.post("/api/v1/ingest", json={"frames": frames})
                    if r.status_code != 200:
                        errors.append(f"ingest {k}: {r.status_code} {r.text[:300]}")
                    else:
                        stored[0] += r.json()["accepted"]
                    stored[1] += 1
                    started.set()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(f"ingest: {exc!r}")
            finally:
                started.set()

        def ingested(since: int) -> None:
            """Wait (bounded) until ingest answered a batch after ``since``."""
            for _ in range(3000):
                if stored[1] > since or not writer.is_alive():
                    return
                time.sleep(0.01)

        writer = threading.Thread(target=ingest)
        writer.start()
        made: list[str] = []
        dropped: list[str] = []
        try:
            assert started.wait(60)
            for r in range(rounds):
                for what in ("create old", "drop", "create ahead"):
                    ingested(stored[1])  # ingest is running while each change is made
                    try:
                        if what == "create old":
                            made += ensure_partitions(pg, now=old * DAY, ahead_days=1)
                        elif what == "drop":
                            dropped += drop_partitions(pg, cutoff=(TODAY - 5) * DAY).partitions
                        else:
                            made += ensure_partitions(pg, now=(TODAY + 30 + 10 * r) * DAY,
                                                      ahead_days=8)
                    except Exception as exc:  # noqa: BLE001 - reported below
                        errors.append(f"round {r} {what}: {str(exc).splitlines()[0]}")
        finally:
            stop.set()
            writer.join(120)
        assert not writer.is_alive()
        assert not errors, (len(errors), errors)
        olds = {partition_name(t, d) for d in range(old - 1, old + 2) for t in ("frames", "points")}
        # Every change done (none skipped as busy): the old days made and dropped each round,
        # ten days made ahead each round.
        assert sorted(dropped) == sorted([*olds] * rounds)
        assert sorted(made) == sorted([*olds] * rounds + [
            partition_name(t, d) for r in range(rounds)
            for d in range(TODAY + 29 + 10 * r, TODAY + 39 + 10 * r) for t in ("frames", "points")])
        assert stored[1] >= 3 * rounds
        assert count(pg, "frames") == stored[0] == stored[1] * batch
        assert count(pg, "points") == stored[0] * 3  # loss, the matrix, its envelope


class _PgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"error {sqlstate}")
        self.sqlstate = sqlstate


def test_a_lock_not_had_at_start_never_fails_the_collector(
        pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The partitions made at start lose a lock (another collector's ingest or partition
    change): the collector starts all the same, its PartitionWorker makes them later. Any
    other error still fails the start."""
    def refused(engine: Engine) -> list[str]:
        raise OperationalError("CREATE TABLE frames_p...", {}, _PgError("40P01"))

    monkeypatch.setattr(app_module, "ensure_partitions", refused)
    with TestClient(create_app(Settings(db_url=pg_url, rate_limit_per_second=0))) as c:
        assert post(c, [frame(0, NOW)])["accepted"] == 1
    assert "partitions not made ahead at start" in caplog.text

    def denied(engine: Engine) -> list[str]:
        engine.dispose()  # the failed start leaves it to the test
        raise ProgrammingError("CREATE TABLE frames_p...", {}, _PgError("42501"))

    monkeypatch.setattr(app_module, "ensure_partitions", denied)
    with pytest.raises(ProgrammingError), TestClient(create_app(Settings(db_url=pg_url))):
        pass
