"""logitwatch.client against a scripted collector (httpx.MockTransport,
``client_collector.py``): the wire format, retries, answers (alerts, control), bad input,
threads. Overflow, flush, shutdown and the end frame: test_client_shutdown.py; the backlog and
the disk spool alone: test_client_spool.py; fault injection against a real collector process:
test_transport.py.
"""

from __future__ import annotations

import json
import logging
import math
import random
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

import logitwatch.client as lwc
from logitwatch.client import Client, ClientConfig
from logitwatch.client._http import backoff_delay, parse_retry_after
from logitwatch.client._queue import ASIDE_SHARE
from tests.client_collector import (
    Collector,
    body_of,
    ok,
    send_n,
    stuck_collector,
)


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
    assert seqs == sorted(set(seqs)) and len(seqs) == 4  # max(previous + 1, clock µs)
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
    assert [f["step"] for f in collector.delivered] == [0, 1, 2]
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
    # Retry-After: 0 (or a date already past) is no busy loop
    assert backoff_delay(0, max_backoff=30.0, retry_after=0.0) == 1.0
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_400_is_not_retried_and_logged(make_client, caplog) -> None:
    # The collector refuses any request holding step 1: the batch is sent in halves, and
    # only that frame is dropped (set aside), never retried.
    body = {"code": "invalid-frame", "message": "frames[0].run: bad name"}

    def reply(request: httpx.Request, n: int) -> httpx.Response:
        steps = [f["step"] for f in json.loads(body_of(request))["frames"]]
        return httpx.Response(400, json=body) if 1 in steps else ok()

    collector = Collector(reply)
    client = make_client(collector, config=ClientConfig(interval=0.5, max_backoff=0.02,
                                                        timeout=5.0))
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        send_n(client, 3)
        assert client.flush(5.0) is False
    assert [len(r) for r in collector.requests] == [3, 1, 2, 1, 1]
    assert client.stats["rejected"] == 1 and client.stats["retries"] == 0
    assert sorted(f["step"] for f in collector.delivered) == [0, 2]
    assert "invalid-frame: frames[0].run: bad name" in caplog.text
    send_n(client, 1, start=3)  # the client keeps working afterwards
    assert client.flush(5.0)
    assert sorted(f["step"] for f in collector.delivered) == [0, 2, 3]


def test_a_collector_refusing_every_frame_does_not_fill_the_disk(make_client, caplog) -> None:
    # A wrong URL, or a collector of another version, answers 400 to every frame: each is
    # refused alone and set aside (.rejected), and those files grew for the whole run,
    # outside spool_max_bytes (1.4 MB against 64 KiB in 3 s). They keep to their share.
    budget = 64 * 1024
    collector = Collector(lambda request, n: httpx.Response(
        400, json={"code": "invalid-request", "message": "no"}))
    client = make_client(collector, config=ClientConfig(
        interval=0.02, max_backoff=0.02, timeout=5.0, spool_max_bytes=budget))
    heads = {"attn.logit_max": [[1.0] * 32 for _ in range(32)]}  # ~2.3 kB a frame
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        for step in range(300):
            client.send(step, {"loss": 1.0}, heads)
        assert client.flush(30.0) is False
    stats = client.stats
    assert stats["rejected"] == 300 and stats["pending"] == 0
    assert client.spool_path is not None
    aside = list(Path(client.spool_path).glob("*.rejected"))
    assert 0 < sum(p.stat().st_size for p in aside) <= budget * ASIDE_SHARE
    assert 0 < stats["dropped_aside"] < 300
    warned = [r.getMessage() for r in caplog.records if "no longer kept aside" in r.getMessage()]
    assert len(warned) == 1 and "wrong URL" in warned[0]


def test_alerts_once_per_id_and_severity_and_control(make_client, caplog) -> None:
    answers = [
        ok([{"id": 1, "rule": "a", "severity": "info"}], {"sample_every": 5}),
        ok([{"id": 1, "rule": "a", "severity": "info"}, {"id": 2, "rule": "b"}],
           {"sample_every": 2}),
        ok([{"id": 1, "rule": "a", "severity": "warning"}, {"id": 2, "rule": "b"}],
           {"sample_every": 2}),  # alert 1 escalated: news to the job
    ]
    collector = Collector(lambda req, n: answers[min(n, 2)])
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
        send_n(client, 1, start=3)
        assert client.flush(5.0)
    assert seen == [1, 2, 1]
    assert client.control == {"sample_every": 2}
    assert caplog.text.count("on_alert callback") == 3


