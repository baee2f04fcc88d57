"""Bodies before the caller is known, against a real ``logitwatch serve`` on loopback: a
request without a known token gets 401 before its body is read, the bytes buffered at once
have a budget, a trickled body does not hold a connection for ever, and a body of many gzip
members is refused before they are all inflated (``server/limits.py``, ``server/serving.py``).

Each test here failed before the fix it guards; none times anything.
"""

from __future__ import annotations

import gzip
import json
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import sessionmaker

from logitwatch.server import limits
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.store.tokens import create_token
from tests.hostile import frame
from tests.served import Served


class TokenCollector(Served):
    """``logitwatch serve`` on a SQLite database holding an ingest token (token mode)."""

    def __init__(self, tmp: Path, nofile: int | None = None, **env: str) -> None:
        db = f"sqlite:///{tmp / 'tok.db'}"
        engine = make_engine(db)
        migrate(engine)
        with session_scope(sessionmaker(engine)) as s:
            self.token = create_token(s, project="p", scope="ingest").secret
        engine.dispose()
        super().__init__(tmp, "--db", db, env=env, nofile=nofile, up_status=401)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Callable[..., TokenCollector]]:
    made: list[TokenCollector] = []

    def start(nofile: int | None = None, **env: str) -> TokenCollector:
        made.append(TokenCollector(tmp_path, nofile, **env))
        return made[-1]

    yield start
    for c in made:
        c.stop()


