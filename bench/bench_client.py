"""What the client costs the training process, and what it delivers, against a baseline.

Starts a real collector (``logitwatch serve``, SQLite in a temp dir) and measures, for a
frame the size of a 12-layer x 12-head model (6 per-head metrics + 7 scalars = 871 values):

1. ``send()`` per frame on the training thread (µs; median and p99 of single calls).
2. Client CPU per value inside the training process: process CPU time (all threads:
   send(), encoding, gzip, HTTP, spool) while the main thread does nothing but send,
   divided by the values sent. Target: <= 1 µs per value.
3. Sustained frames/s end to end: send as fast as possible, flush, count the wall time;
   against the real collector (bound by its store) and against a null collector (a real
   HTTP server that reads each body and answers at once: the client's own capacity).
4. The same send() cost and CPU while the collector is down (frames go to the spool).

The baseline, measured in the same run and interleaved with the candidate, is the naive
transport: one synchronous ``httpx`` POST of the JSON frame per step (what a few lines of
``requests.post`` in a training loop do). Each figure is the median of ``--repeat`` runs.

    python bench/bench_client.py [--frames 3000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from logitwatch.client import Client, ClientConfig
from logitwatch.wire import encode_float

LAYERS, HEADS = 12, 12
PER_HEAD = ["attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std",
            "attn.entropy", "attn.entropy_min"]
SCALARS = ["loss", "lr", "grad.norm", "grad.clipped", "final.hidden_rms", "final.logz",
           "final.logit_max"]
VALUES = LAYERS * HEADS * len(PER_HEAD) + len(SCALARS)


def make_frames(n: int, seed: int = 0) -> list[tuple[dict[str, float], dict[str, list]]]:
    rng = random.Random(seed)
    frames = []
    for _ in range(min(n, 64)):  # a pool of distinct frames, reused
        scalars = {k: rng.uniform(0, 10) for k in SCALARS}
        heads = {k: [[rng.uniform(0, 30) for _ in range(HEADS)] for _ in range(LAYERS)]
                 for k in PER_HEAD}
        frames.append((scalars, heads))
    return frames


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Collector:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "collector.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "logitwatch.cli", "serve", "--port", str(self.port),
             "--db", f"sqlite:///{tmp / 'bench.db'}", "--log-level", "warning"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/api/v1/runs", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the collector did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self.log.close()


class NullCollector:
    """A real HTTP server that reads each ingest body and answers at once."""

    def __init__(self) -> None:
        answer = json.dumps({"accepted": 0, "duplicates": 0, "alerts": [],
                             "control": {}}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            wbufsize = 1 << 16  # headers and body leave in one segment (no Nagle stall)

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                self.wfile.flush()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def run_client(url: str, run: str, frames: list, n: int, spool: Path, *, live: bool,
               pace: float = 0.0) -> dict[str, float]:
    """Send ``n`` frames with the logitwatch client; measure send(), CPU and throughput."""
    client = Client(url, run=run, config=ClientConfig(spool_dir=str(spool), max_backoff=1.0,
                                                      spool_interval=0.5))
    lat = []
    cpu0, t0 = time.process_time(), time.perf_counter()
    for step in range(n):
        scalars, heads = frames[step % len(frames)]
        a = time.perf_counter()
        client.send(step, scalars, heads)
        lat.append(time.perf_counter() - a)
        if pace:
            time.sleep(pace)
    ok = client.flush(600) if live else True
    wall = time.perf_counter() - t0
    if not ok:
        raise RuntimeError(f"flush failed: {client.stats}")
    client.shutdown(30 if live else 0.1)
    cpu = time.process_time() - cpu0
    return {**summary(lat, cpu, n, wall), "spilled": client.stats["spilled"]}


class StalledCollector:
    """A real TCP server that accepts connections and never answers: every frame the
    client queues stays in its memory (the spool is off in that measurement)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.conns.append(conn)

    def stop(self) -> None:
        for c in [self.server, *self.conns]:
            c.close()


def run_queued(frames: list, n: int) -> dict[str, float]:
    """send() while ``n`` frames pile up in memory (a stalled collector, spool off), and
    the full garbage collections that happen meanwhile."""
    import gc

    stalled = StalledCollector()
    pauses: list[float] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append(time.perf_counter() - started.pop())

    client = Client(stalled.url, run="queued", config=ClientConfig(
        spool_max_bytes=0, max_queue=n + 10, timeout=600.0))
    gc.collect()
    gc.callbacks.append(on_gc)
    lat = []
    cpu0, t0 = time.process_time(), time.perf_counter()
    try:
        for step in range(n):
            scalars, heads = frames[step % len(frames)]
            a = time.perf_counter()
            client.send(step, scalars, heads)
            lat.append(time.perf_counter() - a)
    finally:
        gc.callbacks.remove(on_gc)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    client.shutdown(0.1)
    stalled.stop()
    return {**summary(lat, cpu, n, wall), "gc2": len(pauses),
            "gc2_max_ms": max(pauses, default=0.0) * 1e3}


