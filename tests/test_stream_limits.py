"""Live streams: a first poll reads only the matrices it sends (a real store), and the
number of streams open at once is bounded per caller and in all (a real ``logitwatch serve``
on loopback)."""

from __future__ import annotations

import contextlib
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from fastapi.testclient import TestClient

from logitwatch.server.app import create_app
from logitwatch.server.db.session import session_scope
from logitwatch.server.settings import Settings
from logitwatch.server.store.live import frames_since
from tests.served import Served

LAYERS, HEADS = 16, 64  # 4 KiB of float32 per matrix


def _frames(n: int) -> list[dict[str, Any]]:
    return [{"run": "big", "seq": i, "step": i, "time": time.time(),
             "scalars": {"loss": 2.0 + i},
             "heads": {f"attn.m{k}": [[float(i + k)] * HEADS for _ in range(LAYERS)]
                       for k in range(4)}}
            for i in range(n)]


def test_first_poll_reads_only_the_newest_frames_matrices(sqlite_url: str) -> None:
    n = 120  # 120 frames x 4 matrices x 4 KiB = 1.9 MiB of matrices in the page
    with TestClient(create_app(Settings(db_url=sqlite_url))) as c:
        for b in range(0, n, 20):
            r = c.post("/api/v1/ingest", json={"frames": _frames(n)[b:b + 20]})
            assert r.status_code == 200, r.text
        run_id = next(r["id"] for r in c.get("/api/v1/runs").json() if r["name"] == "big")
        sessions = c.app.state.sessions
        with session_scope(sessions) as s:
            frames_since(s, run_id=run_id, after_id=0)  # warm caches (metadata, statements)
        tracemalloc.start()
        try:
            with session_scope(sessions) as s:
                last, frames, latest = frames_since(s, run_id=run_id, after_id=0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    matrices = n * 4 * LAYERS * HEADS * 4
    assert peak < matrices / 4, f"first poll peaked at {peak} bytes for {matrices} of matrices"
    # what is sent is unchanged: every step's scalars, the newest frame's matrices
    assert [f["step"] for f in frames] == list(range(n))
    assert [f["scalars"]["loss"] for f in frames] == [2.0 + i for i in range(n)]
    assert latest is not None and latest["step"] == n - 1
    assert sorted(k for k in latest if k != "step") == [f"attn.m{k}" for k in range(4)]
    assert latest["attn.m3"] == [[float(n - 1 + 3)] * HEADS for _ in range(LAYERS)]
    assert last > 0


@contextlib.contextmanager
def _stream(url: str, source: str) -> Iterator[httpx.Response]:
    """``GET url`` as an event stream from loopback address ``source``, open while inside."""
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=30) as c, c.stream(
            "GET", url, headers={"accept": "text/event-stream"}) as r:
        if r.status_code != 200:
            r.read()
            yield r
            return
        lines = r.iter_lines()  # kept: a dropped iterator closes the connection
        next(lines)  # the stream is served (its first event)
        yield r


def test_streams_are_capped_per_caller_and_in_all(tmp_path: Path) -> None:
    env = {"LOGITWATCH_STREAM_MAX_PER_PRINCIPAL": "2", "LOGITWATCH_STREAM_MAX_TOTAL": "3",
           "LOGITWATCH_STREAM_INTERVAL": "0.05"}
    with Served(tmp_path, "--db", f"sqlite:///{tmp_path / 's.db'}", env=env) as col:
        r = httpx.post(col.url + "/api/v1/ingest", timeout=30, json={"frames": [
            {"run": "r", "seq": 0, "step": 0, "time": time.time(), "scalars": {"loss": 1.0}}]})
        assert r.status_code == 200, r.text
        url = f"{col.url}/api/v1/runs/{col.run_id('r')}/stream"
        with contextlib.ExitStack() as open_:
            a1 = open_.enter_context(_stream(url, "127.0.0.1"))
            a2 = open_.enter_context(_stream(url, "127.0.0.1"))
            assert a1.status_code == a2.status_code == 200
            with _stream(url, "127.0.0.1") as a3:  # a third of one caller
                assert a3.status_code == 429 and "Retry-After" in a3.headers
                body = a3.json()
                assert body["code"] == "streams-busy", body
                assert "stream_max_per_principal" in body["message"]
            b1 = open_.enter_context(_stream(url, "127.0.0.2"))
            assert b1.status_code == 200  # another caller: 3 streams in all
            with _stream(url, "127.0.0.3") as c1:  # a fourth in all
                assert c1.status_code == 429
                assert "stream_max_total" in c1.json()["message"]
            # ingest and reads still answer while the streams are open
            assert httpx.get(col.url + "/api/v1/runs", timeout=30).status_code == 200
        # the closed streams gave their slots back (the server notices within a poll)
        deadline = time.monotonic() + 30
        got: list[int] = []
        while time.monotonic() < deadline:
            with contextlib.ExitStack() as again:
                got = [again.enter_context(_stream(url, "127.0.0.1")).status_code
                       for _ in range(2)]
                got.append(again.enter_context(_stream(url, "127.0.0.2")).status_code)
            if got == [200, 200, 200]:
                break
            time.sleep(0.1)
        assert got == [200, 200, 200], (got, col.output)
