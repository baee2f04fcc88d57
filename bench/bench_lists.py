"""The dashboard's runs list and alerts inbox, and ``GET /runs``, on a store of many runs:
the store's reads against the ones before migration 0016 (``lists_baseline.py``), timed
in the same process, alternately, on the same store, with their answers checked equal.

Seeds ``--runs`` runs (default 3,000) through the store's ingest (``--frames`` sampled steps
of rank 0 each, loss and grad norm; a tenth of them finished, stopped, diverged by an alert,
with a NaN last loss and no alert, with an infinite last loss, empty, ...), with alerts
written as the engine writes them (resolved, firing, overlapping; ``no_data`` on the stopped
runs, ``loss_nonfinite`` on the diverged ones), over ``--days`` days (on PostgreSQL, a day
partition each, made first: ``--days 400`` is a store that keeps 400 partitions).

    python bench/bench_lists.py                          # 3,000 runs, temporary SQLite
    python bench/bench_lists.py --pg postgresql+psycopg://postgres@127.0.0.1:55451/postgres

Prints, per read, the median of ``--repeat`` timings of each after one warm-up (a cold
sparkline cache: one timing, no warm-up), the store function in process (no HTTP, no JSON),
and old / new.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, insert, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lists_baseline import (  # noqa: E402
    OldSparklineCache,
    old_alerts_inbox,
    old_get_run,
    old_list_runs,
    old_runs_overview,
)
from logitwatch.server.db.models import Alert, Run  # noqa: E402
from logitwatch.server.db.partitions import DAY, ensure_partitions  # noqa: E402
from logitwatch.server.db.session import make_engine, migrate  # noqa: E402
from logitwatch.server.schemas import FrameIn  # noqa: E402
from logitwatch.server.store.inbox import alerts_inbox  # noqa: E402
from logitwatch.server.store.lifecycle import ingest  # noqa: E402
from logitwatch.server.store.queries import get_run, list_runs, set_config, set_tags  # noqa: E402
from logitwatch.server.store.runs_view import SparklineCache, runs_overview  # noqa: E402

#: Runs stored per transaction while seeding.
BATCH = 50


def _frames(i: int, n: int, t0: float) -> list[FrameIn]:
    """Run ``i``'s frames: a loss falling from 3, its last one NaN or inf for some kinds."""
    kind, name, project = i % 10, f"run-{i:05d}", f"proj-{i % 7}"
    if kind == 6:  # empty: its job said it ended before any step
        return [FrameIn(run=name, project=project, seq=0, step=0, time=t0, end="finished")]
    out = []
    for s in range(n):
        loss = 3.0 * math.exp(-s / n) + 0.01 * (i % 13)
        if s == n - 1 and kind in (3, 4):
            loss = math.nan
        if s == n - 1 and kind == 5:
            loss = math.inf
        out.append(FrameIn(run=name, project=project, seq=s, step=10 * s, time=t0 + s,
                           scalars={"loss": loss, "grad.norm": 1.0 + s % 3}))
    if kind in (1, 5):
        out.append(FrameIn(run=name, project=project, seq=n, step=10 * (n - 1),
                           time=t0 + n, end="finished"))
    return out