def summary(lat: list[float], cpu: float, n: int, wall: float) -> dict[str, float]:
    """Per-``send()`` latency percentiles, CPU per value and frames per second."""
    lat = sorted(lat)
    return {
        "send_p50_us": lat[len(lat) // 2] * 1e6,
        "send_p99_us": lat[int(len(lat) * 0.99)] * 1e6,
        "send_max_us": lat[-1] * 1e6,
        "cpu_per_value_us": cpu / (n * VALUES) * 1e6,
        "frames_per_s": n / wall,
    }


def run_naive(url: str, run: str, frames: list, n: int) -> dict[str, float]:
    """The baseline: one synchronous POST of the JSON frame per step."""
    http = httpx.Client(timeout=30)
    lat = []
    cpu0, t0 = time.process_time(), time.perf_counter()
    seq0 = time.time_ns() // 1000
    for step in range(n):
        scalars, heads = frames[step % len(frames)]
        a = time.perf_counter()
        frame = {"run": run, "rank": 0, "seq": seq0 + step, "step": step, "time": time.time(),
                 "scalars": {k: encode_float(v) for k, v in scalars.items()},
                 "heads": {k: [[encode_float(x) for x in r] for r in m]
                           for k, m in heads.items()}}
        r = http.post(url + "/api/v1/ingest", content=json.dumps({"frames": [frame]}),
                      headers={"Content-Type": "application/json"})
        r.raise_for_status()
        lat.append(time.perf_counter() - a)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    http.close()
    return summary(lat, cpu, n, wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=3000, help="frames per measurement")
    parser.add_argument("--naive-frames", type=int, default=300,
                        help="frames per baseline measurement (it is slow)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--queued", type=int, default=10_000, metavar="N",
                        help="frames piled up in memory in the stalled-collector measurement")
    parser.add_argument("--only-queued", action="store_true",
                        help="only the stalled-collector measurement")
    args = parser.parse_args()
    if args.only_queued:
        queued(args)
        return
    tmp = Path(tempfile.mkdtemp(prefix="lw-bench-"))
    frames = make_frames(args.frames)
    col = Collector(tmp)
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    print(f"frame: {LAYERS}x{HEADS} heads x {len(PER_HEAD)} metrics + {len(SCALARS)} "
          f"scalars = {VALUES} values; {args.frames} frames per client run, "
          f"{args.naive_frames} per baseline run; median of {args.repeat}; "
          f"{os.cpu_count()} CPUs")
    kinds = ("naive", "client", "naive_null", "client_null", "down")
    results: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    null = NullCollector()
    try:
        for i in range(args.repeat):  # interleaved, so that noise hits both alike
            results["naive"].append(run_naive(col.url, f"naive-{i}", frames, args.naive_frames))
            results["client"].append(run_client(col.url, f"client-{i}", frames, args.frames,
                                                tmp / f"spool-{i}", live=True))
            results["naive_null"].append(run_naive(null.url, f"nn-{i}", frames,
                                                   args.naive_frames * 4))
            results["client_null"].append(run_client(null.url, f"cn-{i}", frames,
                                                     args.frames, tmp / f"spool-n{i}",
                                                     live=True))
            results["down"].append(run_client(down, f"down-{i}", frames, args.frames,
                                              tmp / f"spool-down-{i}", live=False,
                                              pace=0.0002))
    finally:
        null.stop()
        col.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in results[kind])

    rows = [
        ("send() per frame, median (µs)", "send_p50_us"),
        ("send() per frame, p99 (µs)", "send_p99_us"),
        ("send() per frame, max (µs)", "send_max_us"),
        ("client CPU per value (µs)", "cpu_per_value_us"),
        ("sustained frames/s, end to end", "frames_per_s"),
    ]
    for title, naive, ours in (("real collector (SQLite)", "naive", "client"),
                               ("null collector (client capacity)", "naive_null",
                                "client_null")):
        print(f"\n{title:34} {'naive POST':>12} {'logitwatch':>12} {'ratio':>8}")
        for label, key in rows:
            n, c = med(naive, key), med(ours, key)
            ratio = n / c if key != "frames_per_s" else c / n
            print(f"{label:34} {n:12.2f} {c:12.2f} {ratio:7.1f}x")
    print(f"\n{'collector down (frames spooled)':34} {'':>12} {'logitwatch':>12}")
    for label, key in rows[:4]:
        print(f"{label:34} {'':>12} {med('down', key):12.2f}")
    print(f"\nframes spooled while down: {med('down', 'spilled'):.0f} of {args.frames}; "
          f"values/s delivered to the real collector: "
          f"{med('client', 'frames_per_s') * VALUES:,.0f}")
    print("ratio: how many times better logitwatch is (cost: naive / ours; throughput: "
          "ours / naive)")
    queued(args)


def queued(args: argparse.Namespace) -> None:
    """send() while frames pile up in memory: what the garbage collector makes it pay."""
    frames = make_frames(args.queued)
    runs = [run_queued(frames, args.queued) for _ in range(args.repeat)]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    print(f"\n{args.queued} frames piling up in memory (collector stalled, spool off), "
          f"median of {args.repeat}:")
    print(f"send() p50 / p99 / max (µs): {med('send_p50_us'):.0f} / {med('send_p99_us'):.0f}"
          f" / {med('send_max_us'):.0f}; full (gen 2) garbage collections: {med('gc2'):.0f},"
          f" the longest {med('gc2_max_ms'):.1f} ms")


if __name__ == "__main__":
    main()
