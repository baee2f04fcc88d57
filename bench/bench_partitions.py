"""The reads on PostgreSQL's time partitions: joined on the frame id alone, and pruned
with the run's time bounds (``server/store/pruning.py``).

One run of 3,000 frames (rank 0, a step every 10, four 24 x 16 per-head matrices and
four scalars each) spread evenly over the last 8 days, stored in-process (parse + store +
commit, batches of 256) on a new database at head, with the day partitions of those days
and of a week ahead made first (as the collector's worker does day by day: 18 partitions
of each table with the default one; ``--span 90``: from 90 days back, a store that keeps
three months of other runs). Each read is timed both ways, alternately, so that
the machine's load weighs on both alike: "id only" is the query without the run's bounds
(``run_bounds`` answering None, the join of migration 0011), "pruned" the store's.

    python bench/bench_partitions.py --pg postgresql+psycopg://postgres@127.0.0.1:55435/postgres

Reads, server time (the store function in-process, min and median of ``--repeat`` runs
after one warm-up; on a loaded machine the min is the steadier figure): a scalar series
(``loss``), one head's series, the run's envelope (the max over heads of
``attn.logit_max``), the latest heatmap, the heatmap reduced over the whole run, the
worst heads (the dashboard's table, 50 samples back), and the live stream's poll
(``store/live.py``) finding nothing new, and finding the run's last 50 frames.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from alembic import command
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from logitwatch.server.db.partitions import ensure_partitions, list_partitions  # noqa: E402
from logitwatch.server.db.session import alembic_config, make_engine  # noqa: E402
from logitwatch.server.store import live, queries, views  # noqa: E402
from logitwatch.server.store.ingest import ingest_frames  # noqa: E402
from logitwatch.server.store.parse import parse_ingest  # noqa: E402
from logitwatch.server.store.queries import get_heatmap, get_series  # noqa: E402
from logitwatch.server.store.views import worst_heads  # noqa: E402

L, H = 24, 16
HEAD_METRICS = ("attn.logit_max", "attn.logit_p99", "attn.logit_mean", "attn.logit_std")
DAY = 86400


def frames(n: int, days: int, now: float) -> list[dict[str, Any]]:
    import numpy as np

    rng = np.random.default_rng(0)
    t0 = now - days * DAY + 60
    out = []
    for i in range(n):
        heads = {m: (rng.random((L, H), dtype=np.float32) * 10).tolist() for m in HEAD_METRICS}
        out.append({"run": "part", "rank": 0, "seq": i, "step": i * 10,
                    "time": t0 + i * (days * DAY - 120) / n,
                    "scalars": {"loss": 3.0 - i * 1e-4, "grad.norm": 1.0, "grad.clipped": 0.0,
                                "lr": 1e-3},
                    "heads": heads})
    return out


def store(engine: Any, batch: list[dict[str, Any]]) -> None:
    body = orjson.dumps({"frames": batch})
    with Session(engine) as s, s.begin():
        ingest_frames(s, parse_ingest(body, "application/json").frames)


def upgrade(engine: Any, target: str) -> None:
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, target)


def unpruned(on: bool) -> None:
    """Reads without the run's time bounds (on) or with them (off)."""
    for mod in (queries, views, live):
        mod.run_bounds = (lambda *a, **k: None) if on else REAL_BOUNDS  # type: ignore[attr-defined]
    # the live stream bounds its points by its frames' times where the store is partitioned
    live.is_partitioned = (lambda *a: False) if on else REAL_PARTITIONED  # type: ignore[attr-defined]


REAL_BOUNDS = queries.run_bounds
REAL_PARTITIONED = live.is_partitioned


def timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], list[float]]:
    """ms of each call of ``fn`` (id only, pruned), alternating."""
    out: tuple[list[float], list[float]] = ([], [])
    for i in range(2 * repeat + 2):
        unpruned(i % 2 == 0)
        t = time.perf_counter()
        fn()
        if i >= 2:  # one warm-up each
            out[i % 2].append(time.perf_counter() - t)
    unpruned(False)
    return [x * 1000 for x in out[0]], [x * 1000 for x in out[1]]


def reads(engine: Any, repeat: int) -> dict[str, tuple[list[float], list[float]]]:
    with Session(engine) as s:
        run_id = s.execute(text("SELECT id FROM runs WHERE name = 'part'")).scalar_one()
        last = s.execute(text("SELECT max(id) FROM frames")).scalar_one()
        cases: dict[str, Callable[[], Any]] = {
            "scalar series (loss)": lambda: get_series(s, run_id=run_id, name="loss"),
            "one head's series": lambda: get_series(s, run_id=run_id, name="attn.logit_max",
                                                    layer=3, head=5),
            "envelope (max over heads)": lambda: get_series(s, run_id=run_id,
                                                            name="attn.logit_max"),
            "latest heatmap": lambda: get_heatmap(s, run_id=run_id, name="attn.logit_max"),
            "heatmap, max over the run": lambda: get_heatmap(s, run_id=run_id,
                                                             name="attn.logit_max", agg="max"),
            "worst heads": lambda: worst_heads(s, run_id=run_id, name="attn.logit_max"),
            # the live stream's poll (store/live.py), about once a second per open run page
            "live poll, nothing new": lambda: live.frames_since(s, run_id=run_id,
                                                               after_id=last),
            "live poll, the last 50 frames": lambda: live.frames_since(s, run_id=run_id,
                                                                      after_id=last - 50),
        }
        return {name: timed(fn, repeat) for name, fn in cases.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", required=True, help="a PostgreSQL URL (a new database is made)")
    ap.add_argument("--frames", type=int, default=3000)
    ap.add_argument("--days", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--span", type=int, default=0,
                    help="day partitions from this many days back (a store that keeps a "
                    "longer history of other runs); default: the run's days")
    args = ap.parse_args()
    name = f"lw_part_{uuid.uuid4().hex[:8]}"
    admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(args.pg).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    try:
        upgrade(engine, "head")
        now = time.time()
        back = max(args.span, args.days)
        ensure_partitions(engine, now=now - back * DAY, ahead_days=back + 7)
        data = frames(args.frames, args.days, now)
        t = time.perf_counter()
        for i in range(0, len(data), 256):
            store(engine, data[i:i + 256])
        ingest = time.perf_counter() - t
        with engine.begin() as c:
            c.execute(text("ANALYZE"))
            parts = len(list_partitions(c, "points"))
        out = reads(engine, args.repeat)
        print(f"{args.frames} frames over {args.days} days; ingest {ingest:.1f} s; "
              f"{parts} partitions of points (and of frames)")
        print(f"| read (ms, {args.repeat} each) | id only: min | median | pruned: min | median |")
        print("|---|---|---|---|---|")
        for k, (before, after) in out.items():
            print(f"| {k} | {min(before):.1f} | {statistics.median(before):.1f} | "
                  f"{min(after):.1f} | {statistics.median(after):.1f} |")
    finally:
        engine.dispose()
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
