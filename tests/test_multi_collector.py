"""Several collectors on one database: two real uvicorn servers, clients that resend the
same batches to either of them at once; then a real database outage (PostgreSQL refuses
connections) answered 503 with Retry-After, and recovery."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from logitwatch.demo.runner import Collector
from logitwatch.server.db.models import Frame, Metric, Point, Run
from logitwatch.server.db.session import make_engine

RANKS, FRAMES, BATCH = 3, 60, 10
L, H = 2, 4


def matrix(rank: int, seq: int) -> list[list[float]]:
    return [[rank * 1000 + seq + 0.25 * (li * H + hi) for hi in range(H)] for li in range(L)]


def frames_of(rank: int) -> list[dict[str, Any]]:
    return [{"run": "shared", "rank": rank, "seq": seq, "step": seq * 10, "time": 1000.0 + seq,
             "scalars": {"loss": rank + seq / 100}, "heads": {"attn.logit_p99": matrix(rank, seq)}}
            for seq in range(FRAMES)]


def send(urls: list[str], batches: list[list[dict[str, Any]]], seed: int,
         log: list[tuple[int, int]], errors: list[str]) -> None:
    """Send every batch to a random collector, in a random order, resending on 503/409 or
    a dropped connection, as the client's spool does."""
    rng = random.Random(seed)
    order = list(range(len(batches)))
    rng.shuffle(order)
    with httpx.Client(timeout=30) as c:
        for i in order:
            for _attempt in range(50):
                try:
                    r = c.post(rng.choice(urls) + "/api/v1/ingest", json={"frames": batches[i]})
                except httpx.HTTPError:
                    time.sleep(0.05)
                    continue
                if r.status_code in (409, 503):
                    time.sleep(0.05)
                    continue
                if r.status_code != 200:
                    errors.append(f"{r.status_code}: {r.text[:300]}")
                    return
                log.append((r.json()["accepted"], r.json()["duplicates"]))
                break
            else:
                errors.append(f"batch {i} never stored")


def test_two_collectors_no_lost_writes_no_duplicate_frames(db_url: str) -> None:
    batches = [fr[i:i + BATCH] for rank in range(RANKS)
               for fr in [frames_of(rank)] for i in range(0, FRAMES, BATCH)]
    with Collector(db_url) as a, Collector(db_url) as b:
        log: list[tuple[int, int]] = []
        errors: list[str] = []
        clients = [threading.Thread(target=send, args=([a.url, b.url], batches, seed, log,
                                                        errors)) for seed in range(4)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(120)
        assert not errors, errors
        # Every batch was answered 200 four times; each frame accepted exactly once.
        assert len(log) == 4 * len(batches)
        assert sum(acc for acc, _ in log) == RANKS * FRAMES
        assert sum(acc + dup for acc, dup in log) == 4 * RANKS * FRAMES
        runs = httpx.get(a.url + "/api/v1/runs").json()
        assert [(r["name"], r["last_step"]) for r in runs] == [("shared", (FRAMES - 1) * 10)]
        rid = runs[0]["id"]
        for rank in range(RANKS):
            s = httpx.get(f"{b.url}/api/v1/runs/{rid}/series",
                          params={"name": "loss", "rank": rank}).json()
            assert s["steps"] == [i * 10 for i in range(FRAMES)]
            assert s["values"] == pytest.approx([rank + i / 100 for i in range(FRAMES)])
            h = httpx.get(f"{a.url}/api/v1/runs/{rid}/heatmap",
                          params={"name": "attn.logit_p99", "rank": rank, "step": 370}).json()
            assert h["step"] == 370 and h["values"] == matrix(rank, 37)
    engine = make_engine(db_url)
    try:
        with engine.connect() as c:
            def n(t: Any) -> int:
                return int(c.execute(select(func.count()).select_from(t)).scalar_one())

            # metrics: loss, attn.logit_p99 and its envelope rollup; a row of each per frame
            assert (n(Run), n(Metric), n(Frame), n(Point)) == (
                1, 3, RANKS * FRAMES, 3 * RANKS * FRAMES)
    finally:
        engine.dispose()


@pytest.fixture
def pg_url(db_url: str) -> Iterator[str]:
    if not db_url.startswith("postgresql"):
        pytest.skip("an outage of a database server: PostgreSQL only")
    yield db_url


def test_database_outage_answers_503_then_recovers(pg_url: str) -> None:
    name = make_url(pg_url).database
    admin = create_engine(make_url(pg_url).set(database="postgres"),
                          isolation_level="AUTOCOMMIT")

    def allow(on: bool) -> None:
        with admin.connect() as c:
            c.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(on).lower()}'))
            if not on:
                c.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": name})

    try:
        with Collector(pg_url, auth_cache_seconds=0) as col:
            first = frames_of(0)[:5]
            assert httpx.post(col.url + "/api/v1/ingest", json={"frames": first}).json()[
                "accepted"] == 5
            allow(False)
            later = frames_of(0)[5:10]
            r = httpx.post(col.url + "/api/v1/ingest", json={"frames": later}, timeout=30)
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "db-unavailable" and int(r.headers["Retry-After"]) >= 1
            r = httpx.get(col.url + "/api/v1/runs", timeout=30)
            assert r.status_code == 503 and "Retry-After" in r.headers
            allow(True)
            r = httpx.post(col.url + "/api/v1/ingest", json={"frames": first + later},
                           timeout=30)
            assert r.status_code == 200, r.text
            assert (r.json()["accepted"], r.json()["duplicates"]) == (5, 5)
    finally:
        allow(True)
        admin.dispose()


def test_compose_runs_several_collectors_on_one_postgres() -> None:
    import yaml

    from logitwatch.server.settings import Settings

    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "docker-compose.yml")
                          .read_text())
    collectors = {k: v for k, v in spec["services"].items()
                  if v.get("command", [None])[0] == "logitwatch"}
    assert len(collectors) >= 2, list(spec["services"])
    urls = {v["environment"]["LOGITWATCH_DB_URL"] for v in collectors.values()}
    assert len(urls) == 1 and "@postgres:5432/" in urls.pop()
    # reached through one address: no collector publishes a port, the proxy does
    assert all("ports" not in v for v in collectors.values())
    assert [p.split(":")[0] for p in spec["services"]["proxy"]["ports"]] == ["8000"]
    env = next(iter(collectors.values()))["environment"]
    s = Settings(db_url="sqlite:///x.db", pool_size=int(env["LOGITWATCH_POOL_SIZE"]),
                 pool_max_overflow=int(env["LOGITWATCH_POOL_MAX_OVERFLOW"]))
    # the pools fit PostgreSQL's max_connections with room for the CLI and psql
    assert len(collectors) * (s.pool_size + s.pool_max_overflow) <= 100 - 10
