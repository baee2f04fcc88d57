"""logitwatch.client: queue policy, retries, lifecycle, answers (httpx.MockTransport)."""

from __future__ import annotations

import json
import logging
import math
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

import logitwatch.client as lwc
from logitwatch.client import Client, ClientConfig
from logitwatch.client._http import backoff_delay, parse_retry_after
from logitwatch.client._queue import FrameQueue

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
        frames = json.loads(request.content)["frames"]
        with self.lock:
            n = len(self.requests)
            self.requests.append(frames)
            self.times.append(time.monotonic())
        response = self.reply(request, n)
        if 200 <= response.status_code < 300:
            with self.lock:
                self.delivered.extend(frames)
        return response


def ok(alerts: list | None = None, control: dict | None = None) -> httpx.Response:
    body = {"accepted": 0, "duplicates": 0, "alerts": alerts or [], "control": control or {}}
    return httpx.Response(200, json=body)


@pytest.fixture
def make_client() -> Iterator[Callable[..., Client]]:
    clients: list[Client] = []
    releases: list[threading.Event] = []

    def make(collector: Collector, *, config: ClientConfig = FAST, release=None) -> Client:
        if release is not None:
            releases.append(release)
        http = httpx.Client(transport=httpx.MockTransport(collector))
        client = Client("http://collector", run="r1", config=config, http=http)
        clients.append(client)
        return client

    yield make
    for event in releases:
        event.set()
    for client in clients:
        client.shutdown(5.0)


def send_n(client: Client, n: int, start: int = 0) -> None:
    for step in range(start, start + n):
        client.send(step, {"loss": float(step)}, {"attn.logit_max": [[1.0, 2.0]]})


def test_public_surface() -> None:
    assert lwc.__all__ == ["AlertCallback", "Client", "ClientConfig"]