def _alerts(run_id: int, i: int, step: int, t: float) -> list[dict[str, Any]]:
    """Run ``i``'s alerts: none, resolved, firing, overlapping (one incident, firing), or
    (one run in 30) a resolved incident then a firing one: most runs with alerts fire, and
    few of those have a resolved incident, which the old inbox walked them all to find."""

    def a(rule: str, state: str, fired: int, resolved: int | None = None,
          severity: str = "warning") -> dict[str, Any]:
        return {"run_id": run_id, "rule": rule, "metric": "grad.norm", "severity": severity,
                "state": state, "rank": 0, "started_step": fired, "fired_step": fired,
                "fired_at": t, "resolved_step": resolved, "message": rule, "evidence": {},
                "remedies": [], "paged_step": fired}

    kind, s = i % 10, step
    resolved = a("grad_spike", "resolved", s // 5, s // 4)
    if i % 30 == 5:  # a resolved incident, then a firing one
        return [resolved, a("loss_jump", "firing", s // 2)]
    out = [[], [resolved], [a("grad_spike", "firing", s // 3)],
           [a("grad_spike", "resolved", s // 5, s), a("loss_jump", "firing", s // 2)],
           [a("grad_spike", "firing", s // 3)], [a("loss_jump", "firing", s // 2)]][i % 6]
    if kind == 2:
        out.append(a("no_data", "firing", s))
    if kind == 3:
        out.append(a("loss_nonfinite", "firing", s, severity="critical"))
    return out


def seed(url: str, runs: int, frames: int, days: int) -> None:
    engine = make_engine(url)
    migrate(engine)
    now = time.time()
    if days > 1:
        made = ensure_partitions(engine, now=now - days * DAY, ahead_days=days + 7)
        if made:
            print(f"  {len(made)} partitions made ({days} days of frames and points)")
    t = time.perf_counter()
    with Session(engine) as s:
        for lo in range(0, runs, BATCH):
            hi = min(runs, lo + BATCH)
            batch = [f for i in range(lo, hi)
                     for f in _frames(i, frames, now - (i % days) * DAY - 3600)]
            ingest(s, batch, now=now - 7200)
            ids = dict(s.execute(text("SELECT name, id FROM runs WHERE name >= :lo AND "
                                      "name < :hi"), {"lo": f"run-{lo:05d}",
                                                      "hi": f"run-{hi:05d}"}).all())
            rows = []
            for i in range(lo, hi):
                rid = ids[f"run-{i:05d}"]
                if i % 10 != 6:
                    rows += _alerts(rid, i, 10 * (frames - 1), now - 7000 + i)
                if i % 10 == 2:
                    s.execute(update(Run).where(Run.id == rid).values(status="stopped"))
                if i % 10 == 3:
                    s.execute(update(Run).where(Run.id == rid)
                              .values(diverged_step=10 * (frames - 1)))
                if i % 4 == 0:
                    set_tags(s, rid, add=["sweep-a" if i % 8 else "baseline"])
                if i % 5 == 0:
                    set_config(s, rid, {"lr": 10 ** -(2 + i % 3), "data": "wikipédia",
                                        "seed": i})
            if rows:
                s.execute(insert(Alert), rows)
            s.commit()
            if hi % 500 == 0 or hi == runs:
                print(f"  seeded {hi}/{runs} runs", flush=True)
    print(f"seeded {runs} runs x {frames} steps in {time.perf_counter() - t:.1f} s")
    engine.dispose()


def timed(engine: Any, fn: Callable[[Session], Any]) -> tuple[float, Any]:
    """``fn``'s time on a new session; the garbage collector off meanwhile (as ``timeit``
    does), so that one read does not pay for collecting the other's garbage."""
    gc.collect()
    gc.disable()
    try:
        with Session(engine) as s:
            t = time.perf_counter()
            out = fn(s)
            return time.perf_counter() - t, out
    finally:
        gc.enable()


def dumped(out: Any) -> Any:
    if isinstance(out, list):
        return [r.model_dump(mode="json", exclude={"active"}) if hasattr(r, "model_dump")
                else r for r in out]
    return out.model_dump(mode="json", exclude={"active"})


def bench(url: str, runs: int, repeat: int) -> None:
    engine = make_engine(url)
    old_warm, new_warm = OldSparklineCache(max_runs=100_000), SparklineCache()
    some = max(1, runs // 2)  # a run id in the middle
    ten = f"run-{some:05d}"[:-1]  # ten runs' names hold it
    reads: list[tuple[str, Callable[[Session], Any], Callable[[Session], Any]]] = [
        ("dashboard/runs?status=stopped (warm cache)",
         lambda s: old_runs_overview(s, old_warm, status="stopped", limit=500, total=[]),
         lambda s: runs_overview(s, new_warm, status="stopped", limit=500, total=[])),
        ("dashboard/runs?status=diverged (cold cache)",
         lambda s: old_runs_overview(s, OldSparklineCache(), status="diverged", limit=500,
                                     total=[]),
         lambda s: runs_overview(s, SparklineCache(), status="diverged", limit=500, total=[])),
        ("dashboard/runs (first page, warm cache)",
         lambda s: old_runs_overview(s, old_warm, limit=500, total=[]),
         lambda s: runs_overview(s, new_warm, limit=500, total=[])),
        (f"dashboard/runs?q={ten} (warm cache)",
         lambda s: old_runs_overview(s, old_warm, q=ten, limit=500, total=[]),
         lambda s: runs_overview(s, new_warm, q=ten, limit=500, total=[])),
        ("dashboard/runs?q=wikipédia&offset=100",
         lambda s: old_runs_overview(s, old_warm, q="wikipédia", limit=100, offset=100,
                                     total=[]),
         lambda s: runs_overview(s, new_warm, q="wikipédia", limit=100, offset=100, total=[])),
        ("dashboard/alerts?state=resolved",
         lambda s: old_alerts_inbox(s, old_warm, state="resolved"),
         lambda s: alerts_inbox(s, state="resolved")),
        ("dashboard/alerts?state=firing",
         lambda s: old_alerts_inbox(s, old_warm, state="firing"),
         lambda s: alerts_inbox(s, state="firing")),
        ("dashboard/alerts",
         lambda s: old_alerts_inbox(s, old_warm), lambda s: alerts_inbox(s)),
        ("GET /runs?limit=500",
         lambda s: old_list_runs(s, limit=500, total=[]), lambda s: list_runs(s, limit=500,
                                                                              total=[])),
        ("GET /runs/{run}", lambda s: old_get_run(s, some), lambda s: get_run(s, some)),
    ]
    print(f"\nmedian of {repeat}, old and new alternately (store functions in process)")
    print(f"  {'read':<44} {'old':>10} {'new':>10} {'old/new':>8}")
    for label, old, new in reads:
        cold = "cold" in label  # measured once: the old one is slow on many partitions
        if not cold:
            timed(engine, old)  # a warm-up each: the warm caches, the database's own
            timed(engine, new)
        told, tnew = [], []
        for _ in range(1 if cold else repeat):
            t, a = timed(engine, old)
            told.append(t)
            t, b = timed(engine, new)
            tnew.append(t)
            if dumped(a) != dumped(b):
                sys.exit(f"{label}: the answers differ")
        mo, mn = statistics.median(told), statistics.median(tnew)
        print(f"  {label:<44} {mo * 1000:8.1f} ms {mn * 1000:7.1f} ms {mo / mn:7.1f}x",
              flush=True)
    engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--frames", type=int, default=40, help="sampled steps per run")
    ap.add_argument("--days", type=int, default=1, help="days the runs' frames spread over")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--pg", help="a PostgreSQL server URL: a new database on it, dropped after")
    args = ap.parse_args()
    if args.pg:
        name = f"lw_bench_{uuid.uuid4().hex[:8]}"
        admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(args.pg).set(database=name).render_as_string(hide_password=False)
        try:
            seed(url, args.runs, args.frames, args.days)
            bench(url, args.runs, args.repeat)
        finally:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
        return
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        seed(url, args.runs, args.frames, args.days)
        bench(url, args.runs, args.repeat)


if __name__ == "__main__":
    main()
