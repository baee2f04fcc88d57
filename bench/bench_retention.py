"""Thinning passes with nothing new to thin: every old frame read again, or only what the
previous pass did not see (``ThinMarks``, ``server/store/retention.py``), in the same run.

A store of ``--runs`` runs of ``--frames`` frames each (rank 0, a step every 10, a frame a
``--gap`` seconds, the runs side by side in time, all older than the cutoff), each frame
with the scalar ``loss`` and ``--metrics`` per-head matrices of ``--layers`` x ``--heads``,
written with SQL as ingest lays them out (the frames, their values, the runs' time bounds;
storing 300k frames through ingest takes minutes). A first pass thins it (one matrix kept a
bucket of ``--bucket-steps`` steps). Then passes with nothing left to thin, timed
alternately so that the machine's load weighs on both alike: "every old frame" is a pass
without marks (what each pass of the worker did: the same reads, metric by metric), "marks"
one with the marks the first pass left (what the worker does now).

    python bench/bench_retention.py                        # SQLite, 10 runs x 30,000 frames
    python bench/bench_retention.py --runs 2 --frames 5000 # quick
    python bench/bench_retention.py --pg postgresql+psycopg://postgres@127.0.0.1:55452/postgres

``--pg``: a new database on that server, at head (``frames``/``points`` partitioned by day,
the partitions of the frames' days made first, the runs spread over ``--days`` days).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from logitwatch.server.db.partitions import DAY, ensure_partitions, is_partitioned  # noqa: E402
from logitwatch.server.db.session import make_engine, migrate, session_scope  # noqa: E402
from logitwatch.server.store.retention import (  # noqa: E402
    RetentionResult,
    ThinMarks,
    thin_old_frames,
)

HEAD_METRICS = ("attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std")
CHUNK = 5000


def fill(engine: Engine, a: argparse.Namespace, t0: float) -> None:
    """The runs, their metrics, frames and values, straight in SQL."""
    rng = np.random.default_rng(0)
    timed = is_partitioned(engine)  # points carry their frame's time on PostgreSQL
    names = HEAD_METRICS[:a.metrics]
    span = a.days * DAY / a.frames if a.days else a.gap
    fid, mid = 0, 0
    with engine.begin() as c:
        for r in range(a.runs):
            run_id = r + 1
            times = [t0 + r + i * span for i in range(a.frames)]
            c.execute(text("INSERT INTO runs (id, project, name, created_at, status, "
                           "time_min, time_max) VALUES (:i, 'bench', :n, :t, 'finished', "
                           ":lo, :hi)"),
                      {"i": run_id, "n": f"run-{r:03d}", "t": t0, "lo": times[0],
                       "hi": times[-1]})
            metric_ids = {}
            for name, layers in [("loss", 0), *((n, a.layers) for n in names)]:
                mid += 1
                metric_ids[name] = mid
                c.execute(text("INSERT INTO metrics (id, run_id, name, layers, heads) "
                               "VALUES (:i, :r, :n, :l, :h)"),
                          {"i": mid, "r": run_id, "n": name, "l": layers,
                           "h": a.heads if layers else 0})
            for b in range(0, a.frames, CHUNK):
                idx = range(b, min(a.frames, b + CHUNK))
                rows = [{"i": fid + i + 1, "r": run_id, "s": i, "st": 10 * i, "t": times[i]}
                        for i in idx]
                c.execute(text("INSERT INTO frames (id, run_id, rank, seq, step, time) "
                               "VALUES (:i, :r, 0, :s, :st, :t)"), rows)
                mats = rng.uniform(0, 10, (len(idx), len(names), a.layers * a.heads))
                values = []
                for k, row in enumerate(rows):
                    values.append({"m": metric_ids["loss"], "f": row["i"], "t": row["t"],
                                   "d": np.float32(2.0).tobytes()})
                    for j, name in enumerate(names):
                        values.append({"m": metric_ids[name], "f": row["i"], "t": row["t"],
                                       "d": mats[k, j].astype("<f4").tobytes()})
                cols = "metric_id, frame_id, time, data" if timed else "metric_id, frame_id, data"
                vals = ":m, :f, :t, :d" if timed else ":m, :f, :d"
                c.execute(text(f"INSERT INTO points ({cols}) VALUES ({vals})"), values)
            fid += a.frames
            print(f"\r{r + 1}/{a.runs} runs stored", end="", flush=True)
        if engine.dialect.name == "postgresql":
            c.execute(text("SELECT setval(pg_get_serial_sequence('frames', 'id'), :n)"),
                      {"n": fid})
    print()
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("ANALYZE"))


def one_pass(sessions: sessionmaker[Any], a: argparse.Namespace, now: float,
             marks: ThinMarks | None) -> tuple[float, RetentionResult]:
    t = time.perf_counter()
    with session_scope(sessions) as s:
        out = thin_old_frames(s, older_than=a.older_than, bucket_steps=a.bucket_steps,
                              now=now, marks=marks)
    return time.perf_counter() - t, out


def bench(engine: Engine, a: argparse.Namespace) -> None:
    t0 = 1.7e9 - (a.days + 1) * DAY
    if is_partitioned(engine):
        ensure_partitions(engine, now=t0, ahead_days=a.days + 2)
    t = time.perf_counter()
    fill(engine, a, t0)
    print(f"stored {a.runs * a.frames:,} frames in {time.perf_counter() - t:.1f} s")
    now = 1.7e9 + a.older_than  # every frame older than the cutoff
    sessions = sessionmaker(engine, expire_on_commit=False)
    marks = ThinMarks()
    took, first = one_pass(sessions, a, now, marks)
    print(f"first pass (reads every old frame, thins): {took:.2f} s, "
          f"{first.matrices_deleted:,} matrices deleted, {first.matrices_kept:,} kept")
    old: list[float] = []
    new: list[float] = []
    for i in range(2 * a.repeat):
        took, out = one_pass(sessions, a, now, None if i % 2 == 0 else marks)
        assert out.matrices_deleted == 0, out
        (old if i % 2 == 0 else new).append(took)
    print(f"| pass with nothing new ({a.repeat} each) | min | median |")
    print("|---|---|---|")
    print(f"| every old frame (no marks: each pass before) | {min(old):.3f} s | "
          f"{statistics.median(old):.3f} s |")
    print(f"| marks (the worker's now) | {min(new) * 1000:.1f} ms | "
          f"{statistics.median(new) * 1000:.1f} ms |")
    print(f"ratio, every old frame / marks: {min(old) / min(new):.0f}x (min), "
          f"{statistics.median(old) / statistics.median(new):.0f}x (median)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--frames", type=int, default=30_000, help="frames of each run")
    ap.add_argument("--metrics", type=int, default=4, choices=range(1, 5),
                    help="per-head metrics a frame")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--bucket-steps", type=int, default=100)
    ap.add_argument("--older-than", type=float, default=30 * DAY)
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between frames")
    ap.add_argument("--days", type=int, default=0,
                    help="spread each run over this many days (default with --pg: 30)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--pg", default=None, help="a PostgreSQL URL (a new database is made)")
    a = ap.parse_args(argv)
    if a.pg:
        a.days = a.days or 30
        name = f"lw_ret_{uuid.uuid4().hex[:8]}"
        admin = create_engine(a.pg, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(a.pg).set(database=name).render_as_string(hide_password=False)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="lw-bench-retention-"))
        url = f"sqlite:///{tmp / 'lw.db'}"
    engine = make_engine(url)
    try:
        migrate(engine)
        bench(engine, a)
    finally:
        engine.dispose()
        if a.pg:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
