"""The store: fast ingest parsing, run/series/heatmap queries, deleting runs, retention,
migration 0003 with data in it, and 503 under pool exhaustion. SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np
import pytest
from alembic import command
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, inspect, select, text, update
from sqlalchemy.orm import sessionmaker

from logitwatch.cli import main as cli
from logitwatch.server.app import create_app
from logitwatch.server.db.models import Frame, Point, Run
from logitwatch.server.db.session import alembic_config, make_engine, migrate, session_scope
from logitwatch.server.settings import Settings
from logitwatch.server.store.parse import parse_ingest
from logitwatch.server.store.retention import RetentionWorker, thin_old_frames
from logitwatch.server.store.tokens import create_token

NOW = time.time()


def _upgrade(engine: Engine, target: str) -> None:
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, target)


def _downgrade(engine: Engine, target: str) -> None:
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, target)


def frame(seq: int, *, run: str = "r1", rank: int = 0, t: float | None = None,
          heads: Any = None, **scalars: Any) -> dict[str, Any]:
    return {"run": run, "rank": rank, "seq": seq, "step": seq * 10,
            "time": NOW + seq if t is None else t,
            "scalars": scalars or {"loss": 3.0 - seq * 0.01}, "heads": heads or {}}


def mat(seq: int, rank: int = 0, layers: int = 2, heads: int = 3) -> list[list[float]]:
    return [[float(100 * rank + 10 * li + hi + seq * 0.5) for hi in range(heads)]
            for li in range(layers)]


def post(c: TestClient, frames: list[dict[str, Any]], **kw: Any) -> Any:
    r = c.post("/api/v1/ingest", json={"frames": frames}, **kw)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(db_url=db_url, rate_limit_per_second=0))) as c:
        yield c


def count(db_url: str, table: Any) -> int:
    engine = make_engine(db_url)
    try:
        with engine.connect() as c:
            return int(c.execute(select(func.count()).select_from(table)).scalar_one())
    finally:
        engine.dispose()


# --- parsing: the fast path accepts exactly what the model accepts ------------------------


def test_fast_parse_matches_the_model() -> None:
    body = {"frames": [
        {**frame(0, heads={"m": [[1, 2.5], [3.0, -4]]}), "project": "p"},
        frame(1, heads={"m": [[1.0, "Infinity"], ["NaN", "-Infinity"]]}, loss="NaN"),
    ]}
    got = parse_ingest(json.dumps(body).encode(), "application/json; charset=utf-8")
    assert [f.model_fields_set >= {"run", "seq"} for f in got.frames] == [True, True]
    assert "project" in got.frames[0].model_fields_set
    assert "project" not in got.frames[1].model_fields_set
    m0 = np.asarray(got.frames[0].heads["m"], dtype=float)
    assert m0.tolist() == [[1.0, 2.5], [3.0, -4.0]]
    m1 = np.asarray(got.frames[1].heads["m"], dtype=float)
    assert m1[0, 1] == math.inf and math.isnan(m1[1, 0]) and m1[1, 1] == -math.inf
    assert math.isnan(got.frames[1].scalars["loss"])


@pytest.mark.parametrize(("heads", "field"), [
    ({"m": [[1.0, True]]}, "heads"),           # numpy would read True as 1.0
    ({"m": [[1.0, "1.5"]]}, "heads"),
    ({"m": [[1.0, None]]}, "heads"),
    ({"m": [[[1.0]]]}, "heads"),
    ({"m": [[1.0, 2.0], [1.0]]}, "heads"),
    ({"m": []}, "heads"),
])
def test_fast_parse_refuses_what_the_model_refuses(client: TestClient, db_url: str,
                                                   heads: Any, field: str) -> None:
    r = client.post("/api/v1/ingest", json={"frames": [frame(0), frame(1, heads=heads)]})
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "invalid-request" and field in r.json()["message"]
    assert count(db_url, Frame) == 0


def test_nonfinite_matrix_round_trip(client: TestClient) -> None:
    m = [[1.0, "Infinity"], ["NaN", 2.0]]
    post(client, [frame(0, heads={"attn.logit_max": m})])
    h = client.get("/api/v1/runs/1/heatmap").json()
    assert h["values"] == [[1.0, "Infinity"], ["NaN", 2.0]]


# --- queries -------------------------------------------------------------------------------


def test_runs_by_project_tag_status_time_and_name(client: TestClient, db_url: str) -> None:
    post(client, [frame(0, run="old", t=1000.0), frame(1, run="old", t=2000.0)])
    post(client, [{**frame(0, run="new-a", t=time.time()), "project": "p2"}])
    post(client, [frame(0, run="new-b", t=time.time())])
    engine = make_engine(db_url)
    try:
        with session_scope(sessionmaker(engine)) as s:
            from logitwatch.server.store.queries import set_tags

            set_tags(s, 3, add=["baseline", "qk-norm"])
            assert set_tags(s, 3, remove=["baseline"]) == ["qk-norm"]
            # "old" was received long ago (posted above, it was received just now): `active`
            # reads the collector's clock at receipt, not the times the job stamped
            s.execute(update(Run).where(Run.name == "old").values(seen_at=2000.0))
    finally:
        engine.dispose()

    def names(**params: Any) -> list[str]:
        r = client.get("/api/v1/runs", params=params)
        assert r.status_code == 200, r.text
        return [x["name"] for x in r.json()]

    assert names() == ["new-b", "new-a", "old"]
    assert names(project="p2") == ["new-a"]
    assert names(tag="qk-norm") == ["new-b"] and names(tag="nope") == []
    assert names(status="active") == ["new-b", "new-a"] and names(status="idle") == ["old"]
    assert names(status="alerting") == []
    assert names(since=NOW - 10) == ["new-b", "new-a"]
    assert names(until=NOW - 3600) == []       # first seen by the collector just now
    assert names(since=1500, until=time.time() + 1) == ["new-b", "new-a", "old"]
    assert names(since=2500) == ["new-b", "new-a"]
    assert names(name="new") == ["new-b", "new-a"]
    run = client.get("/api/v1/runs/3").json()
    assert run["tags"] == ["qk-norm"] and run["status"] == "running" and run["active"]
    assert names(status="running") == ["new-b", "new-a", "old"]
    assert names(status="finished") == [] and names(status="diverged") == []
    assert client.get("/api/v1/runs", params={"status": "bogus"}).status_code == 422


def test_a_job_clock_behind_is_active_by_the_collector_clock(client: TestClient) -> None:
    """A job whose clock is 20 minutes behind is `active` while it reports: `seen_at` is
    the collector's clock at receipt; `last_time` stays what the job stamped."""
    stamped = time.time() - 20 * 60
    before = time.time()
    post(client, [frame(0, run="slow-clock", t=stamped)])
    (run,) = client.get("/api/v1/runs", params={"status": "active"}).json()
    assert (run["name"], run["active"], run["last_time"]) == ("slow-clock", True, stamped)
    assert before <= run["seen_at"] <= time.time()
    assert client.get("/api/v1/runs", params={"status": "idle"}).json() == []


