"""Migrations own the schema: one head, empty -> head without drift, a round trip, data kept."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from logitwatch.server.db.models import Base
from logitwatch.server.db.partitions import include_object
from logitwatch.server.db.session import alembic_config, make_engine, migrate, schema_revision


def _upgrade(engine, target: str = "head") -> None:  # type: ignore[no-untyped-def]
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, target)


def _downgrade(engine, target: str = "base") -> None:  # type: ignore[no-untyped-def]
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, target)


def test_single_head() -> None:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert len(heads) == 1, f"several migration heads {heads}: merge them"


def test_upgrade_matches_models_then_round_trips(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine)
        head = ScriptDirectory.from_config(alembic_config()).get_current_head()
        assert schema_revision(engine) == head
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn, opts={"include_object": include_object(conn.dialect.name)})
            diff = compare_metadata(ctx, Base.metadata)
        assert diff == [], (
            f"models and migrations disagree: {diff}. HOW TO FIX: write a migration "
            "(alembic revision -m '...') that brings the schema to the models."
        )
        _downgrade(engine)
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        _upgrade(engine)
        assert {"runs", "frames", "metrics", "points", "alerts", "tokens"} <= set(
            inspect(engine).get_table_names()
        )
    finally:
        engine.dispose()


def test_seeded_data_survives_migrate(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine)
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO runs (project, name, created_at) VALUES ('p', 'kept', 1.0)"
            ))
        migrate(engine)  # a second start is a no-op and keeps data
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name FROM runs")).scalar_one() == "kept"
    finally:
        engine.dispose()


def test_a_sqlite_downgrade_keeps_the_runs_data(sqlite_url: str) -> None:
    """Downgrades rebuild ``runs`` (a batch operation copies the table and drops the old
    one); on the collector's engine, which enforces foreign keys, the drop cascaded into
    every metric, frame and value of every run. Foreign keys are off while migrating."""
    engine = make_engine(sqlite_url)
    q = ("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM metrics), "
         "(SELECT count(*) FROM frames), (SELECT count(*) FROM points)")
    try:
        migrate(engine)
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO runs (project, name, created_at) "
                              "VALUES ('p', 'r', 1.0)"))
            conn.execute(text("INSERT INTO metrics (run_id, name, layers, heads) "
                              "VALUES (1, 'loss', 0, 0)"))
            conn.execute(text("INSERT INTO frames (run_id, rank, seq, step, time) "
                              "VALUES (1, 0, 0, 3, 1.0)"))
            conn.execute(text("INSERT INTO points (metric_id, frame_id, data) "
                              "VALUES (1, 1, x'0000803f')"))
        for target in ("0012", "0005"):
            _downgrade(engine, target)
            with engine.connect() as conn:
                assert tuple(conn.execute(text(q)).one()) == (1, 1, 1, 1), target
        migrate(engine)
        with engine.connect() as conn:
            assert tuple(conn.execute(text(q)).one()) == (1, 1, 1, 1)
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_refuses_unknown_revision(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    try:
        migrate(engine)
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = 'from_the_future'"))
        with pytest.raises(RuntimeError, match="newer version"):
            migrate(engine)
    finally:
        engine.dispose()


def test_paged_step_filled_in_for_existing_alerts(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        _upgrade(engine, "0004")
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO runs (id, project, name, created_at) VALUES (1, 'p', 'r', 1.0)"))
            for aid, severity, evidence in (
                (1, "warning", "{}"),                                   # fired as warning
                (2, "warning", '{"escalated_step": 370, "downgraded": {}}'),  # escalated
                (3, "info", '{"downgraded": {}}'),                      # never paged
            ):
                conn.execute(text(
                    "INSERT INTO alerts (id, run_id, rule, metric, severity, state, rank, "
                    "started_step, fired_step, fired_at, message, evidence, remedies) VALUES "
                    "(:id, 1, 'x', 'loss', :sev, 'firing', 0, 300, 310, 1.0, 'm', :ev, '[]')"
                ), {"id": aid, "sev": severity, "ev": evidence})
        migrate(engine)
        with engine.connect() as conn:
            got = conn.execute(text("SELECT id, paged_step FROM alerts ORDER BY id")).all()
        assert [tuple(r) for r in got] == [(1, 310), (2, 370), (3, None)]
    finally:
        engine.dispose()


def test_run_lifecycle_filled_in_for_existing_runs(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        _upgrade(engine, "0005")
        with engine.begin() as conn:
            for rid in (1, 2, 3):
                conn.execute(text("INSERT INTO runs (id, project, name, created_at) VALUES "
                                  "(:id, 'p', :name, 1.0)"), {"id": rid, "name": f"r{rid}"})
            for aid, rid, rule, severity, state, step in (
                (1, 1, "loss_jump", "critical", "resolved", 500),    # r1 diverged at 500
                (2, 1, "loss_nonfinite", "critical", "firing", 700),
                (3, 2, "loss_jump", "info", "resolved", 300),        # r2: a bump, recovered
                (4, 3, "no_data", "warning", "firing", 90),          # r3: silent
            ):
                conn.execute(text(
                    "INSERT INTO alerts (id, run_id, rule, metric, severity, state, rank, "
                    "started_step, fired_step, fired_at, message, evidence, remedies) VALUES "
                    "(:id, :rid, :rule, 'loss', :sev, :state, 0, :step, :step, 1.0, 'm', "
                    "'{}', '[]')"
                ), {"id": aid, "rid": rid, "rule": rule, "sev": severity, "state": state,
                    "step": step})
        migrate(engine)
        with engine.connect() as conn:
            got = conn.execute(text(
                "SELECT id, status, diverged_step, ended_at FROM runs ORDER BY id")).all()
        assert [tuple(r) for r in got] == [(1, "running", 500, None), (2, "running", None, None),
                                           (3, "stopped", None, None)]
    finally:
        engine.dispose()


def test_step_columns_widened_with_their_data(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        _upgrade(engine, "0006")
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO runs (id, project, name, created_at, last_step) "
                              "VALUES (1, 'p', 'r', 1.0, 2147483647)"))
            conn.execute(text(
                "INSERT INTO alerts (id, run_id, rule, metric, severity, state, rank, "
                "started_step, fired_step, fired_at, message, evidence, remedies) VALUES "
                "(1, 1, 'x', 'loss', 'warning', 'firing', 0, 7, 8, 1.0, 'm', '{}', '[]')"))
        migrate(engine)
        big = 2**62
        with engine.begin() as conn:
            conn.execute(text("UPDATE runs SET last_step = :s"), {"s": big})
            conn.execute(text("UPDATE alerts SET started_step = :s, fired_step = :s, "
                              "resolved_step = :s"), {"s": big})
            assert tuple(conn.execute(text(
                "SELECT r.last_step, a.started_step, a.fired_step, a.resolved_step "
                "FROM runs r JOIN alerts a ON a.run_id = r.id")).one()) == (big,) * 4
    finally:
        engine.dispose()


def test_seen_at_filled_in_from_last_time(db_url: str) -> None:
    """0013: a run stored before the collector kept its own clock is judged by its last
    frame's time until it sends again."""
    engine = make_engine(db_url)
    try:
        _upgrade(engine, "0012")
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO runs (id, project, name, created_at, last_time) "
                              "VALUES (1, 'p', 'sent', 1.0, 1234.5), "
                              "(2, 'p', 'empty', 1.0, NULL)"))
        migrate(engine)
        with engine.connect() as conn:
            got = conn.execute(text("SELECT id, seen_at FROM runs ORDER BY id")).all()
        assert [tuple(r) for r in got] == [(1, 1234.5), (2, None)]
    finally:
        engine.dispose()
