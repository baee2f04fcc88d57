"""Collector storage benchmark: ingest rate, bytes per value, query times; ours against a
naive row-per-point SQLite table (and MLflow's tracking server, when given) in the same run.
The frames' shapes live in ``store_common.py``, the baselines in ``store_baselines.py``.

Shapes are the issue's: a 24-layer x 16-head model, four per-head statistics and four
scalars per frame (1,540 values), batches of 256 frames (the client's ``max_batch``), and
a 100k-step run sampled every 10 steps (10,000 frames) for the queries.

    python bench/bench_store.py                        # SQLite
    python bench/bench_store.py --pg postgresql+psycopg://postgres@127.0.0.1:55433/postgres
    python bench/bench_store.py --mlflow-python /path/to/venv-with-mlflow/bin/python

* ingest: a real collector process (``logitwatch serve``, uvicorn on 127.0.0.1) receives
  pre-encoded JSON batches from two client threads; values/s is values stored over wall
  time, alert engine and commit included (a 200 means committed). "without the alert
  engine": the same server with the engine replaced by a no-op; "write path alone": the
  store's part in-process (parse + validate + store + commit; 10,000 frames).
* bytes/value: the database's size after the ingest (SQLite: the file after a WAL
  checkpoint; PostgreSQL: the tables with their indexes and TOAST) over values stored.
* queries: server time (the store function in-process, median of repeats) on a 10,000-frame
  run: a scalar series and one head's series downsampled to ~2,000 points, the run's
  envelope (max over heads), and a layer x head heatmap reduced over the whole run.
* baseline: one row per value (run, rank, step, metric, layer, head, value) in SQLite with
  an index for series reads, filled by ``executemany`` in-process (no HTTP, no JSON:
  generous to it), queried with the same downsampling.
* MLflow (optional): ``mlflow server`` with a SQLite backend, ``log_batch`` of the same
  values (1,000 metrics per call, its limit), a few frames only (it is slow).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from store_baselines import mlflow_ingest, naive_ingest, naive_queries
from store_common import (
    BATCH,
    HEAD_METRICS,
    SCALARS,
    VALUES_PER_FRAME,
    H,
    L,
    bodies,
    free_port,
    make_frames,
    median_ms,
    sqlite_bytes,
)

# --- ours: a real collector process -------------------------------------------------------


NO_ALERTS_SERVER = r"""
import sys, uvicorn
from logitwatch.server.app import create_app
from logitwatch.server.settings import Settings
class NoAlerts:
    def process(self, session, frames):
        return []
app = create_app(Settings(db_url=sys.argv[1], port=int(sys.argv[2])))
app.state.alert_engine = NoAlerts()
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


class Server:
    """``logitwatch serve`` in a child process (``alerts=False``: the same app with the
    alert engine replaced by a no-op, to see the store's share of the end-to-end time)."""

    def __init__(self, db_url: str, alerts: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "LOGITWATCH_RATE_LIMIT_PER_SECOND": "0"}
        cmd = ([sys.executable, "-m", "logitwatch.cli", "serve", "--db", db_url, "--port",
                str(self.port), "--log-level", "warning"] if alerts else
               [sys.executable, "-c", NO_ALERTS_SERVER, db_url, str(self.port)])
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)

    def __enter__(self) -> Server:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"collector exited: {self.proc.stderr.read()}")  # type: ignore[union-attr]
            try:
                httpx.get(self.url + "/api/v1/runs", timeout=1)
                return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("collector did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        if self.proc.stderr:
            self.proc.stderr.close()


def post_all(url: str, payloads: list[bytes], threads: int = 2) -> float:
    """Send every payload (``threads`` at once); return the wall time."""
    todo = list(enumerate(payloads))
    lock = threading.Lock()
    errors: list[str] = []
    retries: list[int] = []

    def work() -> None:
        with httpx.Client(timeout=120) as c:
            while True:
                with lock:
                    if not todo:
                        return
                    _, body = todo.pop(0)
                r = c.post(url + "/api/v1/ingest", content=body,
                           headers={"Content-Type": "application/json"})
                while r.status_code == 503:  # what the client does: wait, resend
                    retries.append(1)
                    time.sleep(float(r.headers.get("Retry-After", "1")))
                    r = c.post(url + "/api/v1/ingest", content=body,
                               headers={"Content-Type": "application/json"})
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text[:200]}")
                    return

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise RuntimeError(f"ingest failed: {errors[0]}")
    if retries:
        print(f"({len(retries)} batches answered 503 and resent)")
    return time.perf_counter() - t0