def test_series_per_rank_merged_ranges_and_one_head(client: TestClient) -> None:
    frames = []
    for rank in (0, 1, 2):
        frames += [frame(i, rank=rank, heads={"attn.logit_max": mat(i, rank)},
                         loss=float(rank * 10 + i)) for i in range(20)]
    post(client, frames)
    url = "/api/v1/runs/1/series"
    s = client.get(url, params={"name": "loss", "rank": 1}).json()
    assert s["rank"] == 1 and s["values"][:2] == [10.0, 11.0] and s["total"] == 20
    for how, first in (("max", 20.0), ("min", 0.0), ("mean", 10.0)):
        m = client.get(url, params={"name": "loss", "merge": how}).json()
        assert m["rank"] is None and m["merge"] == how and m["total"] == 20
        assert m["values"][0] == pytest.approx(first)
    r = client.get(url, params={"name": "loss", "start": 50, "end": 100}).json()
    assert r["steps"] == [50, 60, 70, 80, 90, 100]
    r = client.get(url, params={"name": "loss", "start_time": NOW + 3, "end_time": NOW + 4.5})
    assert r.json()["steps"] == [30, 40]
    one = client.get(url, params={"name": "attn.logit_max", "rank": 2, "layer": 1,
                                  "head": 2}).json()
    assert one["values"] == [pytest.approx(200 + 12 + i * 0.5) for i in range(20)]
    env = client.get(url, params={"name": "attn.logit_max", "merge": "max"}).json()
    assert env["values"][0] == pytest.approx(212.0)


