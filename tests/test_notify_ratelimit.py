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

    def __init__(self, throttle: int, after: str = "1", status: int = 429,
                 delay: float = 0.0) -> None:
        self.throttle, self.after, self.status, self.delay = throttle, after, status, delay
        self.accepted: list[dict[str, Any]] = []
        #: every POST: (alert id, alert state, Idempotency-Key, answer)
        self.posts: list[tuple[Any, str, str | None, int]] = []
        self.throttled = 0
        self.early = 0
        self.not_before = 0.0
        self.lock = threading.Lock()
        sink = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(sink.delay)
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
                    sink.posts.append((body["alert"]["id"], body["alert"]["state"],
                                       self.headers.get("Idempotency-Key"), code))
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


def test_a_failing_receiver_without_a_database_gets_its_retries(
        sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """In memory: a receiver answering 500 to everything: ``retries=2`` means three
    attempts, each retry logged with its attempt number, then one give-up."""
    sink = Sink(throttle=10**9, status=500, after="0")
    engine = make_engine(sqlite_url)
    migrate(engine)
    alert = _alerts(sqlite_url, 1)[0]
    n = WebhookNotifier(sink.url, retries=2, base_delay=0.01)
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
        keys = {k for *_, k, _ in sink.posts}  # one Idempotency-Key, on every attempt
        assert len(keys) == 1 and next(iter(keys)).startswith("logitwatch-")
    finally:
        n.close()
        sink.close()
        engine.dispose()


def test_the_outbox_outlasts_a_receiver_down_for_longer_than_its_retries(
        sqlite_url: str) -> None:
    """A receiver down (502) for 8 attempts, past ``retries=1``: the outbox retries until
    the notification is ``give_up_after`` old, and delivers it once the receiver is back (it
    gave up after two attempts, 15 s at the defaults: a restart of the receiver lost every
    alert meanwhile). Every attempt carries the same Idempotency-Key."""
    sink = Sink(throttle=8, status=502, after="0")
    engine = make_engine(sqlite_url)
    migrate(engine)
    alert = _alerts(sqlite_url, 1)[0]
    n = WebhookNotifier(sink.url, retries=1, base_delay=0.01, give_up_after=60,
                        sessions=sessionmaker(engine, expire_on_commit=False))
    try:
        n.notify(alert)
        assert wait_until(lambda: n.sent == 1 and n.pending() == 0, 30)
        assert n.failed == 0 and len(sink.posts) == 9
        keys = {k for *_, k, _ in sink.posts}
        assert len(keys) == 1 and next(iter(keys)).startswith("logitwatch-outbox-")
    finally:
        n.close()
        sink.close()
        engine.dispose()


def test_an_alerts_resolve_never_overtakes_its_fire_nor_holds_up_other_alerts(
        sqlite_url: str) -> None:
    """The fire of alert A fails once (502) and waits for its retry: A's resolve, queued
    behind it, waits too (it went out first, then the fire: Slack showed RESOLVED, then
    FIRING), while alert B, queued after both, is not held up."""
    sink = Sink(throttle=1, status=502, after="0")
    engine = make_engine(sqlite_url)
    migrate(engine)
    a, b = _alerts(sqlite_url, 2)
    n = WebhookNotifier(sink.url, base_delay=0.5, give_up_after=60,
                        sessions=sessionmaker(engine, expire_on_commit=False))
    try:
        n.notify(a)
        n.notify(a.model_copy(update={"state": "resolved"}))
        n.notify(b)
        assert wait_until(lambda: n.sent == 3 and n.pending() == 0, 30)
        order = [(i, st) for i, st, _, code in sink.posts if code == 200]
        assert order == [(b.id, "firing"), (a.id, "firing"), (a.id, "resolved")], order
    finally:
        n.close()
        sink.close()
        engine.dispose()


def test_collectors_sharing_an_outbox_send_each_notification_once(sqlite_url: str) -> None:
    """Two collectors on one database: each claims a row before it posts, so a slow
    receiver gets each notification once (each collector posted every row)."""
    sink = Sink(throttle=0, delay=0.3)
    engine = make_engine(sqlite_url)
    migrate(engine)
    alerts = _alerts(sqlite_url, 3)
    sessions = sessionmaker(engine, expire_on_commit=False)
    first, second = (WebhookNotifier(sink.url, sessions=sessions) for _ in range(2))
    try:
        for x in alerts:
            first.notify(x)
        second._wake.set()
        assert wait_until(lambda: first.pending() == 0 and len(sink.posts) >= 3, 30)
        time.sleep(0.5)  # a duplicate would be in flight by now
        assert sorted(i for i, *_ in sink.posts) == sorted(x.id for x in alerts)
        assert first.sent + second.sent == 3
    finally:
        first.close()
        second.close()
        sink.close()
        engine.dispose()


def test_only_alerts_that_page_are_sent_unless_info_is_asked_for(sqlite_url: str) -> None:
    """An info alert (``paged_step`` None: a bump shown on the dashboard) is not a page: it
    is not posted by default (every one went to the Slack channel), and is with ``info``.
    A paging alert's fire and resolve are posted."""
    sink = Sink(throttle=0)
    engine = make_engine(sqlite_url)
    migrate(engine)
    paged = _alerts(sqlite_url, 1)[0]
    info = paged.model_copy(update={"id": paged.id + 100, "severity": "info",
                                    "paged_step": None})
    assert paged.paged_step is not None
    sessions = sessionmaker(engine, expire_on_commit=False)
    try:
        for asked in (False, True):
            sink.posts.clear()
            n = WebhookNotifier(sink.url, sessions=sessions, info=asked)
            try:
                for a in (info, paged, paged.model_copy(update={"state": "resolved"})):
                    n.notify(a)
                assert wait_until(lambda n=n: n.pending() == 0 and len(sink.posts) >= 2, 30)
            finally:
                n.close()
            got = sorted((i, st) for i, st, *_ in sink.posts)
            want = [(paged.id, "firing"), (paged.id, "resolved")]
            assert got == sorted(want + ([(info.id, "firing")] if asked else [])), asked
            assert n.skipped == (0 if asked else 1)
    finally:
        sink.close()
        engine.dispose()
