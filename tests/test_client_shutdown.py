"""logitwatch.client against a scripted collector: a full queue while a batch is in flight
(spilled to the disk spool, or the oldest dropped), flush and shutdown with a stuck collector,
and the end frame that marks a run finished. Queue policy, retries and answers:
test_client.py.
"""

from __future__ import annotations

import logging
import threading

import httpx
import pytest

from logitwatch.client import ClientConfig
from tests.client_collector import (
    Collector,
    ok,
    send_n,
    stuck_collector,
    wait_until,
)


def test_overflow_while_a_batch_is_in_flight_spills_to_disk_in_order(make_client) -> None:
    collector, entered, release = stuck_collector()
    config = ClientConfig(interval=0.02, max_queue=10, max_batch=1)
    client = make_client(collector, config=config, release=release)
    send_n(client, 1)
    assert entered.wait(5)  # frame 0 is in flight and the sender is stuck
    send_n(client, 8, start=1)  # past half of max_queue: the spooler writes them to disk
    assert wait_until(lambda: client.stats["spilled"] >= 6)
    assert client.spool_path is not None
    send_n(client, 4, start=9)
    release.set()
    assert client.flush(5.0)
    assert [f["step"] for f in collector.delivered] == list(range(13))
    stats = client.stats
    assert stats["dropped_queue_full"] == 0 and stats["replayed"] == stats["spilled"] >= 6
    assert stats["spooled"] == 0


def test_overflow_without_spool_drops_the_oldest(make_client) -> None:
    collector, entered, release = stuck_collector()
    config = ClientConfig(interval=0.02, max_queue=3, max_batch=1, spool_max_bytes=0)
    client = make_client(collector, config=config, release=release)
    send_n(client, 1)
    assert entered.wait(5)
    send_n(client, 5, start=1)  # 1..5 into a queue of 3: 1 and 2 are dropped
    assert client.stats["dropped_queue_full"] == 2
    release.set()
    assert client.flush(5.0)  # (the drops happened before this flush began)
    assert [f["step"] for f in collector.delivered] == [0, 3, 4, 5]


def test_flush_false_on_timeout_and_shutdown_keeps_the_rest_in_the_spool(
        make_client, caplog, monkeypatch) -> None:
    unregistered: list = []
    monkeypatch.setattr("atexit.unregister", unregistered.append)
    entered, release, replied = threading.Event(), threading.Event(), threading.Event()

    def reply(request: httpx.Request, n: int) -> httpx.Response:
        entered.set()
        release.wait(60)  # released by make_client after the test; 60 s: a safety net only
        replied.set()
        return ok()

    client = make_client(Collector(reply), release=release)
    send_n(client, 4)
    assert entered.wait(5)
    assert client.flush(0.05) is False
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        client.shutdown(0.3)
    # shutdown gave up on the request still in flight instead of waiting for its answer
    assert not replied.is_set(), "shutdown waited for the answer of the stuck request"
    stats = client.stats
    assert stats["undelivered_at_shutdown"] == 0 and stats["spooled"] == 5  # and the end
    path = client.spool_path
    # the batch stuck in flight, and the end frame queued after it
    assert path is not None and len(list(__import__("pathlib").Path(path).glob("*.seg"))) == 2
    assert "5 frame(s) of run 'r1' rank 0 were not delivered" in caplog.text
    assert f"logitwatch push {path} --url http://collector" in caplog.text
    assert unregistered == [client._atexit]
    client.shutdown(0.3)  # idempotent
    client.send(9, {}, {})
    assert client.stats["dropped_after_shutdown"] == 1 and client.flush(0.1) is False


def test_shutdown_without_spool_counts_what_is_lost(make_client, caplog) -> None:
    collector, entered, release = stuck_collector()
    client = make_client(collector, config=ClientConfig(interval=0.02, spool_max_bytes=0),
                         release=release)
    send_n(client, 3)
    assert entered.wait(5)
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        client.shutdown(0.2)
    assert client.stats["undelivered_at_shutdown"] == 4  # 3 and the end frame
    assert "4 frame(s) of run 'r1' rank 0 were NOT delivered" in caplog.text


def test_shutdown_delivers_what_is_queued(make_client) -> None:
    collector = Collector()
    client = make_client(collector, config=ClientConfig(interval=60.0))
    send_n(client, 5)
    client.shutdown(5.0)
    # and the end frame: the job ended after its last step
    assert [(f["step"], f.get("end")) for f in collector.delivered] == [
        *((i, None) for i in range(5)), (4, "finished")]
    end = collector.delivered[-1]
    assert "scalars" not in end and end["seq"] > collector.delivered[-2]["seq"]
    assert client.stats["undelivered_at_shutdown"] == 0


def test_end_frame_once_after_the_last_frame(make_client) -> None:
    collector = Collector()
    client = make_client(collector, config=ClientConfig(interval=60.0))
    client.finish()  # nothing sent yet: nothing to end
    send_n(client, 3)
    client.finish()
    client.finish()  # once in a row
    client.send(7, {"loss": 1.0}, {})  # the job goes on
    client.shutdown(5.0)
    assert [(f["step"], f.get("end")) for f in collector.delivered] == [
        (0, None), (1, None), (2, None), (2, "finished"), (7, None), (7, "finished")]


def test_shutdown_on_an_error_sends_no_end_frame(make_client) -> None:
    collector = Collector()
    client = make_client(collector, config=ClientConfig(interval=60.0))
    with pytest.raises(RuntimeError), client:
        send_n(client, 2)
        raise RuntimeError("the training loop failed")
    assert [f.get("end") for f in collector.delivered] == [None, None]