def test_garbage_2xx_and_auth_errors_keep_the_frames(make_client) -> None:
    answers = [httpx.Response(200, text="<html>captive portal</html>"),
               httpx.Response(200, json=["not", "an", "object"]),
               httpx.Response(401, json={"code": "invalid-token", "message": "unknown"}),
               httpx.Response(404, text="not found")]
    collector = Collector(lambda req, n: answers[n] if n < len(answers) else ok())
    client = make_client(collector)
    send_n(client, 2)
    assert client.flush(5.0)
    assert len(collector.requests) == 5
    assert all([f["step"] for f in r] == [0, 1] for r in collector.requests)
    stats = client.stats
    assert stats["retries"] == 4 and stats["sent"] == 2 and stats["rejected"] == 0
    assert client.control == {}


def test_send_never_raises(make_client, caplog) -> None:
    """A value that is not a number, a matrix that is not one, a history that is not a
    mapping: each is left out, the frame is sent. A frame whose scalars are not a mapping is
    dropped and counted."""
    collector = Collector()
    client = make_client(collector)
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        client.send(0, {"loss": "not a number", "lr": 1e-3}, {})  # type: ignore[dict-item]
        client.send(1, {"loss": object()}, {"attn.x": [1.0, 2.0],  # type: ignore[dict-item]
                                            "attn.y": [[1.0, None]]})  # type: ignore[list-item]
        client.send(2, None, {})  # type: ignore[arg-type]
        client.send(3, {"loss": 1.0}, {}, history={"steps": [1], "scalars": [1.0]})
    assert caplog.text.count("Client.send dropped a frame") == 1
    assert client.stats["invalid"] == 1
    send_n(client, 1, start=4)
    assert client.flush(5.0)
    assert [f["step"] for f in collector.delivered] == [0, 1, 3, 4]
    assert collector.delivered[0]["scalars"] == {"lr": 1e-3}
    assert collector.delivered[1]["scalars"] == {} and collector.delivered[1]["heads"] == {}
    assert "history" not in collector.delivered[2]
    assert "scalar 'loss' left out" in caplog.text and "heads['attn.x']" in caplog.text
    assert "history left out: scalars must be a mapping" in caplog.text
    assert client.flush(math.inf)  # waits as shutdown does, no OverflowError


def test_names_that_are_str_subclasses_are_sent_as_str(make_client) -> None:
    """numpy's ``str_`` and a ``str`` Enum are names like any str. ``numpy.str_`` once
    went through the queue's marshal as bytes, and encoding the batch failed: the sender
    and the spooler stopped, and nothing more was sent or kept."""
    import enum

    import numpy as np

    class Metric(str, enum.Enum):
        LR = "lr"

    collector = Collector()
    client = make_client(collector)
    client.send(0, {np.str_("loss"): 1.0, Metric.LR: 1e-3}, {np.str_("attn.logit_max"): [[1.0]]},
                history=None)
    client.send(1, {"loss": 0.5}, {}, history={"steps": [0], "scalars": {np.str_("gn"): [2.0]}})
    send_n(client, 3, start=2)
    assert client.flush(5.0)
    assert [f["step"] for f in collector.delivered] == [0, 1, 2, 3, 4]
    first = collector.delivered[0]
    assert first["scalars"] == {"loss": 1.0, "lr": 1e-3}
    assert first["heads"] == {"attn.logit_max": [[1.0]]}
    assert collector.delivered[1]["history"]["scalars"] == {"gn": [2.0]}
    assert client.stats["invalid"] == 0


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
    assert seen == ["Bearer lw_secret"] * 2  # the frame, then the end frame
    with pytest.raises(ValueError, match="token"):
        ClientConfig(token="  ")


def test_bad_frames_and_metrics_are_left_out_not_the_batch(make_client, caplog) -> None:
    collector = Collector()
    client = make_client(collector)
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        client.send(-1, {"loss": 1.0}, {})  # the collector would refuse the whole batch
        client.send(1, {"loss": 1.0, "bad name": 2.0},
                    {"ragged": [[1.0, 2.0], [3.0]], "attn.logit_max": [[1.0, 2.0]]})
    assert client.flush(5.0)
    assert client.stats["invalid"] == 1
    (only,) = collector.delivered
    assert only["scalars"] == {"loss": 1.0} and list(only["heads"]) == ["attn.logit_max"]
    assert "step must be an int" in caplog.text and "'bad name'" in caplog.text
    assert "heads['ragged']" in caplog.text