@pytest.mark.parametrize("chunk", [2_000, 3])
def test_heatmap_over_the_whole_run(client: TestClient, monkeypatch: pytest.MonkeyPatch,
                                    chunk: int) -> None:
    """Reduced a chunk of matrices at a time (3: across four chunks), the same figures."""
    from logitwatch.server.store import queries

    monkeypatch.setattr(queries, "CHUNK_VALUES", chunk * 6)  # matrices of 2 x 3 values
    frames = [frame(i, heads={"attn.logit_max": mat(i)}) for i in range(10)]
    spike = mat(4)
    spike[0][1] = 999.0
    frames[4] = frame(4, heads={"attn.logit_max": spike})
    frames[6] = frame(6, heads={"attn.logit_max": [[1.0, "NaN", 1.0], [1.0, 1.0, 1.0]]})
    post(client, frames)
    h = client.get("/api/v1/runs/1/heatmap", params={"agg": "max"}).json()
    assert h["agg"] == "max" and h["frames"] == 10 and (h["first_step"], h["step"]) == (0, 90)
    assert h["values"][0][1] == 999.0                      # the spike survives
    assert h["values"][1][2] == pytest.approx(12 + 9 * 0.5)
    part = client.get("/api/v1/runs/1/heatmap", params={"agg": "min", "start": 20,
                                                          "end": 30}).json()
    assert part["frames"] == 2 and part["values"][1][0] == pytest.approx(10 + 2 * 0.5)
    mean = client.get("/api/v1/runs/1/heatmap", params={"agg": "mean"}).json()
    assert math.isfinite(mean["values"][0][1])            # NaN left out of the mean
    assert mean["values"][1][2] == pytest.approx(12.85)  # 12 + 0.5 i, and 1.0 at step 60
    latest = client.get("/api/v1/runs/1/heatmap").json()
    assert latest["step"] == 90 and latest["agg"] is None


# --- deleting a run --------------------------------------------------------------------------


def test_delete_run_by_api(client: TestClient, db_url: str) -> None:
    post(client, [frame(i, heads={"attn.logit_max": mat(i)}) for i in range(5)])
    post(client, [frame(i, run="other") for i in range(3)])
    r = client.delete("/api/v1/runs/1", params={"confirm": "other"})
    assert (r.status_code, r.json()["code"]) == (422, "confirm-mismatch")
    assert count(db_url, Frame) == 8
    r = client.delete("/api/v1/runs/1", params={"confirm": "r1"})
    assert r.status_code == 200, r.text
    # 5 loss values, 5 matrices and their 5 envelope rollups
    assert r.json() == {"run_id": 1, "name": "r1", "project": "default", "frames": 5,
                        "points": 15}
    assert client.get("/api/v1/runs/1").json()["code"] == "run-not-found"
    assert client.delete("/api/v1/runs/1", params={"confirm": "r1"}).status_code == 404
    assert [x["name"] for x in client.get("/api/v1/runs").json()] == ["other"]
    assert count(db_url, Frame) == 3 and count(db_url, Point) == 3
    assert [m["name"] for m in client.get("/api/v1/runs/2/metrics").json()] == ["loss"]


