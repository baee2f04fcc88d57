"""Deleting frames with and without ``ix_points_frame`` (migration 0015), in the same run.

``points`` is keyed ``(metric_id, frame_id)``; the foreign key to ``frames`` is checked and
cascaded by ``frame_id`` on every frame deleted (SQLite enforces it: foreign keys are on).
Two SQLite stores get the same frames, run by run in turn (so the machine's noise falls on
both): one at the head schema, one with that index dropped (the schema before 0015). Then
each deletes the same run (``delete_run``, what ``DELETE /api/v1/runs/{id}`` and ``logitwatch
runs delete`` do) and drops its oldest frames (``drop_old_frames``, retention). Prints the
times, the ratios, and what the index costs: ingest time and file size.

    python bench/bench_run_delete.py                          # 40 runs x 1,000 frames
    python bench/bench_run_delete.py --runs 10 --frames 500   # quick
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select, text
from sqlalchemy.orm import sessionmaker

from logitwatch.server.db.models import Run
from logitwatch.server.db.session import make_engine, migrate, session_scope
from logitwatch.server.schemas import IngestIn
from logitwatch.server.store.ingest import ingest_frames
from logitwatch.server.store.retention import drop_old_frames
from logitwatch.server.store.run_edits import delete_run

HEAD_METRICS = ("attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std")
BATCH = 256
T0 = 1.7e9


def frames(run: str, n: int, layers: int, heads: int, seed: int) -> list[dict[str, Any]]:
    """``n`` sampled frames of a run: four scalars and four per-head statistics."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        out.append({"run": run, "rank": 0, "seq": i, "step": i * 10, "time": T0 + seed + i,
                    "scalars": {"loss": 3.0 + float(rng.normal(0, 0.05)),
                                "grad.norm": float(rng.uniform(0.5, 1.5)),
                                "grad.clipped": 0.0, "lr": 3e-4},
                    "heads": {m: np.round(rng.uniform(0, 10, (layers, heads)), 3).tolist()
                              for m in HEAD_METRICS}})
    return out


def ingest(sessions: sessionmaker, batch: list[dict[str, Any]]) -> float:
    body = IngestIn.model_validate({"frames": batch})
    t0 = time.perf_counter()
    with session_scope(sessions) as s:
        ingest_frames(s, body.frames)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=40, help="runs in each store")
    ap.add_argument("--frames", type=int, default=1000, help="frames of each run")
    ap.add_argument("--victim", type=int, default=300, help="frames of the run deleted")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="lw-bench-delete-"))
    stores: dict[str, Any] = {}
    for name in ("indexed", "no index"):
        path = tmp / f"{name.replace(' ', '_')}.db"
        engine = make_engine(f"sqlite:///{path}")
        migrate(engine)
        if name == "no index":
            with engine.begin() as conn:
                conn.execute(text("DROP INDEX ix_points_frame"))
        stores[name] = {"path": path, "engine": engine, "ingest": 0.0,
                        "sessions": sessionmaker(engine, expire_on_commit=False)}
    runs = [(f"run-{i:03d}", a.frames) for i in range(a.runs)]
    runs.insert(a.runs // 2, ("victim", a.victim))
    values = 0
    for k, (run, n) in enumerate(runs):
        fs = frames(run, n, a.layers, a.heads, seed=k * 10_000)
        values += n * (4 + len(HEAD_METRICS))
        for i in range(0, n, BATCH):
            for st in (stores.values() if k % 2 else reversed(stores.values())):
                st["ingest"] += ingest(st["sessions"], fs[i:i + BATCH])
        print(f"\r{k + 1}/{len(runs)} runs ingested into both stores", end="", flush=True)
    print(f"\n{len(runs)} runs, {sum(n for _, n in runs):,} frames, {values:,} value rows "
          f"(points) in each store")
    for st in stores.values():
        with session_scope(st["sessions"]) as s:
            rid = s.scalar(select(Run.id).where(Run.name == "victim"))
            t0 = time.perf_counter()
            delete_run(s, rid)
        st["delete"] = time.perf_counter() - t0
        cutoff = T0 + 10_000  # the first run's frames (seed 0)
        t0 = time.perf_counter()
        st["dropped"] = drop_old_frames(st["engine"], older_than=0, now=cutoff).frames_deleted
        st["drop"] = time.perf_counter() - t0
        st["engine"].dispose()
        st["bytes"] = st["path"].stat().st_size
    new, old = stores["indexed"], stores["no index"]
    print(f"{'':34s}{'indexed':>12s}{'no index':>12s}{'ratio':>9s}")
    for label, key, unit in (
            (f"delete a run of {a.victim} frames", "delete", "s"),
            (f"retention drop of {new['dropped']:,} frames", "drop", "s"),
            ("ingest, every batch summed", "ingest", "s"),
            ("file size", "bytes", "MB")):
        f = 1e-6 if unit == "MB" else 1.0
        print(f"{label:34s}{new[key] * f:11.2f}{unit[0]}{old[key] * f:11.2f}{unit[0]}"
              f"{new[key] / old[key]:9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
