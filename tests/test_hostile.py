"""A hostile or unlucky day against the real collector (its ASGI stack, or a real uvicorn
process on loopback) and the real client: bodies built to amplify memory, values out of
range, forged Host and Origin headers, slow connections, poison frames.

Each test here failed before the fix it guards.
"""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from logitwatch.server.app import create_app
from logitwatch.server.settings import Settings

JSON = {"Content-Type": "application/json"}


def settings(db_url: str, **kw: Any) -> Settings:
    return Settings(db_url=db_url, auth_cache_seconds=0, stream_interval=0.05, **kw)


@pytest.fixture
def app_client(sqlite_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings(sqlite_url))) as c:
        yield c


def frame(seq: int, *, run: str = "r1", **kw: Any) -> dict[str, Any]:
    return {"run": run, "seq": seq, "step": seq, "time": 1000.0 + seq,
            "scalars": {"loss": 3.0}, **kw}


def runs(c: TestClient) -> list[dict[str, Any]]:
    r = c.get("/api/v1/runs")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


# --- 1. memory amplification: every bad value must not cost an error ------------------------


@pytest.mark.parametrize("bad", [True, "x", None])
def test_all_invalid_values_cost_one_short_error(app_client: TestClient, bad: Any) -> None:
    # 40 frames x 8 matrices of 16 x 64 invalid values, and 256 invalid scalars each:
    # 330,000 bad values in a 2 MB body (gzip: a few KB). Before, pydantic built one error
    # per value: seconds, hundreds of MB, and an answer of tens of MB.
    m = [[bad] * 64] * 16
    frames = [frame(i, scalars={f"s{j}": bad for j in range(256)},
                    heads={f"m{k}": m for k in range(8)}) for i in range(40)]
    body = gzip.compress(json.dumps({"frames": frames}).encode())
    assert len(body) < 64_000
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        r = app_client.post("/api/v1/ingest", content=body,
                            headers={**JSON, "Content-Encoding": "gzip"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    took = time.perf_counter() - t0
    assert r.status_code == 422, r.text[:500]
    out = r.json()
    assert len(r.content) < 8_000, len(r.content)
    assert out["code"] == "invalid-request" and len(out["errors"]) <= 10
    assert out["error_count"] >= 40  # counted, not listed
    assert "frames.0." in out["message"] and "errors in all" in out["message"]
    assert peak < 60 * 2**20, f"{peak / 2**20:.0f} MB"
    assert took < 10, took
    assert runs(app_client) == []


def test_many_bad_frames_and_fields_answer_small(app_client: TestClient) -> None:
    frames = [{"run": "r", "seq": "x", "step": -1, "time": "t", "rank": True,
               **{f"extra{j}": 1 for j in range(50)}} for _ in range(10_000)]
    r = app_client.post("/api/v1/ingest", json={"frames": frames})
    assert r.status_code == 422 and len(r.content) < 8_000
    assert r.json()["error_count"] == 10_000  # one per frame: the unknown fields
    assert "extra0" in r.json()["message"] and "50 in all" in r.json()["message"]
    r = app_client.post("/api/v1/ingest", json={"frames": [frame(0)],
                                                **{f"k{j}": 1 for j in range(100_000)}})
    assert r.status_code == 422 and len(r.content) < 8_000
    assert r.json()["error_count"] == 1 and "k0" in r.json()["message"]
    assert runs(app_client) == []


def test_deeply_nested_json_is_a_json_422(app_client: TestClient) -> None:
    deep = b'{"frames": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}"
    r = app_client.post("/api/v1/ingest", content=deep, headers=JSON)
    assert r.status_code == 422 and r.headers["content-type"] == "application/json"
    assert "nested" in r.json()["message"] or "frames.0" in r.json()["message"]
    assert runs(app_client) == []


# --- 3. steps beyond 32 bits: every step column holds what the API accepts ---------------


def test_steps_beyond_32_bits_are_stored_and_alert(db_url: str) -> None:
    big = 2**62 - 100  # the API's bound is 2**62
    with TestClient(create_app(settings(db_url))) as c:
        frames = [{"run": "huge", "seq": i, "step": big + i, "time": 1000.0 + i,
                   "scalars": {"loss": 3.0 if i < 40 else "NaN"}} for i in range(60)]
        r = c.post("/api/v1/ingest", json={"frames": frames})
        assert r.status_code == 200, r.text
        (run,) = runs(c)
        assert run["last_step"] == big + 59
        alerts = c.get(f"/api/v1/runs/{run['id']}/alerts").json()
        nonfinite = [a for a in alerts if a["rule"] == "loss_nonfinite"]
        assert nonfinite and nonfinite[0]["fired_step"] >= big + 40
        assert nonfinite[0]["started_step"] >= big + 40