def ours_ingest(db_url: str, frames: int, alerts: bool = True) -> float:
    """values/s end to end over HTTP into ``db_url`` (warm-up batch not counted)."""
    run = f"bench-{uuid.uuid4().hex[:6]}"
    payloads = bodies(make_frames(run, frames + BATCH))
    with Server(db_url, alerts) as srv:
        post_all(srv.url, payloads[:1], threads=1)  # warm-up: run, metrics, caches
        wall = post_all(srv.url, payloads[1:])
    return frames * VALUES_PER_FRAME / wall


def pg_bytes(url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return int(c.execute(text(
                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind = 'r'"
            )).scalar_one())
    finally:
        engine.dispose()


def stored_values(db_url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as c:
            return int(c.execute(text("SELECT coalesce(sum(length(data)), 0) / 4 FROM points"))
                       .scalar_one())
    finally:
        engine.dispose()


def fill_direct(db_url: str, frames: list[dict[str, Any]]) -> tuple[int, float]:
    """Store ``frames`` through the store's own write path (parse, store, commit; no HTTP,
    no alert engine); return the run id and values/s."""
    from sqlalchemy.orm import sessionmaker

    from logitwatch.server.db.session import make_engine, migrate, session_scope
    from logitwatch.server.store.ingest import ingest_frames
    from logitwatch.server.store.parse import parse_ingest

    engine = make_engine(db_url)
    try:
        migrate(engine)
        sessions = sessionmaker(engine, expire_on_commit=False)
        payloads = bodies(frames)
        t0 = time.perf_counter()
        for body in payloads:
            parsed = parse_ingest(body, "application/json")
            with session_scope(sessions) as s:
                res = ingest_frames(s, parsed.frames)
        rate = len(frames) * VALUES_PER_FRAME / (time.perf_counter() - t0)
        return next(iter(res.run_ids)), rate
    finally:
        engine.dispose()


def ours_queries(db_url: str, run_id: int, repeat: int) -> dict[str, float]:
    from sqlalchemy.orm import sessionmaker

    from logitwatch.server.db.session import make_engine
    from logitwatch.server.store import queries

    engine = make_engine(db_url)
    sessions = sessionmaker(engine)
    out = {}
    try:
        with sessions() as s:
            n = queries.get_series(s, run_id=run_id, name="loss")
            assert n.total > 0 and len(n.steps) <= 2100, n.total
            out["series: scalar (loss)"] = median_ms(
                lambda: queries.get_series(s, run_id=run_id, name="loss"), repeat)
            out["series: one head"] = median_ms(
                lambda: queries.get_series(s, run_id=run_id, name="attn.logit_max", layer=3,
                                           head=5), repeat)
            out["series: envelope (max of 384 heads)"] = median_ms(
                lambda: queries.get_series(s, run_id=run_id, name="attn.logit_max"), repeat)
            out["heatmap: max over the whole run"] = median_ms(
                lambda: queries.get_heatmap(s, run_id=run_id, name="attn.logit_max",
                                            agg="max"), repeat)
    finally:
        engine.dispose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=2560, help="frames sent over HTTP per run")
    ap.add_argument("--query-frames", type=int, default=10_000,
                    help="frames of the query run (10,000 = 100k steps sampled every 10)")
    ap.add_argument("--repeat", type=int, default=7, help="repeats per query (median)")
    ap.add_argument("--pg", default=os.environ.get("LOGITWATCH_TEST_PG_URL"),
                    help="a PostgreSQL URL (a scratch database is created and dropped)")
    ap.add_argument("--mlflow-python", default=None,
                    help="python of a venv with mlflow installed (runs its tracking server)")
    ap.add_argument("--mlflow-frames", type=int, default=8)
    ap.add_argument("--skip-queries", action="store_true", help="ingest and size only")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="lw-bench-") as d:
        run(args, Path(d))


