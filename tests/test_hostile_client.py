"""A hostile or unlucky day between a real collector process and the real client: frames
the collector fails on, outages, frames past its limits, shutdown and crashes with a slow
collector, queued frames and the garbage collector, damaged spool segments.

Each test here failed before the fix it guards.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

from logitwatch.client._spool import read_segment
from logitwatch.demo.runner import free_port
from tests.client_collector import wait_until
from tests.hostile import aside, poison_trigger
from tests.served import Served

# --- a real collector process and a real client: frames it fails on ------------------------------


def test_a_frame_the_collector_fails_on_is_quarantined(db_url: str, serve, client_for,
                                                       caplog) -> None:
    col = serve(db_url)
    poison_trigger(db_url, 13)
    client = client_for(col.url, "poisoned", max_batch=64)
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        for step in range(40):
            client.send(step, {"loss": float(step)}, {"attn.logit_max": [[1.0, 2.0]]})
        assert client.flush(60) is False  # frame 13 never will be delivered
        deadline = time.monotonic() + 30
        while client.stats["pending"] and time.monotonic() < deadline:
            time.sleep(0.05)
    assert col.steps("poisoned") == [s for s in range(40) if s != 13]
    stats = client.stats
    assert (stats["quarantined"], stats["rejected"], stats["pending"]) == (1, 0, 0)
    assert [f["step"] for f in aside(client, ".quarantine")] == [13]
    lines = [r for r in caplog.records if "keeps failing" in r.getMessage()]
    assert len(lines) == 1 and ".quarantine" in lines[0].getMessage()
    # the queue is not held hostage: later frames go through at once
    client.send(40, {"loss": 40.0}, {"attn.logit_max": [[1.0, 2.0]]})
    assert client.flush(20)
    assert col.steps("poisoned")[-1] == 40


def test_an_outage_of_500s_quarantines_nothing(tmp_path: Path, client_for) -> None:
    # Every request fails with a 500 (no frame gets through): that is an outage, not a
    # poison frame; the frames wait in the spool.
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            hits.append(1)
            body = b'{"code": "oops", "message": "internal error"}'
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        client = client_for(f"http://127.0.0.1:{httpd.server_port}", "outage",
                            max_backoff=0.02)
        for step in range(20):
            client.send(step, {"loss": float(step)}, {})
        deadline = time.monotonic() + 30
        while len(hits) < 60 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(hits) >= 60
        stats = client.stats
        assert stats["quarantined"] == stats["rejected"] == 0 and stats["pending"] == 20
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


# --- 5. one bad frame no longer drops its batch -------------------------------------------


def test_one_refused_frame_is_set_aside_the_rest_delivered(serve, client_for, caplog) -> None:
    col = serve()
    client = client_for(col.url, "shapes", max_batch=256, interval=0.5)
    four = [[1.0] * 4] * 4
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        for step in range(41):  # one batch: a 4x5 frame in a 4x4 run, which the client
            m = [[1.0] * 5] * 4 if step == 20 else four  # cannot know is wrong
            client.send(step, {"loss": float(step)}, {"attn.logit_max": m})
        assert client.flush(30) is False  # frame 20 was refused
    assert col.steps("shapes") == [s for s in range(41) if s != 20]
    assert (client.stats["rejected"], client.stats["sent"]) == (1, 40)
    assert [f["step"] for f in aside(client, ".rejected")] == [20]
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "shape-mismatch" in refused[0], refused
    rid = col.run_id("shapes")
    h = col.get(f"/api/v1/runs/{rid}/heatmap")
    assert h["step"] == 40 and len(h["values"]) == 4 and len(h["values"][0]) == 4
    # the same cause again: counted, not logged again
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        client.send(41, {"loss": 41.0}, {"attn.logit_max": [[1.0] * 5] * 4})
        client.send(42, {"loss": 42.0}, {"attn.logit_max": four})
        assert client.flush(30) is False
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1
    assert client.stats["rejected"] == 2 and col.steps("shapes")[-1] == 42


def test_frames_past_the_collectors_limits_keep_their_loss(serve, client_for, caplog) -> None:
    col = serve(None, LOGITWATCH_MAX_METRICS_PER_RUN="50")
    client = client_for(col.url, "limits", max_metrics=50, interval=0.5)
    with caplog.at_level(logging.WARNING, logger="logitwatch.client"):
        for step in range(20):
            scalars = {"loss": float(step)}
            scalars.update({f"s{step}.{j}": 1.0 for j in range(300 if step == 3 else 10)})
            heads = {f"h{j}": [[1.0]] for j in range(70 if step == 5 else 1)}
            client.send(step, scalars, heads)
        assert client.flush(30)
    assert col.steps("limits") == list(range(20))  # every loss, also past the limits
    assert client.stats["rejected"] == client.stats["invalid"] == 0
    metrics = col.get(f"/api/v1/runs/{col.run_id('limits')}/metrics")
    assert len(metrics) == 50
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) <= 3, left_out  # one line per cause: scalars, matrices, names


# --- 9. shutdown uses its whole timeout -------------------------------------------------------


def test_shutdown_keeps_trying_until_its_timeout(serve, client_for, monkeypatch) -> None:
    # Every backoff an hour: only shutdown's own cap (a second between tries, within its
    # timeout) can reach a collector that comes back while the client shuts down.
    monkeypatch.setattr("logitwatch.client._worker.backoff_delay", lambda *a, **kw: 3600.0)
    port = free_port()
    client = client_for(f"http://127.0.0.1:{port}", "late-collector")
    for step in range(30):
        client.send(step, {"loss": float(step)}, {})
    assert wait_until(lambda: client.stats["retries"] >= 1, 60)  # now in its hour of backoff
    before = client.stats["retries"]
    started: list[Served] = []
    done = threading.Event()

    def come_back() -> None:  # after two failed tries of the shutdown
        while client.stats["retries"] < before + 2 and not done.is_set():
            time.sleep(0.02)
        if not done.is_set():
            started.append(serve(None, port=port))

    later = threading.Thread(target=come_back)
    later.start()
    try:
        client.shutdown(timeout=60)  # returns once all is delivered; 60 s: a safety net
    finally:
        done.set()
        later.join(120)
    assert started, "shutdown stopped trying before the collector came back"
    assert client.stats["pending"] == 0 and client.spool_path is None
    assert started[0].steps("late-collector") == list(range(30))
    (run,) = [r for r in started[0].get("/api/v1/runs") if r["name"] == "late-collector"]
    assert run["status"] == "finished"  # the end frame went too


SLOW_JOB = """
import sys, time
from logitwatch.client import Client, ClientConfig, _worker

