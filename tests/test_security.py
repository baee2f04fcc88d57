"""Security and bad input: tokens per project and scope, limits, and nothing partial stored.

Every rejection is checked twice: the answer (status, ``code``, the field named in the
message) and the store afterwards (queried back through the API with an open-mode or read
client), so a 4xx can never hide a half-written batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from logitwatch.server.app import create_app
from logitwatch.server.db.models import Frame, Metric, Run
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.limits import BodyLimit
from logitwatch.server.settings import Settings
from logitwatch.server.store.tokens import create_token, hash_token, list_tokens, revoke_token


def frame(seq: int, *, run: str = "r1", project: str | None = None,
          **scalars: Any) -> dict[str, Any]:
    f: dict[str, Any] = {"run": run, "seq": seq, "step": seq * 10, "time": 1000.0 + seq,
                         "scalars": scalars or {"loss": 3.0}}
    if project is not None:
        f["project"] = project
    return f


def mint(db_url: str, project: str, scope: str) -> str:
    """Create a token in the database (as `logitwatch token create` does)."""
    engine = make_engine(db_url)
    try:
        migrate(engine)
        with session_scope(sessionmaker(engine)) as s:
            return create_token(s, project=project, scope=scope).secret
    finally:
        engine.dispose()


def revoke_all(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        with session_scope(sessionmaker(engine)) as s:
            for t in list_tokens(s):
                revoke_token(s, token_id=t.id)
    finally:
        engine.dispose()


def stored(db_url: str) -> tuple[int, int, int]:
    """(runs, frames, metrics) in the database: what a rejected request must not change."""
    engine = make_engine(db_url)
    try:
        with engine.connect() as c:
            return tuple(  # type: ignore[return-value]
                c.execute(select(func.count()).select_from(t)).scalar_one()
                for t in (Run, Frame, Metric)
            )
    finally:
        engine.dispose()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def settings(db_url: str, **kw: Any) -> Settings:
    return Settings(db_url=db_url, auth_cache_seconds=0, stream_interval=0.05, **kw)


@pytest.fixture
def open_client(sqlite_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings(sqlite_url))) as c:
        yield c


# --- authentication and isolation --------------------------------------------------------


def test_open_mode_on_loopback_needs_no_token(open_client: TestClient) -> None:
    assert open_client.post("/api/v1/ingest", json={"frames": [frame(0)]}).status_code == 200
    assert [r["name"] for r in open_client.get("/api/v1/runs").json()] == ["r1"]
    assert open_client.get("/api/v1/session").json() == {
        "mode": "open", "project": None, "scope": "open", "name": ""}


def test_tokens_are_stored_hashed(sqlite_url: str) -> None:
    secret = mint(sqlite_url, "alpha", "read")
    assert secret.startswith("lw_") and len(secret) >= 40
    engine = make_engine(sqlite_url)
    with engine.connect() as c:
        rows = [tuple(r) for r in c.exec_driver_sql("SELECT * FROM tokens").all()]
    engine.dispose()
    assert rows and not any(secret in str(v) for v in rows[0])
    assert hash_token(secret) in rows[0]


def test_projects_are_isolated_on_every_endpoint(db_url: str) -> None:
    ingest_a, read_a = mint(db_url, "alpha", "ingest"), mint(db_url, "alpha", "read")
    ingest_b = mint(db_url, "beta", "ingest")
    with TestClient(create_app(settings(db_url))) as c:
        heads = {"attn.logit_max": [[1.0, 2.0]]}
        for tok, run in ((ingest_a, "a-run"), (ingest_b, "b-run")):
            r = c.post("/api/v1/ingest", headers=bearer(tok),
                       json={"frames": [{**frame(0, run=run), "heads": heads}]})
            assert r.status_code == 200, r.text

        # No token, a wrong scheme, an unknown token: 401 with a code and the header.
        r = c.get("/api/v1/runs")
        assert r.status_code == 401 and r.json()["code"] == "auth-required"
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert c.get("/api/v1/runs", headers={"Authorization": "Basic eDp5"}).json()[
            "code"] == "bad-authorization"
        assert c.get("/api/v1/runs", headers=bearer("lw_nope")).json()["code"] == "invalid-token"

        # A read token sees its project only; the other project's run does not exist for it.
        runs = c.get("/api/v1/runs", headers=bearer(read_a)).json()
        assert [(x["project"], x["name"]) for x in runs] == [("alpha", "a-run")]
        a_id = runs[0]["id"]
        b_id = next(i for i in (1, 2) if i != a_id)
        paths = ["", "/metrics", "/series?name=loss", "/heatmap", "/alerts", "/figures/loss",
                 "/figures/heatmap", "/stream"]
        for p in paths:
            mine = c.get(f"/api/v1/runs/{a_id}{p}", headers=bearer(read_a)) if p != "/stream" \
                else None
            assert mine is None or mine.status_code == 200, (p, mine.text)
            theirs = c.get(f"/api/v1/runs/{b_id}{p}", headers=bearer(read_a))
            assert theirs.status_code == 404, p
            assert theirs.json() == c.get(f"/api/v1/runs/999{p}", headers=bearer(read_a)).json() \
                | {"message": f"no run with id {b_id}"}

        # Scopes: an ingest token cannot read, a read token cannot ingest.
        r = c.get("/api/v1/runs", headers=bearer(ingest_a))
        assert r.status_code == 403 and r.json()["code"] == "scope-forbidden"
        before = stored(db_url)
        r = c.post("/api/v1/ingest", headers=bearer(read_a), json={"frames": [frame(5)]})
        assert r.status_code == 403 and r.json()["code"] == "scope-forbidden"

        # An ingest token writes its own project only; one stray frame refuses the batch.
        r = c.post("/api/v1/ingest", headers=bearer(ingest_a), json={"frames": [
            frame(1, run="a-run", project="alpha"), frame(0, run="sneaky", project="beta")]})
        assert r.status_code == 403 and r.json()["code"] == "project-forbidden"
        assert "frames.1.project" in r.json()["message"]
        assert stored(db_url) == before

        # A frame that names no project belongs to the token's project.
        r = c.post("/api/v1/ingest", headers=bearer(ingest_a), json={"frames": [
            frame(0, run="implicit")]})
        assert r.status_code == 200
        names = {(x["project"], x["name"])
                 for x in c.get("/api/v1/runs", headers=bearer(read_a)).json()}
        assert names == {("alpha", "a-run"), ("alpha", "implicit")}

        # Revoked: refused at once (auth_cache_seconds=0 here). Revoking every token locks
        # the collector; it does not fall back to open mode.
        revoke_all(db_url)
        r = c.get("/api/v1/runs", headers=bearer(read_a))
        assert r.status_code == 401 and r.json()["code"] == "invalid-token"
        assert c.get("/api/v1/runs").status_code == 401


def test_dashboard_session_cookie(sqlite_url: str) -> None:
    read_a, ingest_a = mint(sqlite_url, "alpha", "read"), mint(sqlite_url, "alpha", "ingest")
    mint(sqlite_url, "beta", "read")
    with TestClient(create_app(settings(sqlite_url))) as c:
        c.post("/api/v1/ingest", headers=bearer(ingest_a), json={"frames": [frame(0)]})
        assert c.post("/api/v1/session", json={"token": "lw_wrong"}).status_code == 401
        r = c.post("/api/v1/session", json={"token": ingest_a})
        assert r.status_code == 403 and "read token" in r.json()["message"]
        assert "set-cookie" not in r.headers

        r = c.post("/api/v1/session", json={"token": read_a})
        assert r.status_code == 200 and r.json()["project"] == "alpha"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
        assert read_a.lower() not in r.text.lower()  # never echoed in the body
        # The cookie now authenticates the API (and, in a browser, the EventSource).
        assert [x["name"] for x in c.get("/api/v1/runs").json()] == ["r1"]
        assert c.get("/api/v1/session").json()["scope"] == "read"
        # It is a read session: ingest with the cookie alone is refused.
        assert c.post("/api/v1/ingest", json={"frames": [frame(1)]}).status_code == 403

        assert c.delete("/api/v1/session").status_code == 204
        c.cookies.clear()  # the client keeps expired cookies; a browser drops them
        assert c.get("/api/v1/runs").status_code == 401


def test_revoked_token_ends_the_live_stream(sqlite_url: str) -> None:
    ingest, read = mint(sqlite_url, "alpha", "ingest"), mint(sqlite_url, "alpha", "read")
    with TestClient(create_app(settings(sqlite_url))) as c:
        c.post("/api/v1/ingest", headers=bearer(ingest), json={"frames": [frame(0)]})
        with c.stream("GET", "/api/v1/runs/1/stream", headers=bearer(read)) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = []
            while not (first and first[-1].startswith("data:")):
                first.append(next(lines))
            assert "event: frame" in first
            revoke_all(sqlite_url)
            rest = []
            for line in lines:
                rest.append(line)
                if line.startswith("data:") and "invalid-token" in line:
                    break
        assert "event: end" in rest


def test_non_loopback_bind_without_tokens_is_refused(sqlite_url: str) -> None:
    with pytest.raises(RuntimeError, match="logitwatch token create --project"):
        with TestClient(create_app(settings(sqlite_url, host="0.0.0.0"))):
            pass
    # The escape hatch is explicit and works.
    with TestClient(create_app(settings(sqlite_url, host="0.0.0.0",
                                        insecure_no_auth=True))) as c:
        assert c.get("/api/v1/runs").status_code == 200
    # With require_tokens and no token yet, every request says how to create one.
    with TestClient(create_app(settings(sqlite_url, require_tokens=True))) as c:
        r = c.get("/api/v1/runs")
        assert r.status_code == 401 and "logitwatch token create" in r.json()["message"]
    # With a token it starts, and stays locked when every token is revoked.
    mint(sqlite_url, "alpha", "read")
    revoke_all(sqlite_url)
    with TestClient(create_app(settings(sqlite_url, host="0.0.0.0"))) as c:
        assert c.get("/api/v1/runs").status_code == 401


def test_require_tokens_on_loopback(sqlite_url: str) -> None:
    with TestClient(create_app(settings(sqlite_url, require_tokens=True))) as c:
        assert c.get("/api/v1/runs").status_code == 401
    with pytest.raises(ValidationError, match="require_tokens and insecure_no_auth"):
        Settings(db_url=sqlite_url, require_tokens=True, insecure_no_auth=True)


def test_rate_limit_per_token(sqlite_url: str) -> None:
    a, b = mint(sqlite_url, "alpha", "read"), mint(sqlite_url, "beta", "read")
    s = settings(sqlite_url, rate_limit_per_second=0.01, rate_limit_burst=3)
    with TestClient(create_app(s)) as c:
        assert [c.get("/api/v1/runs", headers=bearer(a)).status_code for _ in range(3)] == [
            200, 200, 200]
        r = c.get("/api/v1/runs", headers=bearer(a))
        assert r.status_code == 429 and r.json()["code"] == "rate-limited"
        assert 90 <= int(r.headers["retry-after"]) <= 100
        assert "rate_limit_per_second" in r.json()["message"]
        assert c.get("/api/v1/runs", headers=bearer(b)).status_code == 200  # per token


# --- limits: each answered clearly, nothing stored ------------------------------------------


def test_request_too_large_by_content_length(sqlite_url: str) -> None:
    with TestClient(create_app(settings(sqlite_url, max_request_bytes=4096))) as c:
        big = {"frames": [frame(i) for i in range(200)]}
        r = c.post("/api/v1/ingest", json=big)
        assert r.status_code == 413 and r.json()["code"] == "request-too-large"
        assert "max_request_bytes" in r.json()["message"]
        assert c.post("/api/v1/ingest", json={"frames": [frame(0)]}).status_code == 200
    assert stored(sqlite_url)[1] == 1


async def _run_asgi(limit: int, chunks: list[bytes], headers: list[tuple[bytes, bytes]]
                    ) -> tuple[list[dict[str, Any]], list[bytes]]:
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        msg = await receive()
        seen.append(msg["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    queue = [{"type": "http.request", "body": ch, "more_body": i < len(chunks) - 1}
             for i, ch in enumerate(chunks)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    async def send(m: dict[str, Any]) -> None:
        sent.append(m)

    scope = {"type": "http", "method": "POST", "path": "/api/v1/ingest", "headers": headers}
    await BodyLimit(app, limit)(scope, receive, send)
    return sent, seen


@pytest.mark.parametrize("declared", [None, b"10"])  # chunked, or a Content-Length that lies
def test_request_too_large_counted_while_reading(declared: bytes | None) -> None:
    import anyio

    headers = [] if declared is None else [(b"content-length", declared)]
    sent, seen = anyio.run(_run_asgi, 2048, [b"x" * 1000] * 5, headers)
    assert sent[0]["status"] == 413 and seen == []  # the app never saw a byte
    assert json.loads(sent[1]["body"])["code"] == "request-too-large"
    sent, seen = anyio.run(_run_asgi, 8192, [b"x" * 1000] * 5, [])
    assert sent[0]["status"] == 200 and seen == [b"x" * 5000]  # whole body, one piece


def test_array_limits(sqlite_url: str) -> None:
    s = settings(sqlite_url, max_frames_per_request=5, max_values_per_matrix=16)
    with TestClient(create_app(s)) as c:
        r = c.post("/api/v1/ingest", json={"frames": [frame(i) for i in range(6)]})
        assert (r.status_code, r.json()["code"]) == (422, "too-many-frames")
        assert "max_frames_per_request" in r.json()["message"]
        big = {**frame(1), "heads": {"attn.logit_max": [[1.0] * 4] * 5}}
        r = c.post("/api/v1/ingest", json={"frames": [frame(0), big]})
        assert (r.status_code, r.json()["code"]) == (422, "matrix-too-large")
        assert r.json()["message"].startswith("frames.1.heads.attn.logit_max:")
        # The schema's hard ceiling, whatever the settings: 10,000 frames.
        r = c.post("/api/v1/ingest", json={"frames": [frame(0)] * 10_001})
        assert r.status_code == 422 and "frames" in r.json()["message"]
    assert stored(sqlite_url) == (0, 0, 0)


def test_metric_cardinality_per_run(db_url: str) -> None:
    with TestClient(create_app(settings(db_url, max_metrics_per_run=3))) as c:
        assert c.post("/api/v1/ingest", json={"frames": [frame(0, a=1.0, b=2.0)]}
                      ).status_code == 200
        before = stored(db_url)
        r = c.post("/api/v1/ingest", json={"frames": [frame(1, a=1.0), frame(2, c=1.0, d=2.0)]})
        assert (r.status_code, r.json()["code"]) == (422, "too-many-metrics")
        assert "max_metrics_per_run" in r.json()["message"]
        assert stored(db_url) == before  # not even frame 1, which was fine on its own
        assert c.get("/api/v1/runs/1").json()["last_step"] == 0
        # Up to the limit is fine; another run has its own budget.
        assert c.post("/api/v1/ingest", json={"frames": [frame(1, a=1.0, c=3.0)]}
                      ).status_code == 200
        assert c.post("/api/v1/ingest", json={"frames": [frame(0, run="r2", x=1.0, y=1.0)]}
                      ).status_code == 200


# --- bad input: a 4xx that names the field, and nothing stored ----------------------------

BAD_BODIES: list[tuple[str, bytes | str, str]] = [
    ("malformed json", b'{"frames": [{"run": "r", ', "body"),
    ("not an object", b"[1, 2, 3]", "body"),
    ("empty body", b"", "body"),
    ("no frames", b'{"frames": []}', "frames"),
    ("frames not a list", b'{"frames": {"run": "r"}}', "frames"),
    ("NaN time", b'{"frames": [{"run": "r", "seq": 0, "step": 0, "time": NaN}]}', "time"),
    ("Infinity time", b'{"frames": [{"run": "r", "seq": 0, "step": 0, "time": Infinity}]}',
     "time"),
    ("NaN string step", b'{"frames": [{"run": "r", "seq": 0, "step": "NaN", "time": 1}]}',
     "step"),
    ("float seq", b'{"frames": [{"run": "r", "seq": 0.5, "step": 0, "time": 1}]}', "seq"),
    ("huge step", b'{"frames": [{"run": "r", "seq": 0, "step": 1e300, "time": 1}]}', "step"),
    ("negative rank", b'{"frames": [{"run": "r", "rank": -1, "seq": 0, "step": 0, "time": 1}]}',
     "rank"),
    ("script in run", json.dumps({"frames": [{"run": "<script>alert(1)</script>", "seq": 0,
                                              "step": 0, "time": 1}]}), "run"),
    ("quote in project", json.dumps({"frames": [{"run": "r", "project": '"><img src=x>',
                                                 "seq": 0, "step": 0, "time": 1}]}), "project"),
    ("space in metric", json.dumps({"frames": [{"run": "r", "seq": 0, "step": 0, "time": 1,
                                                "scalars": {"my loss": 1.0}}]}), "my loss"),
    ("newline in metric", json.dumps({"frames": [{"run": "r", "seq": 0, "step": 0, "time": 1,
                                                  "heads": {"a\nb": [[1.0]]}}]}), "heads"),
    ("long run name", json.dumps({"frames": [{"run": "r" * 129, "seq": 0, "step": 0,
                                              "time": 1}]}), "run"),
    ("ragged matrix", json.dumps({"frames": [{"run": "r", "seq": 0, "step": 0, "time": 1,
                                              "heads": {"m": [[1.0, 2.0], [1.0]]}}]}), "heads"),
    ("string value", json.dumps({"frames": [{"run": "r", "seq": 0, "step": 0, "time": 1,
                                             "scalars": {"loss": "nan"}}]}), "loss"),
]


@pytest.mark.parametrize(("what", "body", "field"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_input_names_the_field_and_stores_nothing(
    open_client: TestClient, sqlite_url: str, what: str, body: bytes | str, field: str
) -> None:
    good = json.dumps({"frames": [frame(0, run="kept")]})
    assert open_client.post("/api/v1/ingest", content=good,
                            headers={"Content-Type": "application/json"}).status_code == 200
    before = stored(sqlite_url)
    r = open_client.post("/api/v1/ingest", content=body,
                         headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, (what, r.status_code)
    out = r.json()
    assert set(out) >= {"code", "message"} and field in out["message"], out
    assert stored(sqlite_url) == before


def test_other_bad_requests_answer_code_and_message(open_client: TestClient) -> None:
    r = open_client.post("/api/v1/ingest", content=b'{"frames": []}',
                         headers={"Content-Type": "text/plain"})
    assert r.status_code == 422 and r.json()["code"] == "invalid-request"
    assert open_client.get("/api/v1/runs/999").json()["code"] == "run-not-found"
    r = open_client.get("/api/v1/runs/abc")  # a run name (docs/ARCHITECTURE.md)
    assert r.status_code == 404 and r.json()["code"] == "run-not-found"
    r = open_client.get("/api/v1/runs/a%20b")  # not a run name
    assert r.status_code == 422 and "run_id" in r.json()["message"]
    r = open_client.get("/api/v1/runs/99999999999999999999")
    assert r.status_code == 422 and "run_id" in r.json()["message"]
    r = open_client.get("/api/v1/nowhere")
    assert r.status_code == 404 and r.json()["code"] == "not-found"
    r = open_client.delete("/api/v1/runs")
    assert r.status_code == 405 and r.json()["code"] == "method-not-allowed"
    r = open_client.get("/api/v1/runs/1/series", params={"name": "loss", "start": 2**70})
    assert r.status_code == 422 and "start" in r.json()["message"]


def test_the_live_stream_sends_an_alert_again_when_what_it_shows_changes(
        sqlite_url: str) -> None:
    """An alert acknowledged (or escalated from info) stays ``firing``: the stream sent an
    alert again only when its state changed, so an open dashboard kept the old card."""
    ingest, read = mint(sqlite_url, "alpha", "ingest"), mint(sqlite_url, "alpha", "read")
    nan = {**frame(1), "scalars": {"loss": "NaN"}}
    with TestClient(create_app(settings(sqlite_url))) as c:
        c.post("/api/v1/ingest", headers=bearer(ingest), json={"frames": [frame(0), nan]})
        with c.stream("GET", "/api/v1/runs/1/stream", headers=bearer(read)) as r:
            events, event, polls = [], None, 0
            for line in r.iter_lines():
                if line.startswith("event:"):
                    event = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and event == "alert":
                    events.append(json.loads(line[5:]))
                    if len(events) > 1:
                        break
                    assert events[0]["state"] == "firing" and not events[0]["acked_at"]
                    ack = c.post(f"/api/v1/alerts/{events[0]['id']}/ack",
                                 headers=bearer(ingest))
                    assert ack.status_code == 200, ack.text
                    polls = 1
                    c.post("/api/v1/ingest", headers=bearer(ingest), json={"frames": [
                        {**frame(2), "scalars": {"loss": "NaN"}}]})
                elif line.startswith("data:") and event == "frame" and polls:
                    if polls > 3:  # three polls after the ack and no new alert event
                        break
                    polls += 1  # a new frame, so that the stream polls again
                    c.post("/api/v1/ingest", headers=bearer(ingest), json={"frames": [
                        {**frame(2 + polls), "scalars": {"loss": "NaN"}}]})
        assert len(events) == 2, events
        assert events[1]["id"] == events[0]["id"] and events[1]["acked_at"]
        assert events[1]["state"] == "firing"