def test_values_are_copied_at_send(make_client) -> None:
    collector, entered, release = stuck_collector()
    client = make_client(collector, release=release)
    send_n(client, 1)
    assert entered.wait(5)
    row = [1.0, 2.0]
    client.send(1, {"loss": 1.0}, {"attn.logit_max": [row]})
    row[0] = 99.0  # the caller reuses its list
    release.set()
    assert client.flush(5.0)
    assert collector.delivered[1]["heads"]["attn.logit_max"] == [[1.0, 2.0]]


def test_many_threads_send_at_once(make_client) -> None:
    collector = Collector()
    client = make_client(collector, config=ClientConfig(interval=0.02, max_batch=64))
    threads = [threading.Thread(target=send_n, args=(client, 200, 1000 * i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert client.flush(10.0)
    seqs = [f["seq"] for f in collector.delivered]
    assert len(seqs) == 800 and seqs == sorted(set(seqs))  # unique, delivered in seq order
    assert sorted(f["step"] for f in collector.delivered) == sorted(
        s for i in range(4) for s in range(1000 * i, 1000 * i + 200))


def test_gzip_bodies(make_client) -> None:
    encodings: list[str | None] = []
    collector = Collector(lambda req, n: encodings.append(req.headers.get("Content-Encoding"))
                          or ok())
    client = make_client(collector, config=ClientConfig(interval=0.02, max_batch=50))
    client.send(0, {"loss": 1.0}, {})  # a small body goes as it is
    assert client.flush(5.0)
    send_n(client, 50, start=1)
    assert client.flush(5.0)
    assert encodings[0] is None and encodings[-1] == "gzip"
    assert len(collector.delivered) == 51


def test_a_bug_in_the_sender_thread_does_not_stop_delivery(make_client, caplog) -> None:
    """An unexpected error while taking a batch (a bug, a MemoryError) used to end the
    sender thread for good: nothing more was sent for the rest of the run. It is logged
    once, the thread waits and goes on, and every frame arrives."""
    collector = Collector()
    client = make_client(collector, config=ClientConfig(interval=0.02, max_backoff=0.2))
    backlog = client._backlog
    take = backlog.take
    fails = [2]

    def flaky(max_frames: int):  # type: ignore[no-untyped-def]
        if fails[0] > 0:
            fails[0] -= 1
            raise RuntimeError("a bug")
        return take(max_frames)

    backlog.take = flaky  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        send_n(client, 3)
        assert client.flush(10.0)
    assert [f["step"] for f in collector.delivered] == [0, 1, 2]
    assert caplog.text.count("the sender thread failed to send a batch") == 1
    assert "frames are no longer sent" not in caplog.text


def test_what_a_client_remembers_of_a_collector_is_bounded(caplog) -> None:
    """Over a month-long run a collector reports many alerts, and may answer with many
    distinct error codes: the alerts already reported (for ``on_alert``) and the causes
    already warned of are bounded; the newest alerts are still reported once each."""
    from logitwatch.client import _client as client_mod
    from logitwatch.client._queue import WARN_KEYS

    client = Client(None, run="r1")  # no collector: only the answer handling is exercised
    seen: list[int] = []
    client.on_alert(lambda a: seen.append(a["id"]))
    n = client_mod.SEEN_ALERTS + 500
    for i in range(n):
        client._handle_answer({"alerts": [{"id": i, "run": "r1", "severity": "warning"}]})
    client._handle_answer({"alerts": [{"id": n - 1, "run": "r1", "severity": "warning"}]})
    assert seen == list(range(n))  # each once, the newest included
    assert len(client._seen_alerts) <= client_mod.SEEN_ALERTS
    backlog = client._backlog
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        for i in range(WARN_KEYS + 50):
            backlog._warn_once(f"code-{i}", "refused: %s", i)
    assert len(backlog._warned) == WARN_KEYS
    assert caplog.text.count("refused:") == WARN_KEYS