def run(args: argparse.Namespace, tmp: Path) -> None:
    """Measure everything into ``tmp`` and print the table."""
    print(f"shape: {L} layers x {H} heads, {len(HEAD_METRICS)} per-head metrics + "
          f"{len(SCALARS)} scalars = {VALUES_PER_FRAME} values/frame; batches of {BATCH}")
    rows: list[tuple[str, str, str, str]] = []

    # Baseline first, then ours, then baseline again: a noisy machine is fair to both.
    base_frames = make_frames("naive", args.frames)
    nb1 = naive_ingest(tmp / "naive1.db", base_frames)
    url = f"sqlite:///{tmp / 'ours.db'}"
    ours = ours_ingest(url, args.frames)
    nb2 = naive_ingest(tmp / "naive2.db", base_frames)
    naive_rate = max(nb1[0], nb2[0])
    ours_bpv = sqlite_bytes(tmp / "ours.db") / stored_values(url)
    rows.append(("ingest, values/s (SQLite)", f"{ours:,.0f}", f"{naive_rate:,.0f}",
                 f"{ours / naive_rate:.1f}x  (target >= 1,000,000)"))
    bare = ours_ingest(f"sqlite:///{tmp / 'bare.db'}", args.frames, alerts=False)
    rows.append(("  the same without the alert engine (SQLite)", f"{bare:,.0f}",
                 f"{naive_rate:,.0f}", f"{bare / naive_rate:.1f}x"))
    rows.append(("bytes/value incl. indexes (SQLite)", f"{ours_bpv:.2f}", f"{nb1[1]:.2f}",
                 f"{nb1[1] / ours_bpv:.1f}x smaller  (target <= 6)"))

    qframes = make_frames("query", 0 if args.skip_queries else args.query_frames, seed=1)
    nq: dict[str, float] = {}
    if not args.skip_queries:
        qurl = f"sqlite:///{tmp / 'query.db'}"
        rid, direct = fill_direct(qurl, qframes)
        rows.insert(2, ("  write path alone in-process (SQLite)", f"{direct:,.0f}",
                        f"{naive_rate:,.0f}", f"{direct / naive_rate:.1f}x"))
        oq = ours_queries(qurl, rid, args.repeat)
        nq = naive_queries(tmp / "naiveq.db", qframes, args.repeat)
        for k, v in oq.items():
            target = "< 200 ms" if k.startswith("heatmap") else "< 50 ms"
            rows.append((f"{k}, ms (SQLite)", f"{v:.1f}", f"{nq[k]:.1f}",
                         f"{nq[k] / v:.1f}x faster  (target {target})"))

    if args.pg:
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
        names = [f"lw_bench_{uuid.uuid4().hex[:8]}" for _ in range(2)]
        with admin.connect() as c:
            for n in names:
                c.execute(text(f'CREATE DATABASE "{n}"'))
        try:
            pu = [make_url(args.pg).set(database=n).render_as_string(hide_password=False)
                  for n in names]
            pg_rate = ours_ingest(pu[0], args.frames)
            pg_bpv = pg_bytes(pu[0]) / stored_values(pu[0])
            rows.append(("ingest, values/s (PostgreSQL)", f"{pg_rate:,.0f}", f"{naive_rate:,.0f}",
                         f"{pg_rate / naive_rate:.1f}x  (target >= 1,000,000)"))
            rows.append(("bytes/value incl. indexes (PostgreSQL)", f"{pg_bpv:.2f}",
                         f"{nb1[1]:.2f}", f"{nb1[1] / pg_bpv:.1f}x smaller  (target <= 6)"))
            if not args.skip_queries:
                prid, pdirect = fill_direct(pu[1], qframes)
                rows.append(("  write path alone in-process (PostgreSQL)", f"{pdirect:,.0f}",
                             f"{naive_rate:,.0f}", f"{pdirect / naive_rate:.1f}x"))
                pq = ours_queries(pu[1], prid, args.repeat)
                for k, v in pq.items():
                    target = "< 200 ms" if k.startswith("heatmap") else "< 50 ms"
                    rows.append((f"{k}, ms (PostgreSQL)", f"{v:.1f}", f"{nq[k]:.1f}",
                                 f"{nq[k] / v:.1f}x faster  (target {target})"))
        finally:
            with admin.connect() as c:
                for n in names:
                    c.execute(text(f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)'))
            admin.dispose()

    if args.mlflow_python:
        ml_rate, ml_bpv = mlflow_ingest(args.mlflow_python, base_frames[:args.mlflow_frames],
                                        tmp)
        rows.append(("MLflow (SQLite, log_batch) ingest, values/s", f"{ours:,.0f}",
                     f"{ml_rate:,.0f}", f"{ours / ml_rate:.0f}x (ours / MLflow)"))
        rows.append(("MLflow bytes/value", f"{ours_bpv:.2f}", f"{ml_bpv:.1f}",
                     f"{ml_bpv / ours_bpv:.0f}x smaller (ours)"))

    w = max(len(r[0]) for r in rows)
    print(f"\n{'measure':<{w}}  {'logitwatch':>12}  {'baseline':>12}  ratio")
    for name, a, b, ratio in rows:
        print(f"{name:<{w}}  {a:>12}  {b:>12}  {ratio}")
    print("\nbaseline: naive row-per-point SQLite (MLflow rows: MLflow's tracking server)")


if __name__ == "__main__":
    main()
