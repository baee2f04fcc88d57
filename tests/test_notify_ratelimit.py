"""Webhooks to a receiver that throttles (HTTP 429 / 503 with Retry-After, as Slack does at
about one message a second): a real HTTP sink on loopback, the real collector app."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import sessionmaker

from logitwatch.server.app import create_app
from logitwatch.server.db.models import OutboxItem
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.notify import WebhookNotifier, retry_after
from logitwatch.server.schemas import AlertOut
from logitwatch.server.settings import Settings
from tests.client_collector import wait_until


class Sink:
    """Answers the first ``throttle`` POSTs with ``status`` and ``Retry-After: after``, then
    accepts; counts POSTs that came before the Retry-After it announced (``early``)."""

    def __init__(self, throttle: int, after: str = "1", status: int = 429) -> None:
        self.throttle, self.after, self.status = throttle, after, status
        self.accepted: list[dict[str, Any]] = []
        self.throttled = 0
        self.early = 0
        self.not_before = 0.0
        self.lock = threading.Lock()
        sink = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with sink.lock:
                    now = time.time()
                    if now < sink.not_before:
                        sink.early += 1
                    if sink.throttled < sink.throttle:
                        sink.throttled += 1
                        code = sink.status
                        delta = retry_after(sink.after, now=now) or 0.0
                        sink.not_before = max(sink.not_before, now + delta)
                    else:
                        code = 200
                        sink.accepted.append(body)
                self.send_response(code)
                if code != 200:
                    self.send_header("Retry-After", sink.after)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/hook"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def _nan_frames(n: int) -> list[dict[str, Any]]:
    return [{"run": f"sweep-{i}", "seq": 0, "step": 0, "time": time.time(),
             "scalars": {"loss": "NaN"}} for i in range(n)]


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink(throttle=3)
    yield s
    s.close()


def test_throttled_alerts_are_all_delivered_after_retry_after(sqlite_url: str,
                                                              sink: Sink) -> None:
    """Runs diverging together: every alert reaches a receiver that answers 429 with
    Retry-After several times, though retries=0, and none is sent before Retry-After."""
    settings = Settings(db_url=sqlite_url, webhook_url=sink.url, webhook_retries=0)
    with TestClient(create_app(settings)) as c:
        r = c.post("/api/v1/ingest", json={"frames": _nan_frames(4)})
        assert r.status_code == 200, r.text
        fired = {(a["run"], a["rule"]) for a in r.json()["alerts"]}
        assert len(fired) >= 4
        assert wait_until(lambda: len(sink.accepted) >= len(fired), 30), \
            (sink.accepted, sink.throttled)
        assert c.app.state.notifier.failed == 0
    got = {(b["alert"]["run"], b["alert"]["rule"]) for b in sink.accepted}
    assert got == fired
    assert sink.throttled == 3 and sink.early == 0


def test_503_with_http_date_retry_after_is_not_a_failed_attempt(sqlite_url: str) -> None:
    """503 + Retry-After as an HTTP date: waited for, not counted toward retries=0."""
    sink = Sink(throttle=2, after=formatdate(time.time() + 1, usegmt=True), status=503)
    try:
        settings = Settings(db_url=sqlite_url, webhook_url=sink.url, webhook_retries=0)
        with TestClient(create_app(settings)) as c:
            n = len(c.post("/api/v1/ingest", json={"frames": _nan_frames(1)}).json()["alerts"])
            assert n >= 1
            assert wait_until(lambda: len(sink.accepted) >= n, 30), (sink.accepted, sink.throttled)
        assert sink.throttled == 2 and sink.early == 0
    finally:
        sink.close()


def test_retry_after_parsing() -> None:
    now = 1_700_000_000.0
    assert retry_after("120") == 120.0
    assert retry_after(" 0 ") == 0.0
    assert retry_after("86400") == 600.0  # capped at 10 minutes
    assert retry_after(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30.0)
    assert retry_after(formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert retry_after(None) is None and retry_after("soon") is None
    assert retry_after("nan") is None


def _alerts(sqlite_url: str, n: int) -> list[AlertOut]:
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        body = c.post("/api/v1/ingest", json={"frames": _nan_frames(n)}).json()
    return [AlertOut.model_validate(a) for a in body["alerts"]]


def test_throttled_forever_is_given_up_after_the_time_budget(
        sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    sink = Sink(throttle=10**9, after="0.05")
    engine = make_engine(sqlite_url)
    migrate(engine)
    alert = _alerts(sqlite_url, 1)[0]
    n = WebhookNotifier(sink.url, retries=0, give_up_after=0.5,
                        sessions=sessionmaker(engine, expire_on_commit=False))
    try:
        with caplog.at_level(logging.ERROR, logger="logitwatch.notify"):
            n.notify(alert)
            assert wait_until(lambda: n.failed == 1 and n.pending() == 0, 30)
        assert sink.throttled > 1  # retried past retries=0 while within the budget
        assert any("failed for good after" in r.getMessage() for r in caplog.records)
    finally:
        n.close()
        sink.close()
        engine.dispose()


def test_outbox_is_bounded_and_keeps_the_newest(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    alerts = _alerts(sqlite_url, 5)
    sink = Sink(throttle=10**9, after="600")  # holds everything in the outbox
    n = WebhookNotifier(sink.url, max_queue=3,
                        sessions=sessionmaker(engine, expire_on_commit=False))
    try:
        for a in alerts:
            n.notify(a)
        assert n.pending() == 3 and n.failed == len(alerts) - 3
        with session_scope(sessionmaker(engine)) as s:
            kept = [i.body["alert"]["id"] for i in s.query(OutboxItem).order_by(OutboxItem.id)]
        assert kept == [a.id for a in alerts[2:]]  # the two oldest made room
    finally:
        n.close()
        sink.close()
        engine.dispose()


@pytest.mark.parametrize("outbox", [False, True], ids=["in-memory", "outbox"])
def test_failing_receiver_gets_the_same_retries_in_both_modes(
        sqlite_url: str, outbox: bool, caplog: pytest.LogCaptureFixture) -> None:
    """A receiver answering 500 to everything: ``retries=2`` means three attempts in either
    mode, each retry logged with its attempt number, then one give-up."""
    sink = Sink(throttle=10**9, status=500, after="0")
    engine = make_engine(sqlite_url)
    migrate(engine)
    alert = _alerts(sqlite_url, 1)[0]
    n = WebhookNotifier(sink.url, retries=2, base_delay=0.01,
                        sessions=sessionmaker(engine, expire_on_commit=False) if outbox else None)
    try:
        def mine() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.name == "logitwatch.notify"]

        with caplog.at_level(logging.WARNING, logger="logitwatch.notify"):
            n.notify(alert)
            # given up: counted, and logged (the count comes a moment before the log line)
            assert wait_until(lambda: n.failed == 1 and n.pending() == 0 and any(
                r.levelno == logging.ERROR for r in mine()), 30)
        assert sink.throttled == 3 and n.sent == 0  # the first attempt and two retries
        records = mine()
        retried = [r.getMessage() for r in records if r.levelno == logging.WARNING]
        assert [m.split(" failed")[0] for m in retried] == ["webhook attempt 1",
                                                           "webhook attempt 2"]
        assert sum(r.levelno == logging.ERROR for r in records) == 1
    finally:
        n.close()
        sink.close()
        engine.dispose()