covered = last = -1  # steps sent before the spooler's previous tick; the last step sent
tick = _worker.Spooler._tick

def traced(self, mark):  # a tick writes down what was queued at the previous one
    global covered
    tick(self, mark)
    sys.stdout.write(f"{covered}\\n")
    sys.stdout.flush()
    covered = last

_worker.Spooler._tick = traced
c = Client(sys.argv[1], run="crash", config=ClientConfig(
    spool_dir=sys.argv[2], interval=0.2, spool_interval=1.0, timeout=30.0, max_batch=1000))
step = 0
while True:
    c.send(step, {"loss": float(step)}, {"attn.logit_max": [[1.0] * 16] * 8})
    last = step
    step += 1
    time.sleep(0.01)
"""


def test_a_crash_loses_at_most_spool_interval_with_a_slow_collector(tmp_path: Path) -> None:
    # The collector holds every request until the job is dead; the job (spool_interval 1 s)
    # is killed once a spooler tick has covered frames of the batch in flight. Before, it
    # lost the batch in flight and everything queued since: 3-5 s. Now every frame sent
    # before the spooler's previous tick is on disk, whatever the machine's speed.
    entered: list[list[int]] = []  # the steps of each request, as it arrives
    release = threading.Event()

    class Stuck(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            entered.append([f["step"] for f in json.loads(body)["frames"]])
            release.wait(60)  # set once the job is dead; 60 s: a safety net
            answer = b'{"accepted": 0, "duplicates": 0, "alerts": [], "control": {}}'
            with contextlib.suppress(OSError):  # the job is dead by now
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stuck)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    spool = tmp_path / "spool"
    job = subprocess.Popen([sys.executable, "-c", SLOW_JOB, f"http://127.0.0.1:{httpd.server_port}",
                            str(spool)], stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, job.kill)  # a safety net for a hung job, not a bound
    watchdog.start()
    safe = -1  # every step up to it was on disk at the last tick the job reported
    try:
        assert job.stdout is not None
        for line in job.stdout:  # one line a spooler tick
            safe = int(line)
            if entered and safe >= max(entered[0]):
                break
        assert entered and safe >= max(entered[0]), "no tick covered the batch in flight"
        job.kill()
        for line in job.stdout:  # what it printed before it died
            safe = int(line)
        job.wait(10)
    finally:
        watchdog.cancel()
        if job.poll() is None:
            job.kill()
            job.wait(10)
        if job.stdout is not None:
            job.stdout.close()
        release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)
    spooled = {json.loads(line)["step"] for seg in spool.rglob("*.seg")
               if not seg.name.startswith(".")  # a .tmp- file the kill cut short
               for line in read_segment(seg)}
    lost = sorted(set(range(safe + 1)) - spooled)
    assert not lost, f"{len(lost)} of the {safe + 1} frames the spooler covered were lost"


# --- 10. queued frames cost the garbage collector nothing -----------------------------------


def test_queued_frames_are_not_tracked_by_the_garbage_collector(tmp_path: Path) -> None:
    import gc
    import types

    from logitwatch.client._codec import encode, pack
    from logitwatch.client._queue import Backlog

    backlog = Backlog(max_frames=100_000, max_bytes=1 << 40, max_batch=256,
                      encode=lambda f: encode(f, "r", "default", 0), spool=None,
                      spool_max_bytes=0)
    heads = {f"attn.m{k}": [[float(h) for h in range(12)] for _ in range(12)] for k in range(6)}
    def tracked_within(root: object) -> int:
        """gc-tracked objects reachable from ``root`` (not through classes, modules or
        functions): what the backlog adds to every full collection. Counted from the
        backlog rather than as a difference of gc.get_objects(), which other threads of
        the test process (servers, workers left by earlier tests) move as they run."""
        seen: set[int] = set()
        stack, n = [root], 0
        while stack:
            o = stack.pop()
            if id(o) in seen or isinstance(o, (type, types.ModuleType, types.FunctionType)):
                continue
            seen.add(id(o))
            n += gc.is_tracked(o)
            stack.extend(gc.get_referents(o))
        return n

    empty = tracked_within(vars(backlog))
    for step in range(5000):  # a slow collector: 5,000 frames of 871 values wait
        backlog.put(pack(step, {"loss": 1.0, "lr": 0.1}, heads, 1.0)[0], 0)
    gc.collect()
    tracked = tracked_within(vars(backlog)) - empty
    assert tracked < 500, f"{tracked} objects for the collector to walk on every full pass"
    batch = backlog.take(3)  # and they come out as they went in
    assert batch is not None
    first = json.loads(batch.lines[0])
    assert first["step"] == 0 and first["heads"]["attn.m5"][11][11] == 11.0


# --- 11. smaller ones ----------------------------------------------------------------------------


def test_push_reports_damaged_segments_and_fails(serve, tmp_path: Path) -> None:
    from logitwatch.client._spool import write_segment

    col = serve()
    d = tmp_path / "spool" / "default" / "pushed" / "rank-0" / "1-1"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"url": col.url, "run": "pushed"}))
    lines = [json.dumps({"run": "pushed", "seq": s, "step": s, "time": 1000.0 + s,
                         "scalars": {"loss": 1.0}}).encode() for s in range(1, 4)]
    write_segment(d, [1, 2, 3], lines)
    (d / f"{10:020d}-{10:020d}.seg").write_bytes(b"")  # empty
    (d / f"{11:020d}-{11:020d}.seg").write_bytes(b"\x00garbage\n" * 10)
    good = (d / f"{1:020d}-{3:020d}.seg").read_bytes()
    head, _, body = good.partition(b"\n")
    lying = head.replace(b'"frames": 3', b'"frames": 1000000000') + b"\n" + body
    (d / f"{12:020d}-{12:020d}.seg").write_bytes(lying)  # a header that lies
    done = subprocess.run([sys.executable, "-m", "logitwatch.cli", "push",
                           str(tmp_path / "spool")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "pushing 3 frame(s)" in done.stdout  # the lying header is not believed
    assert "sent 3 frame(s): 3 stored" in done.stdout
    damaged = [x for x in done.stderr.splitlines() if x.startswith("damaged segment")]
    assert len(damaged) == 3 and "3 damaged segment file(s)" in done.stderr
    assert sorted(p.suffix for p in d.iterdir() if p.name != "meta.json") == [".corrupt"] * 3
    assert col.steps("pushed") == [1, 2, 3]