def _headers(port: int, length: int, *extra: str) -> bytes:
    lines = ["POST /api/v1/ingest HTTP/1.1", f"Host: 127.0.0.1:{port}",
             "Content-Type: application/json", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(s: socket.socket) -> bytes:
    """The whole answer on ``s`` (the collector closes the connection after a refusal); a
    socket timeout means no answer came while the body was still unsent."""
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
        if b"\r\n\r\n" in data:
            head, _, body = data.partition(b"\r\n\r\n")
            n = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")), None)
            if n is not None and len(body) >= n:
                return data


def _body(answer: bytes) -> dict[str, str]:
    return json.loads(answer.partition(b"\r\n\r\n")[2])  # type: ignore[no-any-return]


# --- 2. no token: 401 before one byte of the body is read ------------------------------------


def test_a_body_without_a_known_token_is_refused_before_it_is_read(collector) -> None:
    col = collector(LOGITWATCH_BODY_TIMEOUT="60")
    for extra in ((), ("Authorization: Bearer lw_not_a_token",)):
        with socket.create_connection(("127.0.0.1", col.port), timeout=10) as s:
            # 31 MiB announced, none sent: before, the collector waited for (and buffered)
            # the body before any token was looked at: no answer within the socket timeout
            s.sendall(_headers(col.port, 31 << 20, *extra))
            answer = _answer(s)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:300]
        assert b"www-authenticate: Bearer" in answer.lower().replace(b"bearer", b"Bearer")
        assert _body(answer)["code"] == ("invalid-token" if extra else "auth-required")
    # a gzip body of many members without a token: refused before it is inflated
    body = gzip.compress(b"") * 10_000
    r = httpx.post(col.url + "/api/v1/ingest", content=body, timeout=30,
                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 401 and r.json()["code"] == "auth-required"
    # the token still works, the login (its token in the body) still answers
    r = httpx.post(col.url + "/api/v1/ingest", json={"frames": [frame(0)]}, headers=col.auth,
                   timeout=10)
    assert r.status_code == 200, r.text
    r = httpx.post(col.url + "/api/v1/session", json={"token": col.token}, timeout=10)
    assert r.status_code == 403 and r.json()["code"] == "scope-forbidden"  # not a read token
    r = httpx.post(col.url + "/api/v1/session", content=b"x" * 10_000, timeout=10,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["code"] == "request-too-large"


# --- 2. the bytes buffered at once have a budget -------------------------------------------


def test_bodies_buffered_at_once_have_a_budget(collector) -> None:
    size = 64 * 1024  # max_request_bytes: a budget of 8 bodies at once
    col = collector(LOGITWATCH_MAX_REQUEST_BYTES=str(size), LOGITWATCH_BODY_TIMEOUT="60")
    auth = f"Authorization: Bearer {col.token}"
    held: list[socket.socket] = []
    try:
        for _ in range(limits.BUFFER_BUDGET_FACTOR):
            s = socket.create_connection(("127.0.0.1", col.port), timeout=10)
            s.sendall(_headers(col.port, size, auth) + b"{")
            held.append(s)
        time.sleep(0.5)  # let the collector take them in
        with socket.create_connection(("127.0.0.1", col.port), timeout=10) as s:
            s.sendall(_headers(col.port, size, auth))
            answer = _answer(s)  # before: it waited for the body, and buffered it
        assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
        assert b"retry-after:" in answer.lower()
        assert _body(answer)["code"] == "busy-buffering"
    finally:
        for s in held:
            s.close()
    # the budget comes back once those requests end
    deadline = time.monotonic() + 30
    while True:
        r = httpx.post(col.url + "/api/v1/ingest", json={"frames": [frame(0)]},
                       headers=col.auth, timeout=10)
        if r.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200, r.text


# --- 3. a trickled body does not hold a connection for ever ----------------------------------


def test_trickled_bodies_do_not_lock_jobs_out(collector) -> None:
    # 128 open files: max_connections 64. 100 connections (with the token) send their headers
    # and then a byte now and then: before, each counted as a request in progress and was
    # never closed, and past max_connections every new connection was closed instead.
    col = collector(nofile=128, LOGITWATCH_BODY_TIMEOUT="120")
    auth = f"Authorization: Bearer {col.token}"
    slow: list[socket.socket] = []
    try:
        for _ in range(100):
            s = socket.create_connection(("127.0.0.1", col.port), timeout=10)
            s.sendall(_headers(col.port, 1000, auth) + b"{")
            slow.append(s)
        time.sleep(0.5)
        codes = []
        for i in range(5):
            try:
                r = httpx.post(col.url + "/api/v1/ingest", json={"frames": [frame(i)]},
                               headers=col.auth, timeout=10)
                codes.append(r.status_code)
            except httpx.TransportError as e:
                codes.append(type(e).__name__)
        assert codes == [200] * 5
    finally:
        for s in slow:
            s.close()


# --- 1. many gzip members: refused, in bounded work -----------------------------------------


def test_many_gzip_members_are_refused_before_they_are_all_inflated(collector) -> None:
    col = collector()
    one = gzip.compress(b"")
    body = one * ((1 << 20) // len(one))  # 52,000 empty members in 1 MiB
    r = httpx.post(col.url + "/api/v1/ingest", content=body, timeout=120,
                   headers={**col.auth, "Content-Type": "application/json",
                            "Content-Encoding": "gzip"})
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "too-many-gzip-members"
    assert str(limits.MAX_GZIP_MEMBERS) in r.json()["message"]
    # a few members (a proxy that concatenates) are still one body
    doc = json.dumps({"frames": [frame(0)]}).encode()
    body = gzip.compress(doc[:10]) + gzip.compress(doc[10:]) + b"\0" * 16
    r = httpx.post(col.url + "/api/v1/ingest", content=body, timeout=10,
                   headers={**col.auth, "Content-Type": "application/json",
                            "Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text


def test_gunzip_work_is_bounded_by_the_member_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    made = 0
    real = zlib.decompressobj

    def counting(*a: object, **kw: object) -> object:
        nonlocal made
        made += 1
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(limits.zlib, "decompressobj", counting)
    one = gzip.compress(b"x")
    assert limits.gunzip(one * limits.MAX_GZIP_MEMBERS, 1 << 20) == \
        b"x" * limits.MAX_GZIP_MEMBERS
    made = 0
    with pytest.raises(limits._TooManyMembers):
        limits.gunzip(one * 200_000, 1 << 20)
    assert made == limits.MAX_GZIP_MEMBERS  # member 65 is refused before it is inflated
    with pytest.raises(ValueError):
        limits.gunzip(one[:-3], 1 << 20)
    with pytest.raises(ValueError):
        limits.gunzip(one + b"\0\0x", 1 << 20)