def test_delete_needs_an_ingest_token_of_the_project(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    try:
        migrate(engine)
        with session_scope(sessionmaker(engine)) as s:
            ingest = create_token(s, project="a", scope="ingest").secret
            other = create_token(s, project="b", scope="ingest").secret
            read = create_token(s, project="a", scope="read").secret
    finally:
        engine.dispose()
    settings = Settings(db_url=sqlite_url, auth_cache_seconds=0, rate_limit_per_second=0)
    with TestClient(create_app(settings)) as c:
        post(c, [frame(0)], headers={"Authorization": f"Bearer {ingest}"})
        for token, status in ((None, 401), (read, 403), (other, 404)):
            h = {"Authorization": f"Bearer {token}"} if token else {}
            r = c.delete("/api/v1/runs/1", params={"confirm": "r1"}, headers=h)
            assert r.status_code == status, r.text
        r = c.delete("/api/v1/runs/1", params={"confirm": "r1"},
                     headers={"Authorization": f"Bearer {ingest}"})
        assert r.status_code == 200
    assert count(sqlite_url, Run) == 0


def test_cli_runs_list_tag_delete(client: TestClient, db_url: str) -> None:
    post(client, [frame(i) for i in range(3)])
    runner = CliRunner()
    r = runner.invoke(cli, ["runs", "tag", "r1", "lr-sweep", "--db", db_url])
    assert r.exit_code == 0 and "lr-sweep" in r.output, r.output
    r = runner.invoke(cli, ["runs", "list", "--tag", "lr-sweep", "--db", db_url])
    assert r.exit_code == 0 and "r1" in r.output
    r = runner.invoke(cli, ["runs", "delete", "nope", "--yes", "--db", db_url])
    assert r.exit_code != 0 and "no run named 'nope'" in r.output
    r = runner.invoke(cli, ["runs", "delete", "r1", "--db", db_url], input="n\n")
    assert r.exit_code != 0 and count(db_url, Frame) == 3
    r = runner.invoke(cli, ["runs", "delete", "r1", "--yes", "--db", db_url])
    assert r.exit_code == 0 and "3 frames" in r.output, r.output
    assert count(db_url, Run) == 0


def test_cli_digits_name_a_run_too(client: TestClient, db_url: str) -> None:
    """Run names may be all digits: ``runs delete 1`` must not delete run id 1 when a run is
    named "1", nor a run of another project than ``--project``."""
    for run, project in (("exp", "a"), ("1", "a"), ("7", "b")):  # ids 1, 2, 3
        post(client, [{**frame(0, run=run), "project": project}])
    runner = CliRunner()
    r = runner.invoke(cli, ["runs", "delete", "1", "--yes", "--db", db_url])
    assert r.exit_code != 0 and "both the id of run a/exp and the name of run 2" in r.output
    r = runner.invoke(cli, ["runs", "delete", "3", "--project", "a", "--yes", "--db", db_url])
    assert r.exit_code != 0 and "no run with id or named '3' in project 'a'" in r.output
    r = runner.invoke(cli, ["runs", "delete", "7", "--yes", "--db", db_url])
    assert r.exit_code == 0 and "(b/7)" in r.output, r.output
    r = runner.invoke(cli, ["runs", "delete", "2", "--yes", "--db", db_url])
    assert r.exit_code == 0 and "(a/1)" in r.output, r.output
    assert count(db_url, Run) == 1


def test_config_that_is_not_text_or_nests_too_deep_is_refused(client: TestClient) -> None:
    """A config with a lone surrogate (not text: PostgreSQL answered 500, SQLite stored a
    mangled key) or nested 500 deep (a 500 when the answer was serialised) is a 422
    ``bad-config``; nothing is stored."""
    post(client, [frame(0)])
    put = partial(client.put, "/api/v1/runs/1/config",
                  headers={"Content-Type": "application/json"})
    deep = "[" * 500 + "]" * 500
    for body in ('{"a":"\\ud800"}', '{"\\ud800":1}', '{"a":' + deep + "}"):
        r = put(content=body)
        assert r.status_code == 422 and r.json()["code"] == "bad-config", (body[:20], r.text)
    assert client.get("/api/v1/runs").json()[0]["config"] is None
    ok = {"a": {"b": [1, 2, {"c": "\u00e9"}]}}
    assert put(json=ok).status_code == 200
    assert client.get("/api/v1/runs").json()[0]["config"] == ok


def test_cli_run_digits_outside_ascii_are_a_name(client: TestClient, db_url: str) -> None:
    """``runs delete`` / ``tag`` with digits outside ASCII ("²", Arabic-Indic "١") took them
    for an id (a traceback from int("²"); "١" deleted run id 1). They are a name, and no
    run has it."""
    post(client, [frame(0)])
    runner = CliRunner()
    for arg in ("\u00b2", "\u0661"):
        for cmd in (["runs", "delete", arg, "--yes"], ["runs", "tag", arg, "x"]):
            r = runner.invoke(cli, [*cmd, "--db", db_url])
            assert r.exit_code == 1 and f"no run named {arg!r}" in r.output, r.output
    assert count(db_url, Run) == 1


# --- retention -----------------------------------------------------------------------------


def test_retention_keeps_scalars_and_each_buckets_peak(client: TestClient, db_url: str) -> None:
    old = NOW - 40 * 86400
    frames = [frame(i, t=old + i, heads={"attn.logit_max": mat(i)}) for i in range(30)]
    frames[13] = frame(13, t=old + 13, heads={"attn.logit_max": [[5000.0] * 3] * 2})
    frames[27] = frame(27, t=old + 27, heads={"attn.logit_max": [["NaN"] * 3] * 2})
    frames += [frame(i, t=NOW, heads={"attn.logit_max": mat(i)}) for i in range(30, 40)]
    post(client, frames)
    engine = make_engine(db_url)
    try:
        sessions = sessionmaker(engine)
        with session_scope(sessions) as s:
            out = thin_old_frames(s, older_than=30 * 86400, bucket_steps=100)
        # steps 0..290 in buckets of 100 steps: 3 kept of 30; the new 10 untouched
        assert (out.matrices_kept, out.matrices_deleted) == (3, 27)
        assert out.values_deleted == 27 * 6
        with session_scope(sessions) as s:
            again = thin_old_frames(s, older_than=30 * 86400, bucket_steps=100)
        assert (again.matrices_kept, again.matrices_deleted) == (3, 0)  # idempotent
        worker = RetentionWorker(sessions, older_than=30 * 86400, bucket_steps=100,
                                 interval=3600)
        assert worker.run_once().matrices_deleted == 0
    finally:
        engine.dispose()
    loss = client.get("/api/v1/runs/1/series", params={"name": "loss"}).json()
    assert loss["total"] == 40                                  # scalars all kept
    one = client.get("/api/v1/runs/1/series", params={"name": "attn.logit_max", "layer": 1,
                                                       "head": 2}).json()
    assert one["steps"][:3] == [90, 130, 270] and one["values"][1] == 5000.0
    assert one["values"][2] == "NaN" and one["total"] == 13
    env = client.get("/api/v1/runs/1/series", params={"name": "attn.logit_max"}).json()
    assert env["total"] == 40 and 5000.0 in env["values"]   # the rollup stays whole



def test_retention_keeps_entropys_dips_and_commits_as_it_goes(
        client: TestClient, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entropy collapses toward 0: a bucket keeps its lowest matrix, not its highest. The
    deletions are committed in chunks (a writer waits at most one chunk on SQLite)."""
    from logitwatch.server.store import retention

    old = NOW - 40 * 86400
    frames = [frame(i, t=old + i, heads={"attn.entropy": [[2.0 + 0.01 * i] * 3] * 2})
              for i in range(30)]
    frames[13] = frame(13, t=old + 13, heads={"attn.entropy": [[2.0, 2.0, 2.0],
                                                               [2.0, 2.0, 0.01]]})
    post(client, frames)
    assert count(db_url, Point) == 90  # per frame: loss, the matrix, its rollup
    monkeypatch.setattr(retention, "THIN_CHUNK", 4)
    engine = make_engine(db_url)
    try:
        with session_scope(sessionmaker(engine)) as s:
            out = thin_old_frames(s, older_than=30 * 86400, bucket_steps=100)
            assert count(db_url, Point) == 90 - 27  # committed before the scope ends
        assert (out.matrices_kept, out.matrices_deleted) == (3, 27)
    finally:
        engine.dispose()
    one = client.get("/api/v1/runs/1/series", params={"name": "attn.entropy", "layer": 1,
                                                       "head": 2}).json()
    assert one["steps"] == [0, 130, 200] and one["values"][1] == pytest.approx(0.01)

def test_retention_cli(client: TestClient, db_url: str) -> None:
    old = NOW - 10 * 86400
    post(client, [frame(i, t=old, heads={"attn.logit_max": mat(i)}) for i in range(20)])
    r = CliRunner().invoke(cli, ["retention", "--older-than", "5", "--bucket-steps", "50",
                                 "--db", db_url])
    assert r.exit_code == 0, r.output
    assert "16 matrices (96 values) deleted, 4 kept" in r.output


# --- migration 0003 with data in it --------------------------------------------------------


def test_migration_0003_keeps_data_both_ways(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        _upgrade(engine, "0002")
        with engine.begin() as c:
            c.execute(text("INSERT INTO runs (id, project, name, created_at, last_step) "
                           "VALUES (1, 'p', 'kept', 1.0, 10)"))
            c.execute(text("INSERT INTO frames (id, run_id, rank, seq, step, time) "
                           "VALUES (1, 1, 0, 5, 10, 2.0)"))
            c.execute(text("INSERT INTO metrics (id, run_id, name, layers, heads) "
                           "VALUES (1, 1, 'loss', 0, 0)"))
            c.execute(text("INSERT INTO points (metric_id, frame_id, data) VALUES (1, 1, :d)"),
                      {"d": np.float32(2.5).tobytes()})
        _upgrade(engine, "0003")
        assert "run_tags" in inspect(engine).get_table_names()
        assert "ix_frames_run_rank_step" in {i["name"] for i in inspect(engine).get_indexes(
            "frames")}
        with engine.begin() as c:
            c.execute(text("INSERT INTO run_tags (run_id, tag) VALUES (1, 'x')"))
            assert c.execute(text("SELECT data FROM points")).scalar_one() == \
                np.float32(2.5).tobytes()
        _downgrade(engine, "0002")
        assert "run_tags" not in inspect(engine).get_table_names()
        with engine.connect() as c:
            assert c.execute(text("SELECT name, last_step FROM runs")).one() == ("kept", 10)
            assert c.execute(text("SELECT step FROM frames")).scalar_one() == 10
            assert c.execute(text("SELECT count(*) FROM points")).scalar_one() == 1
    finally:
        engine.dispose()


# --- a pool that is all in use answers 503, then recovers -------------------------------------


def test_pool_exhaustion_answers_503_with_retry_after(db_url: str) -> None:
    settings = Settings(db_url=db_url, pool_size=1, pool_max_overflow=0, pool_timeout=0.3,
                        auth_cache_seconds=60, rate_limit_per_second=0)
    app = create_app(settings)
    with TestClient(app) as c:
        post(c, [frame(0)])
        held = app.state.db.connect()            # the only connection, held elsewhere
        try:
            held.execute(text("SELECT 1"))
            r = c.post("/api/v1/ingest", json={"frames": [frame(1)]})
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "db-busy" and int(r.headers["Retry-After"]) >= 1
            r = c.get("/api/v1/runs")
            assert r.status_code == 503 and "Retry-After" in r.headers
        finally:
            held.close()
        assert post(c, [frame(1)])["accepted"] == 1   # the client's resend is stored
        assert c.get("/api/v1/runs").json()[0]["last_step"] == 10