def test_client_and_package_do_not_import_torch() -> None:
    code = (
        "import sys, logitwatch, logitwatch.client, logitwatch.wire; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_frames_follow_the_wire_format(make_client) -> None:
    collector = Collector()
    client = make_client(collector)
    heads = {"attn.logit_max": [[1.0, -math.inf]]}
    client.send(7, {"loss": math.nan, "grad.norm": math.inf}, heads, time=123.5)
    send_n(client, 3, start=8)
    assert client.flush(5.0)
    first = collector.delivered[0]
    assert first["seq"] > 1_700_000_000 * 10**6  # numbered from the clock, in microseconds
    assert first == {
        "run": "r1", "project": "default", "rank": 0, "seq": first["seq"], "step": 7,
        "time": 123.5,
        "scalars": {"loss": "NaN", "grad.norm": "Infinity"},
        "heads": {"attn.logit_max": [[1.0, "-Infinity"]]},
    }
    seqs = [f["seq"] for f in collector.delivered]
    assert seqs == list(range(seqs[0], seqs[0] + 4))
    assert client.stats["sent"] == 4 and client.stats["queued"] == 4


def test_503_then_success_loses_nothing_and_keeps_order(make_client) -> None:
    collector = Collector(lambda req, n: httpx.Response(503) if n < 2 else ok())
    client = make_client(collector, config=ClientConfig(interval=0.02, max_backoff=0.02,
                                                        max_batch=4))
    send_n(client, 10)
    assert client.flush(5.0)
    assert [f["step"] for f in collector.delivered] == list(range(10))
    assert collector.requests[0] == collector.requests[1] == collector.requests[2]
    stats = client.stats
    assert stats["retries"] == 2 and stats["sent"] == 10 and stats["pending"] == 0


def test_connection_error_is_retried(make_client) -> None:
    def reply(request: httpx.Request, n: int) -> httpx.Response:
        if n == 0:
            raise httpx.ConnectError("connection refused", request=request)
        return ok()

    collector = Collector(reply)
    client = make_client(collector)
    send_n(client, 3)
    assert client.flush(5.0)
    seqs = [f["seq"] for f in collector.delivered]
    assert seqs == list(range(seqs[0], seqs[0] + 3))
    assert client.stats["retries"] == 1


def test_429_honours_retry_after(make_client) -> None:
    retried = threading.Event()

    def reply(request: httpx.Request, n: int) -> httpx.Response:
        if n == 0:
            return httpx.Response(429, headers={"Retry-After": "1"})
        retried.set()
        return ok()

    collector = Collector(reply)
    client = make_client(collector, config=ClientConfig(interval=0.02, max_backoff=30.0))
    send_n(client, 2)
    assert retried.wait(10)  # not flush(): a flush cuts the wait short on purpose
    assert client.flush(5.0)
    assert client.stats["sent"] == 2 and client.stats["retries"] == 1
    assert collector.times[1] - collector.times[0] >= 0.95


def test_backoff_schedule() -> None:
    rng = random.Random(0)
    for attempt in range(6):
        d = backoff_delay(attempt, max_backoff=1000.0, rng=rng)
        assert 0.8 * 2**attempt <= d <= 1.2 * 2**attempt
    assert backoff_delay(20, max_backoff=30.0, rng=rng) == 30.0
    assert backoff_delay(0, max_backoff=30.0, retry_after=7.0) == 7.0
    assert backoff_delay(0, max_backoff=30.0, retry_after=3600.0) == 30.0
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_400_is_not_retried_and_logged(make_client, caplog) -> None:
    body = {"code": "invalid-frame", "message": "frames[0].run: bad name"}
    collector = Collector(lambda req, n: httpx.Response(400, json=body) if n == 0 else ok())
    client = make_client(collector)
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        send_n(client, 2)
        assert client.flush(5.0) is False
    assert len(collector.requests) == 1
    assert client.stats["rejected"] == 2 and client.stats["retries"] == 0
    assert "invalid-frame: frames[0].run: bad name" in caplog.text
    send_n(client, 1, start=2)  # the client keeps working afterwards
    assert client.flush(5.0)
    assert [f["step"] for f in collector.delivered] == [2]


def test_full_queue_drops_the_oldest() -> None:
    queue = FrameQueue(3)
    for seq in range(5):
        queue.put(seq, {"seq": seq})
    assert queue.counts()["dropped_queue_full"] == 2
    assert [f["seq"] for f in queue.take(10)] == [2, 3, 4]


def test_overflow_while_a_batch_is_in_flight(make_client) -> None:
    entered, release = threading.Event(), threading.Event()

    def reply(request: httpx.Request, n: int) -> httpx.Response:
        if n == 0:
            entered.set()
            assert release.wait(10)
        return ok()

    collector = Collector(reply)
    client = make_client(collector, config=ClientConfig(interval=0.02, max_queue=3, max_batch=1),
                         release=release)
    send_n(client, 1)
    assert entered.wait(5)  # frame 0 is in flight; the queue is empty
    send_n(client, 5, start=1)  # 1..5 into a queue of 3: 1 and 2 are dropped
    assert client.stats["dropped_queue_full"] == 2
    release.set()
    assert client.flush(5.0)
    assert [f["step"] for f in collector.delivered] == [0, 3, 4, 5]


def test_flush_false_on_timeout_and_shutdown_respects_deadline(make_client, caplog,
                                                               monkeypatch) -> None:
    unregistered: list = []
    monkeypatch.setattr("atexit.unregister", unregistered.append)
    entered, release = threading.Event(), threading.Event()

    def reply(request: httpx.Request, n: int) -> httpx.Response:
        entered.set()
        release.wait(10)
        return ok()

    client = make_client(Collector(reply), release=release)
    send_n(client, 4)
    assert entered.wait(5)
    assert client.flush(0.05) is False
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        t0 = time.monotonic()
        client.shutdown(0.3)
        elapsed = time.monotonic() - t0
    assert elapsed < 2.0
    assert client.stats["undelivered_at_shutdown"] == 4
    assert "4 frame(s) of run 'r1' were NOT delivered" in caplog.text
    assert unregistered == [client._atexit]
    client.shutdown(0.3)  # idempotent
    client.send(9, {}, {})
    assert client.stats["dropped_after_shutdown"] == 1 and client.flush(0.1) is False


def test_shutdown_delivers_what_is_queued(make_client) -> None:
    collector = Collector()
    client = make_client(collector, config=ClientConfig(interval=60.0))
    send_n(client, 5)
    client.shutdown(5.0)
    assert [f["step"] for f in collector.delivered] == list(range(5))
    assert client.stats["undelivered_at_shutdown"] == 0


def test_alerts_once_per_id_and_control(make_client, caplog) -> None:
    answers = [
        ok([{"id": 1, "rule": "a"}], {"sample_every": 5}),
        ok([{"id": 1, "rule": "a"}, {"id": 2, "rule": "b"}], {"sample_every": 2}),
    ]
    collector = Collector(lambda req, n: answers[min(n, 1)])
    client = make_client(collector)
    seen: list = []

    def broken(alert: dict) -> None:
        raise RuntimeError("callback bug")

    client.on_alert(broken)
    client.on_alert(lambda alert: seen.append(alert["id"]))
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        send_n(client, 1)
        assert client.flush(5.0)
        assert client.control == {"sample_every": 5}
        send_n(client, 1, start=1)
        assert client.flush(5.0)
        send_n(client, 1, start=2)
        assert client.flush(5.0)
    assert seen == [1, 2]
    assert client.control == {"sample_every": 2}
    assert caplog.text.count("on_alert callback") == 2


def test_garbage_answer_still_counts_as_delivered(make_client) -> None:
    client = make_client(Collector(lambda req, n: httpx.Response(200, text="<html>")))
    send_n(client, 2)
    assert client.flush(5.0)
    assert client.control == {}


def test_send_never_raises(make_client, caplog) -> None:
    collector = Collector()
    client = make_client(collector)
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        client.send(0, {"loss": "not a number"}, {})  # type: ignore[dict-item]
        client.send(1, {"loss": object()}, {})  # type: ignore[dict-item]
    assert caplog.text.count("Client.send failed") == 1
    send_n(client, 1, start=2)
    assert client.flush(5.0)
    assert [f["step"] for f in collector.delivered] == [2]


def test_null_client_counts_and_discards() -> None:
    client = Client(None, run="r1")
    send_n(client, 3)
    assert client.flush(0.1)
    assert client.stats["queued"] == 3 and client.stats["discarded"] == 3
    client.shutdown(0.1)


def test_config_validation_and_env() -> None:
    with pytest.raises(ValueError, match="max_queue"):
        ClientConfig(max_queue=0)
    with pytest.raises(ValueError, match="interval"):
        ClientConfig(interval=math.nan)
    cfg = ClientConfig.from_env({"LOGITWATCH_MAX_BATCH": "64", "LOGITWATCH_INTERVAL": "2"},
                                interval=1.0)
    assert cfg.max_batch == 64 and cfg.interval == 1.0
    with pytest.raises(ValueError, match="LOGITWATCH_MAX_QUEUE"):
        ClientConfig.from_env({"LOGITWATCH_MAX_QUEUE": "lots"})
    with pytest.raises(ValueError, match="run"):
        Client(None, run="bad name!")
    with pytest.raises(ValueError, match="rank"):
        Client(None, run="r", rank=-1)


def test_token_is_sent_as_bearer_header_and_read_from_env() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization"))
        return httpx.Response(200, json={"accepted": 1, "duplicates": 0, "alerts": [],
                                         "control": {}})

    config = ClientConfig.from_env(env={"LOGITWATCH_TOKEN": "lw_secret"})
    assert config.token == "lw_secret" and "lw_secret" not in repr(config)
    http = httpx.Client(transport=httpx.MockTransport(handler))
    client = Client("http://collector", run="r1", config=config, http=http)
    client.send(0, {"loss": 1.0}, {})
    assert client.flush(5.0)
    client.shutdown(5.0)
    http.close()
    assert seen == ["Bearer lw_secret"]
    with pytest.raises(ValueError, match="token"):
        ClientConfig(token="  ")
