"""The baselines ``bench_store.py`` measures the collector's store against: a naive
row-per-value SQLite table filled in-process, and MLflow's tracking server (optional)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from store_common import (
    BATCH,
    HEAD_METRICS,
    SCALARS,
    VALUES_PER_FRAME,
    free_port,
    median_ms,
    sqlite_bytes,
)

# --- the naive baseline: one row per value -----------------------------------------------


METRIC_IDS = {k: i for i, k in enumerate(SCALARS + HEAD_METRICS)}


def naive_rows(frames: list[dict[str, Any]], metrics: tuple[str, ...] | None = None
               ) -> list[tuple[Any, ...]]:
    """One row per value; metric names as small integer ids (a metrics table's keys)."""
    rows = []
    for f in frames:
        for k, v in f["scalars"].items():
            if metrics is None or k in metrics:
                rows.append((1, f["rank"], f["step"], METRIC_IDS[k], -1, -1, v))
        for k, m in f["heads"].items():
            if metrics is None or k in metrics:
                mid = METRIC_IDS[k]
                for li, row in enumerate(m):
                    for hi, v in enumerate(row):
                        rows.append((1, f["rank"], f["step"], mid, li, hi, v))
    return rows


def naive_db(path: Path) -> sqlite3.Connection:
    """The table people write first: a row per value, one index for series reads."""
    c = sqlite3.connect(path)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=NORMAL")
    c.execute("CREATE TABLE points (run_id INTEGER, rank INTEGER, step INTEGER, "
              "metric INTEGER, layer INTEGER, head INTEGER, value REAL)")
    c.execute("CREATE INDEX ix_series ON points (run_id, metric, layer, head, rank, step)")
    return c


def naive_ingest(path: Path, frames: list[dict[str, Any]]) -> tuple[float, float]:
    """(values/s, bytes/value) of the row-per-point table."""
    c = naive_db(path)
    rows = naive_rows(frames)
    t0 = time.perf_counter()
    for i in range(0, len(rows), BATCH * VALUES_PER_FRAME):
        c.executemany("INSERT INTO points VALUES (?, ?, ?, ?, ?, ?, ?)",
                      rows[i:i + BATCH * VALUES_PER_FRAME])
        c.commit()
    wall = time.perf_counter() - t0
    c.close()
    return len(rows) / wall, sqlite_bytes(path) / len(rows)


def naive_queries(path: Path, frames: list[dict[str, Any]], repeat: int) -> dict[str, float]:
    from logitwatch.server.store.downsample import minmax_downsample

    c = naive_db(path)
    c.executemany("INSERT INTO points VALUES (?, ?, ?, ?, ?, ?, ?)",
                  naive_rows(frames, ("loss", "attn.logit_max")))
    c.commit()

    def series(metric: str, layer: int, head: int) -> object:
        rows = c.execute("SELECT step, value FROM points WHERE run_id=1 AND metric=? AND "
                         "layer=? AND head=? AND rank=0 ORDER BY step",
                         (METRIC_IDS[metric], layer, head)).fetchall()
        steps = np.array([r[0] for r in rows], dtype=np.int64)
        vals = np.array([r[1] for r in rows], dtype=np.float64)
        return minmax_downsample(steps, vals, 2000)

    def envelope() -> object:
        rows = c.execute("SELECT step, max(value) FROM points WHERE run_id=1 AND "
                         f"metric={METRIC_IDS['attn.logit_max']} AND rank=0 "
                         "GROUP BY step ORDER BY step").fetchall()
        return minmax_downsample(np.array([r[0] for r in rows]),
                                 np.array([r[1] for r in rows], dtype=np.float64), 2000)

    def heatmap() -> object:
        return c.execute("SELECT layer, head, max(value) FROM points WHERE run_id=1 AND "
                         f"metric={METRIC_IDS['attn.logit_max']} AND rank=0 GROUP BY layer, head"
                         ).fetchall()

    out = {
        "series: scalar (loss)": median_ms(lambda: series("loss", -1, -1), repeat),
        "series: one head": median_ms(lambda: series("attn.logit_max", 3, 5), repeat),
        "series: envelope (max of 384 heads)": median_ms(envelope, max(1, repeat // 2)),
        "heatmap: max over the whole run": median_ms(heatmap, max(1, repeat // 2)),
    }
    c.close()
    return out


# --- MLflow ------------------------------------------------------------------------------

MLFLOW_CLIENT = r"""
import json, sys, time
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
url, frames = sys.argv[1], json.load(open(sys.argv[2]))
c = MlflowClient(url)
exp = c.create_experiment("bench")
run = c.create_run(exp).info.run_id
t0 = time.perf_counter(); n = 0
for f in frames:
    ms = [Metric(k, v, int(f["time"] * 1000), f["step"]) for k, v in f["scalars"].items()]
    for k, m in f["heads"].items():
        ms += [Metric(f"{k}.{li}.{hi}", v, int(f["time"] * 1000), f["step"])
               for li, row in enumerate(m) for hi, v in enumerate(row)]
    for i in range(0, len(ms), 1000):
        c.log_batch(run, metrics=ms[i:i + 1000])
    n += len(ms)
print(json.dumps({"values": n, "seconds": time.perf_counter() - t0}))
"""


def mlflow_ingest(python: str, frames: list[dict[str, Any]], tmp: Path) -> tuple[float, float]:
    db = tmp / "mlflow.db"
    port = free_port()
    srv = subprocess.Popen(
        [python, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
         "--default-artifact-root", str(tmp / "mlartifacts"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or srv.poll() is not None:
                    raise RuntimeError("mlflow server did not start") from None
                time.sleep(0.3)
        data = tmp / "mlframes.json"
        data.write_text(json.dumps(frames))
        script = tmp / "mlclient.py"
        script.write_text(MLFLOW_CLIENT)
        out = subprocess.run([python, str(script), f"http://127.0.0.1:{port}", str(data)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        srv.terminate()
        srv.wait(30)
    return r["values"] / r["seconds"], sqlite_bytes(db) / r["values"]

