"""A hostile or unlucky day against the collector's ASGI stack: bodies built to amplify
memory, values out of range, one shape per metric, steps beyond 32 bits, memory that must
shrink, a full disk, an unexpected error (the web side: ``test_hostile_web.py``; a real
collector process and the real client: ``test_hostile_client.py``).

Each test here failed before the fix it guards.
"""

from __future__ import annotations

import gzip
import json
import logging
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from logitwatch.server.app import create_app
from tests.hostile import JSON, frame, runs, settings

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
    try:
        r = app_client.post("/api/v1/ingest", content=body,
                            headers={**JSON, "Content-Encoding": "gzip"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.status_code == 422, r.text[:500]
    out = r.json()
    assert len(r.content) < 8_000, len(r.content)
    assert out["code"] == "invalid-request" and len(out["errors"]) <= 10
    # counted, not listed: at most one error for each frame's scalars and one for its
    # heads, where one per value (330,000) cost seconds to build
    assert len(frames) <= out["error_count"] <= 2 * len(frames), out["error_count"]
    assert "frames.0." in out["message"] and "errors in all" in out["message"]
    assert peak < 60 * 2**20, f"{peak / 2**20:.0f} MB"
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


def test_a_number_of_thousands_of_digits_is_a_json_422(app_client: TestClient) -> None:
    """An integer past Python's 4,300 digits, in a scalar or a history: the parser raised a
    plain ValueError, answered 500 with a traceback in the log."""
    huge = "1" * 5000
    t = frame(0)["time"]
    for body in (
        f'{{"frames": [{{"run": "r", "seq": 0, "step": 0, "time": {t}, '
        f'"scalars": {{"loss": {huge}}}}}]}}',
        f'{{"frames": [{{"run": "r", "seq": 0, "step": 1, "time": {t}, "scalars": {{}}, '
        f'"history": {{"steps": [0], "scalars": {{"loss": [{huge}]}}}}}}]}}',
    ):
        r = app_client.post("/api/v1/ingest", content=body.encode(), headers=JSON)
        assert r.status_code == 422 and "too many digits" in r.json()["message"], r.text
    assert runs(app_client) == []


# --- 2. one shape per metric in a batch ---------------------------------------------------


def test_a_shape_change_inside_one_batch_stores_nothing(db_url: str) -> None:
    with TestClient(create_app(settings(db_url))) as c:
        ok = {**frame(0), "heads": {"attn.logit_max": [[1.0] * 5] * 2}}
        assert c.post("/api/v1/ingest", json={"frames": [ok]}).status_code == 200
        r = c.post("/api/v1/ingest", json={"frames": [
            {**frame(1), "heads": {"attn.logit_max": [[2.0] * 5] * 2}},
            {**frame(2), "heads": {"attn.logit_max": [[3.0] * 2] * 2}}]})
        assert r.status_code == 422 and r.json()["code"] == "shape-mismatch"
        (run,) = runs(c)
        assert run["last_step"] == 0
        for params in ({}, {"agg": "max"}, {"step": 1}):
            h = c.get(f"/api/v1/runs/{run['id']}/heatmap", params=params)
            assert h.status_code == 200 and h.json()["values"] == [[1.0] * 5] * 2
        # a new run whose first batch holds both shapes stores nothing either
        r = c.post("/api/v1/ingest", json={"frames": [
            {**frame(0, run="fresh"), "heads": {"m": [[1.0] * 5] * 2}},
            {**frame(1, run="fresh"), "heads": {"m": [[1.0] * 2] * 2}}]})
        assert r.status_code == 422 and [x["name"] for x in runs(c)] == ["r1"]


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


# --- 8. memory that shrinks: the alert engine forgets idle ranks, /runs pages -------------


def _episode(run: str, seq: int) -> dict[str, Any]:
    """A run whose head (1, 2) climbs after seq 30 and whose loss goes NaN at seq 70,
    stamped with the clock's time: the collector's no-data checker (every 30 s) would call
    a run stamped in 1970 stopped, so a slow machine got other alerts than a fast one."""
    m = [[5.0 + 0.1 * h for h in range(4)] for _ in range(2)]
    if seq >= 30:
        m[1][2] = 5.0 * 1.15 ** (seq - 29)
    loss: Any = 3.0 - 0.001 * seq if seq < 70 else "NaN"
    return {"run": run, "seq": seq, "step": seq * 10, "time": time.time(),
            "scalars": {"loss": loss, "grad.norm": 1.0}, "heads": {"attn.logit_max": m}}


def _alerts(c: TestClient) -> list[tuple[Any, ...]]:
    out = []
    for r in runs(c):
        for a in c.get(f"/api/v1/runs/{r['id']}/alerts").json():
            out.append((r["name"], a["rule"], a["rank"], a["layer"], a["head"], a["state"],
                        a["severity"], a["started_step"], a["fired_step"], a["resolved_step"]))
    return sorted(out, key=repr)


def test_alert_state_evicted_then_resumed_fires_the_same(tmp_path: Path) -> None:
    got = []
    for max_ranks in (10_000, 0):  # never evicted; evicted after every batch
        s = settings(f"sqlite:///{tmp_path / f'evict{max_ranks}.db'}",
                     alert_state_max_ranks=max_ranks)
        with TestClient(create_app(s)) as c:
            for start in range(0, 100, 5):  # three runs interleaved, five frames a batch
                for run in ("a", "b", "c"):
                    frames = [_episode(run, i) for i in range(start, start + 5)]
                    r = c.post("/api/v1/ingest", json={"frames": frames})
                    assert r.status_code == 200, r.text
            engine = c.app.state.alert_engine  # type: ignore[attr-defined]
            if max_ranks == 0:
                assert not engine._loaded and not engine._seen
            got.append(_alerts(c))
    assert got[0] and {a[1] for a in got[0]} >= {"loss_nonfinite"}
    assert got[1] == got[0]


def test_alert_state_is_bounded(sqlite_url: str) -> None:
    with TestClient(create_app(settings(sqlite_url, alert_state_max_ranks=50))) as c:
        for i in range(0, 600, 100):  # 600 one-frame runs
            frames = [{**_episode(f"one-{j}", 40), "seq": 1} for j in range(i, i + 100)]
            assert c.post("/api/v1/ingest", json={"frames": frames}).status_code == 200
        engine = c.app.state.alert_engine  # type: ignore[attr-defined]
        ranks = {k for k in engine._seen}
        assert len(ranks) == 50 and engine._loaded <= ranks
        # every container of per-(run, rank) state holds those 50 ranks only
        for name, value in vars(engine).items():
            if isinstance(value, (dict, set)) and value and name not in ("_broken",):
                if name == "_created":  # by run: the runs of those ranks only
                    assert set(value) <= {run for run, _ in ranks}, name
                    continue
                keys = {k[:2] if name in ("_thin", "_sticky", "_down", "_loss", "_levels",
                                          "_loaded", "_seen", "_saved", "_newest_seq")
                        else k[1:3] for k in value}
                assert keys <= ranks, name
        # and an idle rank is forgotten after idle_seconds
        engine._idle_seconds = 0.0
        assert c.post("/api/v1/ingest", json={"frames": [_episode("last", 1)]}
                      ).status_code == 200
        assert len(engine._seen) <= 1


def test_runs_come_in_pages(sqlite_url: str) -> None:
    with TestClient(create_app(settings(sqlite_url))) as c:
        frames = [{**frame(0, run=f"run-{i:04d}"), "time": 1000.0 + i} for i in range(1200)]
        for part in (frames[:600], frames[600:]):  # at most MAX_REQUEST_RUNS a request
            assert c.post("/api/v1/ingest", json={"frames": part}).status_code == 200
        seen: list[str] = []
        url = "/api/v1/runs"
        while url:
            r = c.get(url)
            assert r.status_code == 200 and int(r.headers["x-total-count"]) == 1200
            assert len(r.json()) <= 500
            seen += [x["name"] for x in r.json()]
            link = r.headers.get("link")
            url = link[1:link.index(">")] if link else ""
        assert seen == [f"run-{i:04d}" for i in reversed(range(1200))]  # newest first, once
        r = c.get("/api/v1/runs", params={"limit": 10, "offset": 1195})
        assert [x["name"] for x in r.json()] == [f"run-{i:04d}" for i in range(4, -1, -1)]
        assert "link" not in r.headers
        r = c.get("/api/v1/runs", params={"name": "run-00", "limit": 5})
        assert r.headers["x-total-count"] == "100" and len(r.json()) == 5
        # the dashboard's list pages the same way, with a sparkline per run of the page
        r = c.get("/api/v1/dashboard/runs", params={"limit": 100})
        assert r.headers["x-total-count"] == "1200" and len(r.json()) == 100
        assert r.json()[0]["name"] == "run-1199" and r.json()[0]["loss_values"] == [3.0]
        r = c.get("/api/v1/dashboard/runs", params={"q": "run-119", "limit": 3, "offset": 2})
        assert r.headers["x-total-count"] == "10"
        assert [x["name"] for x in r.json()] == ["run-1197", "run-1196", "run-1195"]
        assert c.get("/api/v1/runs", params={"limit": 0}).status_code == 422


# --- 11. smaller ones ----------------------------------------------------------------------


def test_a_time_far_ahead_is_refused_not_pinned_active(app_client: TestClient) -> None:
    now = time.time()
    for t in (1e308, now + 2 * 86400):
        r = app_client.post("/api/v1/ingest", json={"frames": [{**frame(0), "time": t}]})
        assert r.status_code == 422 and "frames.0.time" in r.json()["message"], r.text
        assert "ahead of the collector's clock" in r.json()["message"]
    assert runs(app_client) == []
    r = app_client.post("/api/v1/ingest", json={"frames": [{**frame(0), "time": now + 3600}]})
    assert r.status_code == 200  # a clock an hour fast is fine


def test_finite_values_beyond_float32_stay_finite(app_client: TestClient) -> None:
    frames = [frame(0, scalars={"loss": 1e39, "grad.norm": -1e39, "lr": "Infinity"},
                    heads={"attn.logit_max": [[1e39, -1e300], [1.0, "NaN"]]})]
    r = app_client.post("/api/v1/ingest", json={"frames": frames})
    assert r.status_code == 200, r.text
    top = float(np.finfo(np.float32).max)
    read = {name: app_client.get("/api/v1/runs/1/series", params={"name": name}).json()
            ["values"] for name in ("loss", "grad.norm", "lr")}
    assert read == {"loss": [pytest.approx(top)], "grad.norm": [pytest.approx(-top)],
                    "lr": ["Infinity"]}
    h = app_client.get("/api/v1/runs/1/heatmap").json()["values"]
    assert h == [[pytest.approx(top), pytest.approx(-top)], [1.0, "NaN"]]
    alerts = app_client.get("/api/v1/runs/1/alerts").json()
    assert not [a for a in alerts if a["rule"] == "loss_nonfinite"]


def test_a_full_disk_answers_503_and_says_so_in_the_log(sqlite_url: str, caplog) -> None:
    from sqlalchemy import event

    with TestClient(create_app(settings(sqlite_url))) as c:
        assert c.post("/api/v1/ingest", json={"frames": [frame(0)]}).status_code == 200
        engine = c.app.state.db  # type: ignore[attr-defined]

        @event.listens_for(engine, "connect")
        def _full(dbapi_conn: Any, _: Any) -> None:  # the file may not grow: a full disk
            cur = dbapi_conn.cursor()
            pages = cur.execute("PRAGMA page_count").fetchone()[0]
            cur.execute(f"PRAGMA max_page_count = {pages}")
            cur.close()

        engine.dispose()
        big = [{**frame(i), "heads": {"attn.logit_max": [[float(i)] * 64] * 64}}
               for i in range(1, 40)]
        with caplog.at_level(logging.WARNING, logger="logitwatch.server"):
            r = c.post("/api/v1/ingest", json={"frames": big})
        assert r.status_code == 503 and r.json()["code"] == "db-unavailable", r.text
        assert "full" in caplog.text and "503" in caplog.text


def test_api_docs_load_nothing_from_elsewhere(app_client: TestClient) -> None:
    import re

    page = app_client.get("/docs")
    assert page.status_code == 200 and "/openapi.json" in page.text
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all(s.startswith("/") or s.startswith("data:") for s in sources)
    script = app_client.get("/static/js/docs.js")
    assert script.status_code == 200 and "http" not in script.text.replace("https://", "")
    assert "cdn" not in (page.text + script.text).lower()
    assert app_client.get("/redoc").status_code == 404
    assert app_client.get("/openapi.json").json()["paths"]["/api/v1/ingest"]


def test_an_unexpected_error_is_a_logged_json_500(app_client: TestClient, monkeypatch,
                                                 caplog) -> None:
    from logitwatch.server.store import lifecycle

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(lifecycle, "ingest", broken)
    with caplog.at_level(logging.ERROR, logger="logitwatch.server"):
        r = app_client.post("/api/v1/ingest", json={"frames": [frame(0)]})
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert r.json()["code"] == "internal-error" and "a bug" not in r.text
    assert "POST /api/v1/ingest failed" in caplog.text and "a bug" in caplog.text
