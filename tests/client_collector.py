"""A scripted collector for the client tests (``httpx.MockTransport``): the handler that
records and answers each request and small helpers shared by ``test_client.py`` and
``test_client_shutdown.py``; their ``make_client`` fixture is in ``conftest.py`` (where the
autouse ``logitwatch_home`` also puts every client's spool under the test's own home)."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Callable

import httpx

from logitwatch.client import Client, ClientConfig

FAST = ClientConfig(interval=0.02, max_backoff=0.02, timeout=5.0)

Reply = Callable[[httpx.Request, int], httpx.Response]


class Collector:
    """A MockTransport handler that records every request and replies from a script."""

    def __init__(self, reply: Reply | None = None) -> None:
        self.reply = reply or (lambda request, n: ok())
        self.requests: list[list[dict]] = []  # frames of every request, delivered or not
        self.delivered: list[dict] = []  # frames of requests answered 2xx
        self.times: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.method == "POST" and request.url.path == "/api/v1/ingest"
        frames = json.loads(body_of(request))["frames"]
        with self.lock:
            n = len(self.requests)
            self.requests.append(frames)
            self.times.append(time.monotonic())
        response = self.reply(request, n)
        if 200 <= response.status_code < 300:
            with self.lock:
                self.delivered.extend(frames)
        return response


def body_of(request: httpx.Request) -> bytes:
    if request.headers.get("Content-Encoding") == "gzip":
        return gzip.decompress(request.content)
    return request.content


def ok(alerts: list | None = None, control: dict | None = None) -> httpx.Response:
    body = {"accepted": 0, "duplicates": 0, "alerts": alerts or [], "control": control or {}}
    return httpx.Response(200, json=body)


def send_n(client: Client, n: int, start: int = 0) -> None:
    for step in range(start, start + n):
        client.send(step, {"loss": float(step)}, {"attn.logit_max": [[1.0, 2.0]]})


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def stuck_collector() -> tuple[Collector, threading.Event, threading.Event]:
    """A collector whose first request blocks until released."""
    entered, release = threading.Event(), threading.Event()

    def reply(request: httpx.Request, n: int) -> httpx.Response:
        if n == 0:
            entered.set()
            assert release.wait(10)
        return ok()

    return Collector(reply), entered, release
