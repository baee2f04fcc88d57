"""What the hostile-day tests share (``test_hostile_*.py``): collector settings, a frame,
the runs listed, what a client set aside, a database made to fail on one step. Their
fixtures (``app_client``, ``serve``, ``client_for``) live in ``conftest.py``. Not a test
module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import text

from logitwatch.client import Client
from logitwatch.server.db.session import make_engine
from logitwatch.server.settings import Settings

JSON = {"Content-Type": "application/json"}


def settings(db_url: str, **kw: Any) -> Settings:
    return Settings(db_url=db_url, auth_cache_seconds=0, stream_interval=0.05, **kw)


def frame(seq: int, *, run: str = "r1", **kw: Any) -> dict[str, Any]:
    return {"run": run, "seq": seq, "step": seq, "time": 1000.0 + seq,
            "scalars": {"loss": 3.0}, **kw}


def runs(c: TestClient) -> list[dict[str, Any]]:
    r = c.get("/api/v1/runs")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def aside(client: Client, suffix: str) -> list[dict[str, Any]]:
    """The frames a client set aside in its spool directory (``.rejected``, ...)."""
    path = client.spool_path
    assert path is not None
    out = []
    for f in sorted(Path(path).glob(f"*{suffix}")):
        out += [json.loads(line) for line in f.read_bytes().split(b"\n")[1:] if line]
    return out


def poison_trigger(db_url: str, step: int) -> None:
    """Make the collector's database fail on frames of ``step``: on PostgreSQL with the
    error a 32-bit column gave a large step (22003, out of range: a 500), on SQLite with
    an aborting trigger (a constraint error: a 409)."""
    engine = make_engine(db_url)
    try:
        with engine.begin() as c:
            if engine.dialect.name == "postgresql":
                c.execute(text(
                    "CREATE FUNCTION poison() RETURNS trigger AS $$ BEGIN "
                    f"IF NEW.step = {step} THEN RAISE EXCEPTION 'integer out of range' "
                    "USING ERRCODE = '22003'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"))
                c.execute(text("CREATE TRIGGER poison BEFORE INSERT ON frames FOR EACH ROW "
                               "EXECUTE FUNCTION poison()"))
            else:
                c.execute(text(f"CREATE TRIGGER poison BEFORE INSERT ON frames WHEN "
                               f"NEW.step = {step} BEGIN SELECT RAISE(ABORT, 'poison'); END"))
    finally:
        engine.dispose()
